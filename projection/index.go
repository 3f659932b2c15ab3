package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
)

// IndexState is what the search projection's index name stands for in the
// engine.
type IndexState string

const (
	// IndexMissing: no index or alias of that name.
	IndexMissing IndexState = "missing"
	// IndexCreated: it was missing; EnsureIndex created a concrete index
	// with the alias of that name on it.
	IndexCreated IndexState = "created"
	// IndexAlias: an alias, left as it is.
	IndexAlias IndexState = "alias"
	// IndexConcrete: a concrete index, left as it is; the first rebuild
	// turns it into an alias, and searches in flight at that instant fail.
	IndexConcrete IndexState = "concrete"
)

// IndexSetup is what LookupIndex found or EnsureIndex did.
type IndexSetup struct {
	State IndexState
	// Indexes are the concrete indexes behind the name: the alias's, the
	// one created, or the concrete index itself.
	Indexes []string
}

// ensureIndexTimeout bounds EnsureIndex in the daemon, so that a leader
// whose engine does not answer starts its loop all the same.
const ensureIndexTimeout = 10 * time.Second

// TimestampedIndex is the concrete index named for alias and t, as the
// rebuild names its targets: <alias>-<UTC yyyymmdd-hhmmss-mmm>.
func TimestampedIndex(alias string, t time.Time) string {
	t = t.UTC()
	return fmt.Sprintf("%s-%s-%03d", alias, t.Format("20060102-150405"), t.Nanosecond()/1e6)
}

// LookupIndex says whether name is an alias (and of which indexes), a
// concrete index, or missing.
func LookupIndex(ctx context.Context, client *elastic.Client, name string) (IndexSetup, error) {
	resp, err := client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodGet, Path: "/_alias/" + url.PathEscape(name), IgnoreErrors: []int{http.StatusNotFound}})
	if err != nil {
		return IndexSetup{}, fmt.Errorf("look up alias %s: %w", name, err)
	}
	if resp.StatusCode == http.StatusOK {
		var byIndex map[string]any
		if err := json.Unmarshal(resp.Body, &byIndex); err != nil {
			return IndexSetup{}, fmt.Errorf("look up alias %s: %w", name, err)
		}
		// An alias's 404 names the missing alias; a 200 lists its indexes.
		if len(byIndex) > 0 {
			return IndexSetup{State: IndexAlias, Indexes: slices.Sorted(maps.Keys(byIndex))}, nil
		}
	}
	resp, err = client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodHead, Path: "/" + url.PathEscape(name), IgnoreErrors: []int{http.StatusNotFound}})
	if err != nil {
		return IndexSetup{}, fmt.Errorf("look up index %s: %w", name, err)
	}
	if resp.StatusCode == http.StatusOK {
		return IndexSetup{State: IndexConcrete, Indexes: []string{name}}, nil
	}
	return IndexSetup{State: IndexMissing}, nil
}

// EnsureIndex makes name an alias when it is missing: it creates the
// concrete index TimestampedIndex(name, now), with the engine's default
// settings (and its templates, as the engine's auto-create on a first
// write would), and the alias name on it in the same request. An existing
// alias or concrete index is left as it is and reported.
//
// Replicas may race. The alias is created as the write index, and the
// engine refuses a second write index for an alias, or an alias of the
// name of an existing index (a write that auto-created it first), or an
// index that exists (the same name, in the same millisecond). So the
// request of every replica but one fails and creates nothing, and each
// replica reports what it finds then: one alias, on one index, no stray.
func EnsureIndex(ctx context.Context, client *elastic.Client, name string, now time.Time) (IndexSetup, error) {
	return EnsureIndexWith(ctx, client, name, nil, now)
}

// EnsureIndexWith is EnsureIndex creating the index with body (its
// settings and mappings, a projection's mapping file), which may be nil.
func EnsureIndexWith(ctx context.Context, client *elastic.Client, name string, body map[string]any, now time.Time) (IndexSetup, error) {
	cur, err := LookupIndex(ctx, client, name)
	if err != nil || cur.State != IndexMissing {
		return cur, err
	}
	return createAliased(ctx, client, name, TimestampedIndex(name, now), body)
}

// createAliased creates index with the alias name on it; when the engine
// refuses, it reports what name stands for now (another replica's alias,
// an index a write auto-created), or the refusal when name is still missing.
func createAliased(ctx context.Context, client *elastic.Client, name, index string, mapping map[string]any) (IndexSetup, error) {
	body := WithRefreshInterval(mapping)
	body["aliases"] = map[string]any{name: map[string]any{"is_write_index": true}}
	_, err := client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodPut, Path: "/" + url.PathEscape(index), Body: body})
	if err == nil {
		return IndexSetup{State: IndexCreated, Indexes: []string{index}}, nil
	}
	now, lookErr := LookupIndex(ctx, client, name)
	if lookErr != nil || now.State == IndexMissing {
		return IndexSetup{State: IndexMissing}, errors.Join(fmt.Errorf("create index %s with alias %s: %w", index, name, err), lookErr)
	}
	return now, nil
}

// IndexKeeper runs EnsureIndex for a replica and logs what it did: a
// creation, and once per process a warning when the index is concrete. Until
// it has found the index set up (an alias, one it created, or a concrete
// index of an earlier version), the projection waits (Waiting): a write to a
// missing name would have the engine create a concrete index there, with a
// dynamic mapping instead of the mapping file's.
type IndexKeeper struct {
	client *elastic.Client
	index  string
	body   map[string]any
	log    zerolog.Logger
	warned atomic.Bool
	// ready is set once EnsureIndex found or made the index; it is never
	// cleared: an engine away later fails writes, which retry as before.
	ready atomic.Bool
	// lastErr is why the last EnsureIndex failed (classified, without
	// credentials); nil before the first. downWarned logs it once.
	lastErr    atomic.Pointer[string]
	downWarned atomic.Bool
	// refused is set while the engine refuses this client every request
	// (a credential or TLS refusal): see Waiting.
	refused atomic.Bool
}

// Backoff of Keep between two tries while the engine does not answer: short
// enough that the projection's events go on seconds after the engine is
// back, long enough not to flood its log or the network.
const (
	keepBackoffMin = 500 * time.Millisecond
	keepBackoffMax = 2 * time.Second
)

// NewIndexKeeper keeps index, a search projection's alias, creating it
// with body (its mapping file's, or nil for the engine's defaults).
func NewIndexKeeper(client *elastic.Client, index string, body map[string]any, log zerolog.Logger) *IndexKeeper {
	return &IndexKeeper{client: client, index: index, body: body, log: log}
}

// Waiting says why the projection's events wait, "" once its index is set
// up. The consume loop reads none of them meanwhile (Waits).
//
// An engine that refuses this client (auth_error, tls_error) refuses its
// writes as well, so none can create the index while it does: the events
// are then sent, and fail and retry with that reason in their rows, as
// every other projection's do, rather than wait without one. Keep goes on
// trying, and sets the index up within keepBackoffMax once the refusal ends.
func (k *IndexKeeper) Waiting() string {
	if k.ready.Load() || k.refused.Load() {
		return ""
	}
	why := "its index " + k.index + " is not set up yet; it is created from the mapping file, behind its alias, once the engine answers"
	if last := k.lastErr.Load(); last != nil {
		why += ": " + *last
	}
	return why
}

// Ensure runs EnsureIndex, within a bound of its own, and logs an error
// once until the index is set up; meanwhile the projection waits.
func (k *IndexKeeper) Ensure(ctx context.Context) (IndexSetup, error) {
	ctx, cancel := context.WithTimeout(ctx, ensureIndexTimeout)
	defer cancel()
	got, err := EnsureIndexWith(ctx, k.client, k.index, k.body, time.Now())
	if err == nil {
		k.ready.Store(true)
		k.downWarned.Store(false)
	}
	switch {
	case err != nil:
		if ctx.Err() == context.Canceled {
			break
		}
		c := classify.Classify(err)
		msg := c.Error()
		k.lastErr.Store(&msg)
		k.refused.Store(c.Reason == classify.AuthError || c.Reason == classify.TLSError)
		if !k.ready.Load() && k.downWarned.CompareAndSwap(false, true) {
			k.log.Warn().Str("index", k.index).Str("error", msg).
				Msg("could not set up the index behind an alias; the projection's events wait until the engine answers " +
					"and the index is created from its mapping file")
		}
	case got.State == IndexCreated:
		k.log.Info().Str("index", k.index).Str("concrete_index", got.Indexes[0]).
			Msg("created the index behind an alias of its name, so that a rebuild swaps aliases only")
	case got.State == IndexConcrete && k.warned.CompareAndSwap(false, true):
		k.log.Warn().Str("index", k.index).
			Msg("the index is a concrete index: the first wlproj rebuild converts it into an alias, and searches in flight " +
				"at that instant can fail; run that first rebuild in a quiet window")
	}
	return got, err
}

// Keep runs Ensure until the index is set up, or ctx ends, trying again
// with backoff: a replica started before its engine sets the index up from
// the mapping file as soon as the engine answers, and the projection's
// events, which wait until then, go on.
func (k *IndexKeeper) Keep(ctx context.Context) {
	wait := keepBackoffMin
	for !k.ready.Load() {
		if _, err := k.Ensure(ctx); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, keepBackoffMax)
	}
}
