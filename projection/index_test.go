package projection

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type indexBundle struct {
	ctx    context.Context
	base   string
	name   string
	client *elastic.Client
}

// indexSetup names an index of the test's own (created by nobody yet).
func indexSetup(t *testing.T) indexBundle {
	t.Helper()
	b := indexBundle{ctx: context.Background(), base: harness.ElasticURL(t), name: harness.NewIndexName(t)}
	var err error
	b.client, err = NewElasticClient(ElasticOptions{URL: b.base})
	require.NoError(t, err)
	return b
}

// indexes is every index named b.name or b.name-*, with its uuid.
func (b indexBundle) indexes(t *testing.T) map[string]string {
	t.Helper()
	var found map[string]struct {
		Settings struct {
			Index struct {
				UUID string `json:"uuid"`
			} `json:"index"`
		} `json:"settings"`
	}
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/"+b.name+","+b.name+"-*"+
		"/_settings/index.uuid?ignore_unavailable=true&allow_no_indices=true&expand_wildcards=all", nil, &found))
	out := map[string]string{}
	for index, s := range found {
		out[index] = s.Settings.Index.UUID
	}
	return out
}

// aliases is what GET /_alias/<b.name> answers: each index and whether it
// is the alias's write index; nil when there is no such alias.
func (b indexBundle) aliases(t *testing.T) map[string]*bool {
	t.Helper()
	var byIndex map[string]struct {
		Aliases map[string]struct {
			IsWriteIndex *bool `json:"is_write_index"`
		} `json:"aliases"`
	}
	err := harness.ES(b.ctx, b.base, http.MethodGet, "/_alias/"+b.name, nil, &byIndex)
	if se, ok := err.(*harness.StatusError); ok && se.Code == http.StatusNotFound {
		return nil
	}
	require.NoError(t, err)
	out := map[string]*bool{}
	for index, a := range byIndex {
		out[index] = a.Aliases[b.name].IsWriteIndex
	}
	return out
}

// requireWritesThrough writes a book through the alias with the daemon's
// handler and finds it in index.
func (b indexBundle) requireWritesThrough(t *testing.T, index string) {
	t.Helper()
	s, err := NewSearch(SearchConfig{Client: b.client, Index: b.name})
	require.NoError(t, err)
	requireApplied(t, handle(t, s, upsert(1, "book", "1", v(3), book("Dune")))[1])
	res, err := b.client.Get().Index(index).Id("book:1").Do(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), *res.Version)
}

var indexNow = time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.UTC)

// TestSearchIndexMissingIsCreatedBehindAlias: a missing ELASTIC_INDEX
// becomes an alias, the write index, of a concrete index named as the
// rebuild names its targets; a second call finds the alias and adds nothing.
func TestSearchIndexMissingIsCreatedBehindAlias(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	concrete := b.name + "-20250304-050607-890"
	require.Equal(t, concrete, TimestampedIndex(b.name, indexNow.In(time.FixedZone("x", 3600))))

	got, err := EnsureIndex(b.ctx, b.client, b.name, indexNow)
	require.NoError(t, err)
	require.Equal(t, IndexSetup{State: IndexCreated, Indexes: []string{concrete}}, got)
	aliases := b.aliases(t)
	require.Equal(t, []string{concrete}, slices.Collect(maps.Keys(aliases)))
	require.NotNil(t, aliases[concrete])
	require.True(t, *aliases[concrete], "the alias's write index")
	before := b.indexes(t)
	require.Equal(t, []string{concrete}, slices.Collect(maps.Keys(before)))

	again, err := EnsureIndex(b.ctx, b.client, b.name, indexNow.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, IndexSetup{State: IndexAlias, Indexes: []string{concrete}}, again)
	require.Equal(t, before, b.indexes(t))
	b.requireWritesThrough(t, concrete)
}

// TestSearchIndexRaceEndsWithOneAlias: replicas that all find the index
// missing and create it at once end with one alias on one index, no stray
// index, and writes through the alias work. A replica that lost the race
// (another's index of another name, or of the same name) reports the alias.
func TestSearchIndexRaceEndsWithOneAlias(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	const replicas = 6
	results := make([]IndexSetup, replicas)
	errs := make([]error, replicas)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = EnsureIndex(b.ctx, b.client, b.name, indexNow.Add(time.Duration(i)*time.Millisecond))
		}()
	}
	close(start)
	wg.Wait()

	var created []string
	for i, r := range results {
		require.NoError(t, errs[i], "replica %d", i)
		if r.State == IndexCreated {
			created = append(created, r.Indexes...)
		}
	}
	require.Len(t, created, 1, "exactly one replica creates the index: %+v", results)
	for i, r := range results {
		require.Equal(t, created, r.Indexes, "replica %d: %+v", i, r)
		require.Contains(t, []IndexState{IndexCreated, IndexAlias}, r.State, "replica %d", i)
	}
	require.Equal(t, created, slices.Collect(maps.Keys(b.aliases(t))))
	before := b.indexes(t)
	require.Equal(t, created, slices.Collect(maps.Keys(before)), "no stray index")

	// The lost race, forced: the alias appeared after this replica found
	// the name missing. The engine refuses a second write index, and an
	// index that exists; neither leaves an index behind.
	for _, index := range []string{TimestampedIndex(b.name, indexNow.Add(time.Minute)), created[0]} {
		got, err := createAliased(b.ctx, b.client, b.name, index, nil)
		require.NoError(t, err, index)
		require.Equal(t, IndexSetup{State: IndexAlias, Indexes: created}, got, index)
		require.Equal(t, before, b.indexes(t), "no stray index after creating %s", index)
	}
	b.requireWritesThrough(t, created[0])
}

// TestSearchIndexConcreteIsLeftAlone: a concrete ELASTIC_INDEX is reported
// and not touched, also when a write auto-created it between this replica's
// look and its create.
func TestSearchIndexConcreteIsLeftAlone(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.name))
	before := b.indexes(t)

	got, err := EnsureIndex(b.ctx, b.client, b.name, indexNow)
	require.NoError(t, err)
	require.Equal(t, IndexSetup{State: IndexConcrete, Indexes: []string{b.name}}, got)

	got, err = createAliased(b.ctx, b.client, b.name, TimestampedIndex(b.name, indexNow), nil)
	require.NoError(t, err)
	require.Equal(t, IndexSetup{State: IndexConcrete, Indexes: []string{b.name}}, got)

	require.Equal(t, before, b.indexes(t), "same index, same uuid, nothing created")
	require.Nil(t, b.aliases(t), "no alias")
}

// TestSearchIndexAliasIsLeftAlone: an alias the operator made (not a write
// index) is reported with its index and not touched.
func TestSearchIndexAliasIsLeftAlone(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	old := b.name + "-old"
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, old))
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodPost, "/_aliases",
		[]byte(`{"actions":[{"add":{"index":"`+old+`","alias":"`+b.name+`"}}]}`), nil))
	before, aliasesBefore := b.indexes(t), b.aliases(t)

	got, err := EnsureIndex(b.ctx, b.client, b.name, indexNow)
	require.NoError(t, err)
	require.Equal(t, IndexSetup{State: IndexAlias, Indexes: []string{old}}, got)
	require.Equal(t, before, b.indexes(t))
	require.Equal(t, aliasesBefore, b.aliases(t))
	require.Nil(t, aliasesBefore[old], "is_write_index unset, as the operator left it")
}

// TestSearchIndexTakesTheEnginesReplicas: the index EnsureIndex creates has
// the engine's default of one replica, so that on a cluster every shard has
// a copy on a second node and a node loss loses nothing (runbook: Engine
// node loss). On a single node the replica stays unassigned (yellow).
func TestSearchIndexTakesTheEnginesReplicas(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	got, err := EnsureIndex(b.ctx, b.client, b.name, time.Now())
	require.NoError(t, err)
	require.Equal(t, IndexCreated, got.State)
	var settings map[string]struct {
		Settings struct {
			Index struct {
				Replicas string `json:"number_of_replicas"`
			} `json:"index"`
		} `json:"settings"`
	}
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/"+got.Indexes[0]+"/_settings/index.number_of_replicas", nil, &settings))
	require.Equal(t, "1", settings[got.Indexes[0]].Settings.Index.Replicas)
}

// TestEnsureIndexWithAMappingFile: a projection's mapping file is the
// body the index is created with, beside the alias wlproj adds.
func TestEnsureIndexWithAMappingFile(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	body := map[string]any{"mappings": map[string]any{"properties": map[string]any{"isbn": map[string]any{"type": "keyword"}}}}
	got, err := EnsureIndexWith(b.ctx, b.client, b.name, body, time.Now())
	require.NoError(t, err)
	require.Equal(t, IndexCreated, got.State)
	types, err := harness.MappedTypes(b.ctx, b.base, got.Indexes[0], "isbn")
	require.NoError(t, err)
	require.Equal(t, map[string]string{got.Indexes[0]: "keyword"}, types)
	write := b.aliases(t)[got.Indexes[0]]
	require.True(t, write != nil && *write, "the alias names the index its write index, as without a mapping")
	require.NotContains(t, body, "aliases", "the caller's body is left as it was")
}

// A keeper whose engine refuses connections says why its projection waits,
// and keeps trying: once the engine is back, the index is created from the
// mapping, behind the alias, and the projection no longer waits.
func TestEnsureIndexWithKeeperWaitsForTheEngine(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	proxy := faultproxy.Start(t, b.base)
	proxy.Set(faultproxy.Fault{Refuse: true})
	client, err := NewElasticClient(ElasticOptions{URL: proxy.URL()})
	require.NoError(t, err)
	mapping := map[string]any{"mappings": map[string]any{"dynamic": "strict"}}
	keeper := NewIndexKeeper(client, b.name, mapping, zerolog.Nop())
	require.Contains(t, keeper.Waiting(), "is not set up yet", "it waits before the first look")

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	kept := make(chan struct{})
	go func() { defer close(kept); keeper.Keep(ctx) }()
	harness.Eventually(t, 10*time.Second, "the refusal is the reason", func() bool {
		return strings.Contains(keeper.Waiting(), "connection")
	})
	require.Nil(t, b.aliases(t), "nothing created meanwhile")

	proxy.Clear()
	select {
	case <-kept:
	case <-time.After(20 * time.Second):
		t.Fatal("Keep did not return once the engine was back")
	}
	require.Empty(t, keeper.Waiting())
	require.Len(t, b.aliases(t), 1, "an alias on one index")
	var got map[string]struct {
		Mappings struct {
			Dynamic string `json:"dynamic"`
		} `json:"mappings"`
	}
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/"+b.name+"/_mapping", nil, &got))
	for index, m := range got {
		require.Equal(t, "strict", m.Mappings.Dynamic, "%s has the mapping given", index)
	}
}

// TestEnsureIndexWithKeeperSendsWhileTheEngineRefusesTheClient: an engine
// that refuses this client's credentials refuses its writes too, so the
// projection's events are sent (and fail with auth_error, retried, as the
// operator expects to see) rather than wait; once the refusal ends the
// keeper sets the index up from its mapping, behind its alias.
func TestEnsureIndexWithKeeperSendsWhileTheEngineRefusesTheClient(t *testing.T) {
	t.Parallel()
	b := indexSetup(t)
	proxy := faultproxy.Start(t, b.base)
	proxy.Set(faultproxy.Fault{Status: http.StatusUnauthorized})
	client, err := NewElasticClient(ElasticOptions{URL: proxy.URL()})
	require.NoError(t, err)
	keeper := NewIndexKeeper(client, b.name, map[string]any{"mappings": map[string]any{"dynamic": "strict"}}, zerolog.Nop())
	_, err = keeper.Ensure(b.ctx)
	require.Error(t, err)
	require.Empty(t, keeper.Waiting(), "a refused client's events are sent, to fail as auth_error")

	proxy.Clear()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	keeper.Keep(ctx)
	require.Empty(t, keeper.Waiting())
	require.Len(t, b.aliases(t), 1, "an alias on one index, from the mapping")
}

// An index wlproj creates refreshes every second whether or not anyone
// searches it (RefreshIntervalDefault), unless its mapping file says
// otherwise; the caller's body is left as it was.
func TestEnsureIndexSetsTheRefreshInterval(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		body map[string]any
		want string
	}{
		"no mapping":          {nil, "1s"},
		"a mapping without":   {map[string]any{"settings": map[string]any{"number_of_replicas": 0}}, "1s"},
		"a mapping with":      {map[string]any{"settings": map[string]any{"index": map[string]any{"refresh_interval": "5s"}}}, "5s"},
		"a mapping, dot form": {map[string]any{"settings": map[string]any{"index.refresh_interval": "30s"}}, "30s"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := indexSetup(t)
			before := fmt.Sprint(c.body)
			got, err := EnsureIndexWith(b.ctx, b.client, b.name, c.body, time.Now())
			require.NoError(t, err)
			var settings map[string]struct {
				Settings struct {
					Index struct {
						RefreshInterval string `json:"refresh_interval"`
					} `json:"index"`
				} `json:"settings"`
			}
			require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/"+got.Indexes[0]+"/_settings", nil, &settings))
			require.Equal(t, c.want, settings[got.Indexes[0]].Settings.Index.RefreshInterval)
			require.Equal(t, before, fmt.Sprint(c.body))
		})
	}
}
