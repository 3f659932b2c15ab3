package projection

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/olivere/elastic/v7"
	"golang.org/x/sync/errgroup"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// SearchName is the search projection's name, as producers write it in
// outbox_events.projection: the one projection with an index, which the
// rebuild and the verify work on.
const SearchName = "search"

// IndexDefault is the index (or alias) the search projection writes unless
// told; the CLI's ELASTIC_INDEX takes it from here.
const IndexDefault = "search"

// MaxPayloadBytesDefault is SearchConfig.MaxPayloadBytes' default; the
// CLI's flag takes it from here, and MaxPayloadBytesRange is what it accepts.
const MaxPayloadBytesDefault = 1 << 20

var MaxPayloadBytesRange = bounds.Range[int]{Min: 1, Max: 100 << 20}

// What SearchConfig's sending settings accept. A bulk's bytes stay below
// the engine's http.max_content_length (100mb by default); concurrency is
// per batch, and the loop's OUTBOX_CONCURRENCY batches run beside it.
var (
	BulkActionsRange     = bounds.Range[int]{Min: 0, Max: 100_000}
	BulkBytesRange       = bounds.Range[int]{Min: 64 << 10, Max: 90 << 20}
	BulkConcurrencyRange = bounds.Range[int]{Min: 1, Max: 16}
)

const (
	// bulkBytesMax splits a batch into several bulk requests, well below the
	// engine's http.max_content_length (100mb), so that a batch of large
	// documents is not refused as a whole with a 413.
	bulkBytesMax = 8 << 20
	// maxIDBytes is the engine's limit on _id. A longer id fails the whole
	// bulk request validation, so it is caught before sending.
	maxIDBytes = 512
	// versionType makes the engine keep the highest version it has seen, so
	// retries, pipelined bulks and late events never regress a document.
	versionType = "external_gte"
)

// SearchConfig configures the search projection.
type SearchConfig struct {
	// Client talks to the engine; see NewElasticClient. Required.
	Client *elastic.Client
	// Index receives the documents. Required.
	Index string
	// MaxPayloadBytes is the largest upsert payload sent; a larger one fails
	// as payload_invalid. Defaults to 1 MiB.
	MaxPayloadBytes int
	// BulkActions caps the documents of one _bulk request; 0: a batch's
	// documents go in as few requests as BulkBytes allows.
	BulkActions int
	// BulkBytes caps the body of one _bulk request (a larger document goes
	// alone). Defaults to 8 MiB.
	BulkBytes int
	// BulkConcurrency is how many of one batch's _bulk requests are in
	// flight at once. Defaults to 1: one after the other.
	BulkConcurrency int
}

// Search projects outbox events into one Elasticsearch index with the bulk
// API. Documents are versioned externally with the event's version, so the
// order in which bulks reach the engine does not matter.
type Search struct {
	client          *elastic.Client
	index           string
	maxPayloadBytes int
	bulkBytes       int
	bulkActions     int
	bulkConcurrency int
	rebuild         RebuildTarget
	// waiting, if set, says why the handler may not take events yet.
	waiting func() string
}

// RebuildTarget names the index that a rebuild of the handler's projection
// is loading (package rebuild). While there is one, every bulk goes to it
// first and then to the handler's own index, so a document is visible
// through the alias only once the new index has it too, and the new index
// misses no event that the rebuild's snapshot of the source table does not
// hold.
type RebuildTarget interface {
	// RebuildIndex returns the index being rebuilt, "" when none. An error
	// fails the batch (a transient failure): writing to the handler's own
	// index alone could leave the event out of the new one.
	RebuildIndex(ctx context.Context) (string, error)
}

var _ Handler = (*Search)(nil)

// NewSearch validates cfg and returns the handler.
func NewSearch(cfg SearchConfig) (*Search, error) {
	cfg.MaxPayloadBytes = cmp.Or(cfg.MaxPayloadBytes, MaxPayloadBytesDefault)
	switch {
	case cfg.Client == nil:
		return nil, errors.New("search projection: an Elasticsearch client is required")
	case cfg.Index == "":
		return nil, bounds.Invalid("Index", "is required")
	case cfg.Index != strings.ToLower(cfg.Index) || strings.ContainsAny(cfg.Index, ` "*\<|,>/?#`):
		return nil, bounds.Invalid("Index", "%q is not a valid index name (lowercase, no spaces or \\/*?\"<>|,#)", cfg.Index)
	}
	cfg.BulkBytes = cmp.Or(cfg.BulkBytes, bulkBytesMax)
	cfg.BulkConcurrency = cmp.Or(cfg.BulkConcurrency, 1)
	if err := bounds.First(bounds.Check("MaxPayloadBytes", cfg.MaxPayloadBytes, MaxPayloadBytesRange),
		bounds.Check("BulkActions", cfg.BulkActions, BulkActionsRange), bounds.Check("BulkBytes", cfg.BulkBytes, BulkBytesRange),
		bounds.Check("BulkConcurrency", cfg.BulkConcurrency, BulkConcurrencyRange)); err != nil {
		return nil, err
	}
	return &Search{client: cfg.Client, index: cfg.Index, maxPayloadBytes: cfg.MaxPayloadBytes, bulkBytes: cfg.BulkBytes,
		bulkActions: cfg.BulkActions, bulkConcurrency: cfg.BulkConcurrency}, nil
}

// Index is the index, or alias, the handler writes to.
func (s *Search) Index() string { return s.index }

// WaitFor makes the handler wait while waiting says why (see Waits): the
// replica's index keeper, until the index is set up. Call it before the
// loop starts.
func (s *Search) WaitFor(waiting func() string) { s.waiting = waiting }

// Waiting implements Waits.
func (s *Search) Waiting() string {
	if s.waiting == nil {
		return ""
	}
	return s.waiting()
}

// DualWriteTo makes the handler write each bulk to t's index too while t
// names one. Call it before the first Handle.
func (s *Search) DualWriteTo(t RebuildTarget) { s.rebuild = t }

// DocumentID is the _id of an entity's document: deterministic, so that every
// event of an entity addresses the same document, and one document's alone.
// The type ends at the first colon, so a colon in the type (and the percent
// sign that escapes it) is percent-encoded: ('crm', 'contact:42') is
// crm:contact:42 and ('crm:contact', '42') is crm%3Acontact:42. A type with
// neither, as every type was before, keeps the _id it always had.
func DocumentID(entityType, entityID string) string {
	return typeEscaper.Replace(entityType) + ":" + entityID
}

var (
	typeEscaper   = strings.NewReplacer("%", "%25", ":", "%3A")
	typeUnescaper = strings.NewReplacer("%25", "%", "%3A", ":")
)

// ParseDocumentID is the entity whose DocumentID id is; false when id is no
// entity's, such as one written by a version of wlproj before the escaping
// for a type with a colon or a percent sign.
func ParseDocumentID(id string) (entityType, entityID string, ok bool) {
	escaped, entityID, found := strings.Cut(id, ":")
	entityType = typeUnescaper.Replace(escaped)
	if !found || entityType == "" || entityID == "" || DocumentID(entityType, entityID) != id {
		return "", "", false
	}
	return entityType, entityID, true
}

// Handle applies the newest applicable event of each document and returns
// one Result per event, in the order of events. Each round sends the newest
// remaining candidate of every document in one or more bulk requests; when
// the engine refuses it for good (a deterministic error), the next older
// candidate goes in the next round, so an event is marked superseded only
// once a newer event of its document was applied. A transient failure of
// the newest leaves the older candidates to retry with it: sending them now
// could only fail the same way.
func (s *Search) Handle(ctx context.Context, events []outbox.Event) []Result {
	results := make([]Result, len(events))
	target, err := s.rebuildIndex(ctx)
	if err != nil {
		for i, ev := range events {
			results[i] = Result{ID: ev.ID, Err: err}
		}
		return results
	}
	actions := make([]bulkAction, len(events))
	candidates := s.candidates(events, actions, results)
	docs := slices.Sorted(maps.Keys(candidates))
	for len(docs) > 0 {
		send := make([]int, 0, len(docs))
		for _, doc := range docs {
			send = append(send, candidates[doc][0])
		}
		slices.Sort(send)
		s.sendAll(ctx, target, s.requests(send, actions), events, actions, results)
		docs = docs[:0:0]
		for doc, idx := range candidates {
			sent, older := idx[0], idx[1:]
			err := results[sent].Err
			switch {
			case len(older) == 0:
				delete(candidates, doc)
			case err == nil:
				for _, i := range older {
					results[i].Superseded = true
				}
				delete(candidates, doc)
			case classify.Classify(err).Class != classify.Deterministic:
				for _, i := range older {
					e := *classify.Classify(err)
					e.Message = fmt.Sprintf("retried with newer event %d of the document: %s", events[sent].ID, e.Message)
					results[i].Err = &e
				}
				delete(candidates, doc)
			default:
				candidates[doc] = older
				docs = append(docs, doc)
			}
		}
		slices.Sort(docs)
	}
	return results
}

// requests splits the events at send into _bulk requests of at most
// bulkActions documents and bulkBytes bytes; a larger document goes alone.
func (s *Search) requests(send []int, actions []bulkAction) [][]int {
	var out [][]int
	for rest := send; len(rest) > 0; {
		n, total := 0, 0
		for n < len(rest) && (n == 0 || (total+actions[rest[n]].size() <= s.bulkBytes && (s.bulkActions == 0 || n < s.bulkActions))) {
			total += actions[rest[n]].size()
			n++
		}
		out = append(out, rest[:n])
		rest = rest[n:]
	}
	return out
}

// sendAll sends the requests, up to bulkConcurrency at once. They hold
// different documents (one candidate of each per round), so their order
// does not matter, and each writes only its own events' results.
func (s *Search) sendAll(ctx context.Context, target Rebuilding, requests [][]int, events []outbox.Event, actions []bulkAction, results []Result) {
	if s.bulkConcurrency == 1 || len(requests) == 1 {
		for _, idx := range requests {
			s.send(ctx, target, idx, events, actions, results)
		}
		return
	}
	var g errgroup.Group
	g.SetLimit(s.bulkConcurrency)
	for _, idx := range requests {
		g.Go(func() error {
			s.send(ctx, target, idx, events, actions, results)
			return nil
		})
	}
	_ = g.Wait()
}

// candidates builds each event's request and groups the valid ones by
// document, newest first. Invalid events get their error and never become
// a document, so they supersede nothing. An event that reuses the version
// of an older one of its document fails as version_reused: under
// external_gte the engine would let either overwrite the other, so a late
// copy of the first could replace the second for good.
func (s *Search) candidates(events []outbox.Event, actions []bulkAction, results []Result) map[string][]int {
	byDoc := map[string][]int{}
	for i, ev := range events {
		results[i].ID = ev.ID
		action, err := s.action(ev)
		if err != nil {
			results[i].Err = err
			continue
		}
		actions[i] = action
		byDoc[action.id] = append(byDoc[action.id], i)
	}
	for doc, idx := range byDoc {
		slices.SortFunc(idx, func(a, b int) int {
			return cmp.Or(cmp.Compare(events[b].Version(), events[a].Version()),
				compareRepairFirst(events[a], events[b]), cmp.Compare(events[a].ID, events[b].ID))
		})
		byDoc[doc] = dropReused(idx, events, results)
	}
	return byDoc
}

// dropReused keeps, of a document's candidates newest first, one event of
// each version, and fails the others as version_reused. A repair comes
// before the other events of its version and rewrites the version, but they
// stay next in line (the producer's event, a second repair): if the repair
// is refused (a mapping the source row's content does not fit) or fails,
// the next is sent in its place, not marked superseded by a write that
// never happened.
func dropReused(idx []int, events []outbox.Event, results []Result) []int {
	kept := idx[:0]
	for _, i := range idx {
		if len(kept) == 0 || events[kept[len(kept)-1]].Version() != events[i].Version() {
			kept = append(kept, i)
			continue
		}
		if first := events[kept[len(kept)-1]]; !first.Repair {
			results[i].Err = VersionReused(events[i], first.ID)
			continue
		}
		kept = append(kept, i) // behind a repair, the next in line if it is refused
	}
	return kept
}

func compareRepairFirst(a, b outbox.Event) int {
	switch {
	case a.Repair == b.Repair:
		return 0
	case a.Repair:
		return -1
	}
	return 1
}

// VersionReused is the error of an event whose version another event of
// its document already carries (firstID).
func VersionReused(ev outbox.Event, firstID int64) error {
	return classify.New(classify.VersionReused, fmt.Sprintf(
		"event_version %d of %s was already used by event %d; versions of a document must increase",
		ev.Version(), DocumentID(ev.EntityType, ev.EntityID), firstID))
}

// rebuildIndex is where the rebuild of the handler's projection wants each
// bulk, zero when there is none or its index is the handler's own (the
// alias already points at it).
func (s *Search) rebuildIndex(ctx context.Context) (Rebuilding, error) {
	if s.rebuild == nil {
		return Rebuilding{}, nil
	}
	var r Rebuilding
	var err error
	if both, ok := s.rebuild.(RebuildIndexes); ok {
		r, err = both.RebuildIndexes(ctx)
	} else {
		r.Target, err = s.rebuild.RebuildIndex(ctx)
	}
	if err != nil {
		return Rebuilding{}, classify.New(classify.Unknown, "reading the open rebuild: "+err.Error())
	}
	if r.Target == s.index {
		return Rebuilding{}, nil
	}
	return r, nil
}

// send sends the events at idx in one bulk to the handler's index, or while
// a rebuild keeps two indexes to both: first its target and then, what the
// target took, the old index (or the handler's). Before the swap a refusal
// by either is the event's, and an event is superseded only when both said
// so: the ledger then moves forward for what either applied. After the
// swap the target's answer is the event's, and the old index, kept for a
// rollback, must take what it took: only a refusal for good (its older
// mapping) is let go.
func (s *Search) send(ctx context.Context, target Rebuilding, idx []int, events []outbox.Event, actions []bulkAction, results []Result) {
	if target.Target == "" {
		s.bulk(ctx, s.index, idx, events, actions, results)
		return
	}
	if target.Swapped {
		s.bulk(ctx, target.Target, idx, events, actions, results)
		took := make([]int, 0, len(idx))
		for _, i := range idx {
			if results[i].Err == nil {
				took = append(took, i)
			}
		}
		inOld := make([]Result, len(events))
		s.bulk(ctx, target.Old, took, events, actions, inOld)
		for _, i := range took {
			switch ce := classify.Classify(inOld[i].Err); {
			case ce == nil:
				results[i].Superseded = results[i].Superseded && inOld[i].Superseded
			case ce.Class != classify.Deterministic:
				e := *ce
				e.Message = "rollback index " + target.Old + ": " + e.Message
				results[i] = Result{ID: events[i].ID, Err: &e}
			}
		}
		return
	}
	second := cmp.Or(target.Old, s.index)
	inTarget := make([]Result, len(events))
	s.bulk(ctx, target.Target, idx, events, actions, inTarget)
	took := make([]int, 0, len(idx))
	for _, i := range idx {
		if err := inTarget[i].Err; err != nil {
			e := *classify.Classify(err)
			e.Message = "rebuild index " + target.Target + ": " + e.Message
			results[i] = Result{ID: events[i].ID, Err: &e}
			continue
		}
		took = append(took, i)
	}
	s.bulk(ctx, second, took, events, actions, results)
	for _, i := range took {
		results[i].Superseded = results[i].Superseded && inTarget[i].Superseded
		if replaced(results[i].Err) {
			// The first rebuild of a concrete index deletes it in the swap;
			// a bulk in flight then finds no index. The next try goes
			// through the alias that replaced it.
			results[i].Err = classify.New(classify.Unknown, "index "+second+" was replaced by an alias during the swap: "+results[i].Err.Error())
		}
	}
}

// replaced reports whether err is the engine's answer for a missing index.
func replaced(err error) bool {
	ce := classify.Classify(err)
	return ce != nil && ce.Status == http.StatusNotFound && strings.Contains(ce.Message, "index_not_found_exception")
}

// action builds the bulk action of one event, or the payload_invalid error
// that keeps it from being sent.
func (s *Search) action(ev outbox.Event) (bulkAction, error) {
	if ev.EntityType == "" || ev.EntityID == "" {
		return bulkAction{}, classify.New(classify.PayloadInvalid, "empty entity_type or entity_id")
	}
	id := DocumentID(ev.EntityType, ev.EntityID)
	if len(id) > maxIDBytes {
		return bulkAction{}, classify.New(classify.PayloadInvalid,
			fmt.Sprintf("document id is %d bytes, the engine allows %d", len(id), maxIDBytes))
	}
	version := ev.Version()
	if version < 0 {
		// The engine rejects the whole bulk request for one negative version.
		return bulkAction{}, classify.New(classify.PayloadInvalid, fmt.Sprintf("negative event_version %d", version))
	}
	switch ev.Op {
	case outbox.OpUpsert:
		if len(ev.Payload) > s.maxPayloadBytes {
			return bulkAction{}, classify.New(classify.PayloadInvalid,
				fmt.Sprintf("payload is %d bytes, the limit is %d", len(ev.Payload), s.maxPayloadBytes))
		}
		doc, err := jsonObject(ev.Payload)
		if err != nil {
			return bulkAction{}, classify.New(classify.PayloadInvalid, err.Error())
		}
		return bulkAction{op: actionIndex, id: id, version: version, doc: doc}, nil
	case outbox.OpDelete:
		return bulkAction{op: actionDelete, id: id, version: version}, nil
	}
	return bulkAction{}, classify.New(classify.PayloadInvalid, fmt.Sprintf("unknown op %q", ev.Op))
}

// jsonObject checks that payload is one JSON object on one line, as the bulk
// body's newline-delimited format needs. Payloads come from a jsonb column,
// whose text never holds a line break and is always valid JSON, so the
// common case is a check of both ends and no copy; only a payload with line
// breaks (or not from Postgres) is parsed. Anything malformed that still
// gets through is refused by the engine for that item alone, as a
// deterministic parse error.
func jsonObject(payload json.RawMessage) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 {
		return nil, errors.New("upsert payload is empty, not a JSON object")
	}
	if trimmed[0] != '{' {
		return nil, fmt.Errorf("upsert payload is a JSON %s, not an object", jsonKind(trimmed[0]))
	}
	if trimmed[len(trimmed)-1] == '}' && bytes.IndexByte(trimmed, '\n') < 0 && bytes.IndexByte(trimmed, '\r') < 0 {
		return trimmed, nil
	}
	var buf bytes.Buffer
	buf.Grow(len(trimmed))
	if err := json.Compact(&buf, trimmed); err != nil {
		return nil, fmt.Errorf("upsert payload is not valid JSON: %v", err)
	}
	return buf.Bytes(), nil
}

func jsonKind(first byte) string {
	switch {
	case first == '[':
		return "array"
	case first == '"':
		return "string"
	case first == 'n':
		return "null"
	case first == 't' || first == 'f':
		return "boolean"
	case first == '-' || (first >= '0' && first <= '9'):
		return "number"
	}
	return "value"
}

// bulk sends the events at idx in one request to index and fills in their
// results.
func (s *Search) bulk(ctx context.Context, index string, idx []int, events []outbox.Event, actions []bulkAction, results []Result) {
	if len(idx) == 0 {
		return
	}
	// Both timeouts bound how late the bulk can change the index (see
	// WriteLifetime): past its deadline the connection closes abortively
	// and the engine never gets the rest.
	deadline, serverTimeout := bulkTimeouts(timeoutOf(s.client))
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	var body strings.Builder
	total := 0
	for _, i := range idx {
		total += actions[i].size()
	}
	body.Grow(total)
	for _, i := range idx {
		actions[i].writeTo(&body)
	}
	ctx, retryAfter := withRetryAfter(ctx)
	var reply bulkReply
	res, err := s.client.PerformRequest(ctx, elastic.PerformRequestOptions{
		Method: http.MethodPost,
		Path:   "/" + url.PathEscape(index) + "/_bulk",
		// Only what itemResult reads: a 500-item answer shrinks to a tenth,
		// which the engine does not have to write nor the daemon to decode.
		Params: url.Values{
			"filter_path": {"errors,items.*.status,items.*.error"},
			"timeout":     {strconv.FormatInt(serverTimeout.Milliseconds(), 10) + "ms"},
		},
		Body:        body.String(),
		ContentType: "application/x-ndjson",
	})
	if err == nil {
		if err = json.Unmarshal(res.Body, &reply); err != nil {
			err = classify.New(classify.Unknown, "bulk response: "+err.Error())
		}
	}
	if err == nil && len(reply.Items) != len(idx) {
		err = classify.New(classify.Unknown,
			fmt.Sprintf("bulk response has %d items for %d requests", len(reply.Items), len(idx)))
	}
	if err != nil {
		ce := classify.Classify(err)
		if ce.Reason == classify.RateLimited {
			ce.RetryAfter = retryAfter.get()
		}
		for _, i := range idx {
			e := *ce
			results[i].Err = &e
		}
		return
	}
	for k, i := range idx {
		results[i] = itemResult(events[i], reply.Items[k].status())
	}
}

// itemResult reads the engine's answer for one event. Responses come in the
// order of the requests.
func itemResult(ev outbox.Event, it *bulkItemStatus) Result {
	r := Result{ID: ev.ID}
	if it == nil {
		r.Err = classify.New(classify.Unknown, "empty bulk response item")
		return r
	}
	var typ, reason string
	if it.Error != nil {
		typ, reason = it.Error.Type, it.Error.Reason
	}
	switch {
	case it.Status >= 200 && it.Status < 300:
	case ev.Op == outbox.OpDelete && it.Status == http.StatusNotFound && it.Error == nil:
		// Already gone; the engine still recorded the delete's version.
	case it.Status == http.StatusConflict && typ == "version_conflict_engine_exception":
		// Under external_gte versioning the engine holds a newer version.
		r.Superseded = true
	default:
		r.Err = classify.FromBulkItem(it.Status, typ, reason)
	}
	return r
}
