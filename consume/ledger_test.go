package consume

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replay"
)

// engineFixture is a loop draining into a real index through a fault proxy.
type engineFixture struct {
	bundle
	base, index string
	proxy       *faultproxy.Proxy
	loop        *Loop
}

func newEngineFixture(t *testing.T) engineFixture {
	t.Helper()
	f := engineFixture{bundle: setup(t), base: harness.ElasticURL(t), index: harness.NewIndex(t)}
	f.proxy = faultproxy.Start(t, f.base)
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: f.proxy.URL()})
	require.NoError(t, err)
	search, err := projection.NewSearch(projection.SearchConfig{Client: client, Index: f.index})
	require.NoError(t, err)
	f.loop, err = NewLoop(Config{MaxAttempts: 5}, f.Store, projection.Registry{"search": search}, zerolog.Nop())
	require.NoError(t, err)
	// The engine forgets a delete's version after gc_deletes (60 s by
	// default); zero makes every later step run "minutes later".
	f.es(t, http.MethodPut, "/"+f.index+"/_settings", `{"index":{"gc_deletes":"0s"}}`)
	return f
}

func (f engineFixture) es(t *testing.T, method, path, body string) {
	t.Helper()
	require.NoError(t, harness.ES(context.Background(), f.base, method, path, []byte(body), nil))
}

func (f engineFixture) round(t *testing.T) BatchResult {
	t.Helper()
	res, err := f.loop.runOnce(context.Background(), 1)
	require.NoError(t, err)
	return res
}

// forgetTombstones makes the engine lose every delete's version, as a node
// restart does: refresh and flush prune tombstones past gc_deletes, and a
// close/open of the index drops its in-memory version map.
func (f engineFixture) forgetTombstones(t *testing.T, restart bool) {
	t.Helper()
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")
	f.es(t, http.MethodPost, "/"+f.index+"/_flush", "")
	if restart {
		f.es(t, http.MethodPost, "/"+f.index+"/_close", "")
		f.es(t, http.MethodPost, "/"+f.index+"/_open?wait_for_active_shards=1", "")
	}
}

func (f engineFixture) present(t *testing.T, id string) bool {
	t.Helper()
	err := harness.ES(context.Background(), f.base, http.MethodGet, "/"+f.index+"/_doc/"+id, nil, nil)
	if se := (*harness.StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
		return false
	}
	require.NoError(t, err)
	return true
}

// The scenario: an upsert at version 2 fails on the strict mapping,
// a delete at version 3 succeeds, the mapping is fixed and the failed row
// replayed long after the engine forgot the delete. The book stays deleted.
func TestLateReplayOfAnOlderUpsertDoesNotResurrect(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := map[bool]string{false: "after gc_deletes", true: "after an engine restart"}[restart]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newEngineFixture(t)
			f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
				VALUES ('book', 'r1', 'upsert', 2, '{"title": "Dune", "isbn": "x"}')`)
			require.Equal(t, BatchResult{Failed: 1}, f.round(t), "isbn is not in the strict mapping")
			f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', 'r1', 'delete', 3)`)
			require.Equal(t, BatchResult{Done: 1}, f.round(t))

			f.es(t, http.MethodPut, "/"+f.index+"/_mapping", `{"properties":{"isbn":{"type":"keyword"}}}`)
			f.forgetTombstones(t, restart)
			_, err := replay.Replay(context.Background(), f.Pool, replay.Request{IDs: []int64{1}, By: "alice", Why: "mapping fixed"})
			require.NoError(t, err)

			sent := f.proxy.Requests()
			require.Equal(t, BatchResult{Done: 1, Superseded: 1}, f.round(t), "the ledger drops the stale upsert")
			require.Equal(t, sent, f.proxy.Requests(), "without sending it")
			require.False(t, f.present(t, "book:r1"), "the deleted book stays deleted")
			require.Equal(t, 2, f.Count(t, `status = 'done'`))
		})
	}
}

// A transient failure whose backoff outlasts gc_deletes: the retry of the
// older upsert comes after the delete and is dropped.
func TestRetryAfterTheDeleteDoesNotResurrect(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.proxy.Set(faultproxy.Fault{Status: http.StatusServiceUnavailable})
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', 'r1', 'upsert', 2, '{"title": "Dune"}')`)
	require.Equal(t, BatchResult{Retried: 1}, f.round(t))
	f.proxy.Clear()
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version) VALUES ('book', 'r1', 'delete', 3)`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t), "the delete is due, the retry is not")
	f.forgetTombstones(t, false)

	f.Exec(t, `UPDATE outbox_events SET next_retry_at = now() WHERE status = 'pending'`)
	sent := f.proxy.Requests()
	require.Equal(t, BatchResult{Done: 1, Superseded: 1}, f.round(t))
	require.Equal(t, sent, f.proxy.Requests(), "the ledger drops the retry without sending it")
	require.False(t, f.present(t, "book:r1"))
	require.Equal(t, 1, f.Count(t, `status = 'done' AND attempts = 1 AND event_version = 2`), "the retry ends done")
}
