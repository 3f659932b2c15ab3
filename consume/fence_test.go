package consume

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// hooked is the search projection with hooks around each bulk, for a test
// that acts between a batch's send and its ack. call counts Handle's calls
// from 1. A hook runs on the loop's goroutine: it may block, and must not
// call t.FailNow.
type hooked struct {
	*projection.Search
	before func(call int, events []outbox.Event)
	after  func(call int, results []projection.Result) []projection.Result
	calls  atomic.Int32
}

func (h *hooked) Handle(ctx context.Context, events []outbox.Event) []projection.Result {
	call := int(h.calls.Add(1))
	if h.before != nil {
		h.before(call, events)
	}
	results := h.Search.Handle(ctx, events)
	if h.after != nil {
		results = h.after(call, results)
	}
	return results
}

// search is a search projection on the fixture's index, straight to the
// engine: the proxy's faults are for the fixture's own loop.
func (f engineFixture) search(t *testing.T) *projection.Search {
	t.Helper()
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: f.base})
	require.NoError(t, err)
	s, err := projection.NewSearch(projection.SearchConfig{Client: client, Index: f.index})
	require.NoError(t, err)
	return s
}

// state is everything an ack could change, as text: every outbox row, every
// ledger entry, and the index's documents with their versions.
func (f engineFixture) state(t *testing.T) []string {
	t.Helper()
	rows := harness.Column[string](t, f.DB, `SELECT e::text FROM outbox_events e ORDER BY id`)
	ledger := harness.Column[string](t, f.DB, `SELECT a::text FROM outbox_ledger_entries a ORDER BY entity_id`)
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")
	var docs struct {
		Hits struct {
			Hits []struct {
				ID      string `json:"_id"`
				Version int64  `json:"_version"`
			} `json:"hits"`
		} `json:"hits"`
	}
	require.NoError(t, harness.ES(context.Background(), f.base, http.MethodPost, "/"+f.index+"/_search",
		[]byte(`{"size": 100, "version": true, "_source": false, "sort": ["_doc"]}`), &docs))
	out := append(rows, ledger...)
	for _, d := range docs.Hits.Hits {
		out = append(out, d.ID+"@"+strconv.FormatInt(d.Version, 10))
	}
	return out
}

// takeOver moves the leader name "test" to w2 as its elector would, with the
// epoch one up; w1 is deposed and does not know it yet.
func takeOver(t *testing.T, b bundle) {
	t.Helper()
	var epoch int64
	require.NoError(t, b.Pool.QueryRow(context.Background(), outbox.BumpEpochSQL, "test", "w2").Scan(&epoch))
	require.EqualValues(t, 2, epoch)
}

// The old leader's bulk comes back after a new leader took the epoch (a
// pause, a slow network: its elector has not noticed yet). Its acks, of a
// done and a failed event, are refused: the rows, the ledger and the index
// are as they were when the new epoch was taken. The new leader then
// reclaims the rows and finishes them.
func TestDeposedLeadersAcksAreFenced(t *testing.T) {
	t.Parallel()
	f := newEngineFixture(t)
	f.ClaimedByDefault(t) // claimed rows and their reclaim; TestDeposedLeadersQueuedAcksAreFenced the queued ones
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', 'a', 'upsert', 1, '{"title": "Dune"}')`)
	require.Equal(t, BatchResult{Done: 1}, f.round(t))
	f.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload) VALUES
		('book', 'a', 'upsert', 2, '{"title": "Dune Messiah"}'),
		('book', 'b', 'upsert', 1, '{"title": "Emma", "isbn": "x"}')`)

	entered, release := make(chan struct{}), make(chan struct{})
	old := &hooked{Search: f.search(t), after: func(_ int, results []projection.Result) []projection.Result {
		close(entered)
		<-release // deaf to its context, as a bulk already answered is
		return results
	}}
	loop, err := NewLoop(Config{MaxAttempts: 5}, f.Store, projection.Registry{"search": old}, zerolog.Nop())
	require.NoError(t, err)
	got := make(chan BatchResult, 1)
	go func() {
		res, err := loop.runOnce(context.Background(), 1)
		if err != nil {
			t.Errorf("runOnce: %v", err)
		}
		got <- res
	}()
	<-entered
	takeOver(t, f.bundle)
	before := f.state(t)
	require.Equal(t, 2, f.Count(t, `status = 'processing' AND locked_by = 'w1' AND claim_token = 1`))

	close(release)
	require.Equal(t, BatchResult{Fenced: 2}, <-got, "the done and the failed ack are both refused")
	require.Equal(t, before, f.state(t), "rows, ledger and index are untouched by the refused acks")
	require.Equal(t, 1, f.Int(t, `SELECT version FROM outbox_ledger_entries WHERE entity_id = 'a'`), "the ledger did not move to v2")

	// The new leader takes the rows back and finishes them.
	next := &outbox.Store{Pool: f.Pool, Owner: "w2", LeaderName: "test"}
	reclaimed, err := NewReclaimer(Config{}, next, zerolog.Nop()).runOnce(context.Background(), 2)
	require.NoError(t, err)
	require.Len(t, reclaimed.Pending, 2, "claimed by an earlier leader")
	loop2, err := NewLoop(Config{MaxAttempts: 5}, next, projection.Registry{"search": f.search(t)}, zerolog.Nop())
	require.NoError(t, err)
	res, err := loop2.runOnce(context.Background(), 2)
	require.NoError(t, err)
	require.Equal(t, BatchResult{Done: 1, Failed: 1}, res)
	harness.Verified(t, f.Pool, f.index, harness.ExpectFailed(t, f.DB, "mapping_error", `entity_id = 'b'`)...)
}

// A deposed leader whose bulk returns as its elector cancels its context
// (the epoch has moved) tries no write at all: not even an ack the fence
// would refuse. The loop runs on a pool of its own, whose count of acquires
// on a cancelled context shows any statement it tried after the cancel.
func TestLostLeadershipTriesNoWriteAfterTheEpochMoved(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	pool, err := pgxpool.New(context.Background(), b.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := &outbox.Store{Pool: pool, Owner: "w1", LeaderName: "test"}
	entered := make(chan struct{}, 1)
	h := funcHandler(func(ctx context.Context, e outbox.Event) projection.Result {
		entered <- struct{}{}
		<-ctx.Done()
		return projection.Result{} // the bulk made it just as the leadership went
	})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	// A long poll: once the batch is claimed the loop idles, so the only
	// statement it could try after the cancel is the batch's ack.
	loop, err := NewLoop(Config{PollInterval: time.Minute}, store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(ctx, 1, make(chan struct{})) }()
	<-entered
	harness.Eventually(t, 5*time.Second, "listener attached", func() bool {
		return b.Int(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN `+outbox.NotifyChannel+`'`) == 1
	})
	takeOver(t, b)
	cancel() // the elector noticed
	<-done

	require.Zero(t, pool.Stat().CanceledAcquireCount(), "the deposed leader tried a statement after it lost the lead")
	require.Equal(t, 1, b.Count(t, `status = 'processing' AND locked_by = 'w1' AND claim_token = 1 AND attempts = 0`),
		"the row is left for the next leader's reclaim")
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_ledger_entries`))
}
