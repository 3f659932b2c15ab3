package consume

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// funcHandler is a projection whose outcome per event the test decides.
type funcHandler func(ctx context.Context, e outbox.Event) projection.Result

func (f funcHandler) Handle(ctx context.Context, events []outbox.Event) []projection.Result {
	out := make([]projection.Result, len(events))
	for i, e := range events {
		out[i] = f(ctx, e)
		out[i].ID = e.ID
	}
	return out
}

// bundle is the test's database and the store the loop claims through.
type bundle = harness.Outbox

// setup makes w1 the leader of epoch 1, the epoch start runs the loop in.
func setup(t *testing.T) bundle {
	t.Helper()
	b := harness.NewOutbox(t)
	b.Lead(t, 1)
	return b
}

// setupClaimed is setup whose rows are inserted pending, as rows that
// retry, were replayed or predate queued rows are: for the claim's own
// tests (leases, release, reclaim, the cursor, claim fencing).
func setupClaimed(t *testing.T) bundle {
	t.Helper()
	b := setup(t)
	b.ClaimedByDefault(t)
	return b
}

// hangingHandler is a projection whose bulk never answers: each event
// signals entered, then waits for its context to end.
func hangingHandler() (h funcHandler, entered <-chan struct{}) {
	ch := make(chan struct{}, 100)
	return func(ctx context.Context, e outbox.Event) projection.Result {
		ch <- struct{}{}
		<-ctx.Done()
		return projection.Result{Err: ctx.Err()}
	}, ch
}

// start runs the loop as leader of epoch 1 and returns a function that
// drains it and waits for it to return.
func start(t *testing.T, b bundle, cfg Config, handlers projection.Registry, opts ...func(*Loop)) (drainAndWait func()) {
	t.Helper()
	loop, err := NewLoop(cfg, b.Store, handlers, zerolog.Nop())
	require.NoError(t, err)
	for _, o := range opts {
		o(loop)
	}
	drain := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(context.Background(), 1, drain) }()
	var once sync.Once
	stop := func() { once.Do(func() { close(drain); <-done }) }
	t.Cleanup(stop)
	return stop
}

func TestLoopRecordsEveryOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var tries sync.Map
	h := funcHandler(func(_ context.Context, e outbox.Event) projection.Result {
		n, _ := tries.LoadOrStore(e.EntityID, new(atomic.Int32))
		try := n.(*atomic.Int32).Add(1)
		switch e.EntityID {
		case "flaky": // fails twice, then works
			if try <= 2 {
				return projection.Result{Err: classify.New(classify.ServerError, "503")}
			}
		case "always-down":
			return projection.Result{Err: classify.New(classify.Connection, "refused")}
		case "bad":
			return projection.Result{Err: classify.New(classify.MappingError, "strict mapping")}
		case "old":
			return projection.Result{Superseded: true}
		}
		return projection.Result{}
	})
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES
		('book','ok','upsert'), ('book','flaky','upsert'), ('book','always-down','upsert'),
		('book','bad','upsert'), ('book','old','upsert')`)
	b.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op) VALUES ('chronicle','book','x','upsert')`)

	loop, err := NewLoop(Config{MaxAttempts: 3, UnknownWait: time.Millisecond}, b.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	// Each round makes the retries due at once instead of waiting out the backoff.
	round := func() BatchResult {
		res, err := loop.runOnce(context.Background(), 1)
		require.NoError(t, err)
		b.Exec(t, `UPDATE outbox_events SET next_retry_at = now() WHERE status = 'pending'`)
		return res
	}
	// Queued rows are read a projection at a time, retries claimed: the
	// rounds' split depends on that order, their sum does not.
	var sum BatchResult
	for range 10 {
		res := round()
		sum.Done, sum.Superseded, sum.Retried, sum.Failed = sum.Done+res.Done, sum.Superseded+res.Superseded,
			sum.Retried+res.Retried, sum.Failed+res.Failed
	}
	require.Equal(t, BatchResult{Done: 3, Superseded: 1, Retried: 4, Failed: 3}, sum,
		"flaky and always-down retried twice each; the third attempt is the last")
	require.Zero(t, b.Count(t, `status IN ('pending','processing')`))
	type row struct {
		status, reason, class string
		attempts, history     int
	}
	get := func(entity string) row {
		var r row
		var reason, class *string
		require.NoError(t, b.Pool.QueryRow(context.Background(), `
			SELECT status, error_reason, error_class, attempts, jsonb_array_length(error_history)
			FROM outbox_event_states WHERE entity_id = $1`, entity).Scan(&r.status, &reason, &class, &r.attempts, &r.history))
		if reason != nil {
			r.reason, r.class = *reason, *class
		}
		return r
	}
	require.Equal(t, row{status: "done"}, get("ok"))
	require.Equal(t, row{status: "done"}, get("old"))
	require.Equal(t, row{status: "done", attempts: 2, history: 2}, get("flaky"), "done: its earlier errors only in the history")
	require.Equal(t, row{status: "failed", reason: "connection", class: "transient", attempts: 3, history: 3}, get("always-down"))
	require.Equal(t, row{status: "failed", reason: "mapping_error", class: "deterministic", attempts: 1, history: 1}, get("bad"),
		"a deterministic error fails at once")
	require.Equal(t, row{status: "failed", reason: "unknown_projection", class: "deterministic", attempts: 1, history: 1}, get("x"))
}

func TestDrainReturnsUnfinishedWithoutAnAttempt(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	h, entered := hangingHandler()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 10) g`)
	stop := start(t, b, Config{ShutdownGrace: time.Second, PollInterval: 20 * time.Millisecond}, projection.Registry{"search": h})
	<-entered
	require.Equal(t, 10, b.Count(t, `status = 'processing'`))

	stop()
	require.Equal(t, 10, b.Count(t, `status = 'pending' AND attempts = 0 AND locked_by = 'w1' AND lease_until IS NULL`),
		"drain puts unfinished rows back without counting an attempt")
}

// TestClaimsABatchAheadForEachBulkLaneAndTheDrainReleasesThem: with every
// bulk lane hung, the loop holds one batch read ahead per lane and claims
// no more; the drain puts them all back without an attempt. One ahead in
// all was not enough: two bulks sharing the engine finish together, and
// the second lane then waited for the next read.
func TestClaimsABatchAheadForEachBulkLaneAndTheDrainReleasesThem(t *testing.T) {
	t.Parallel()
	for _, lanes := range []int{1, 2} {
		t.Run(strconv.Itoa(lanes), func(t *testing.T) {
			t.Parallel()
			b := setupClaimed(t)
			h, entered := hangingHandler()
			b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) SELECT 'book', g::text, 'upsert' FROM generate_series(1, 40) g`)
			waiting := make(chan struct{}, 1)
			stop := start(t, b, Config{BulkSize: 5, Concurrency: lanes, ShutdownGrace: time.Second, PollInterval: time.Minute},
				projection.Registry{"search": h}, func(l *Loop) { l.slotWait = waiting })
			<-entered
			// The loop signals each time it finds every place ahead taken, and
			// may once too early, while a batch is getting its lanes: wait for
			// the count, then for the loop to stop at it.
			held := 2 * lanes * 5 // lanes batches in flight, as many read ahead
			harness.Eventually(t, 10*time.Second, "a batch in flight and one read ahead per lane", func() bool {
				return b.Count(t, `status = 'processing'`) == held
			})
			<-waiting
			require.Equal(t, 40-held, b.Count(t, `status = 'pending'`), "and no more")

			stop()
			require.Equal(t, 40, b.Count(t, `status = 'pending' AND attempts = 0`), "the batches read ahead go back too")
		})
	}
}

func TestLostLeadershipWritesNothing(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	h, entered := hangingHandler()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	loop, err := NewLoop(Config{PollInterval: 20 * time.Millisecond}, b.Store, projection.Registry{"search": h}, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); loop.Run(ctx, 1, make(chan struct{})) }()
	<-entered
	cancel()
	<-done
	require.Equal(t, 1, b.Count(t, `status = 'processing' AND attempts = 0`), "a deposed leader leaves rows for the next leader's reclaim")
}

func TestNotifyWakesTheLoop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan time.Time, 1)
	h := funcHandler(func(context.Context, outbox.Event) projection.Result {
		got <- time.Now()
		return projection.Result{}
	})
	start(t, b, Config{PollInterval: time.Minute}, projection.Registry{"search": h})
	harness.Eventually(t, 5*time.Second, "listener attached", func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN outbox_events'`).Scan(&n))
		return n == 1
	})
	inserted := time.Now()
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	select {
	case at := <-got:
		require.Less(t, at.Sub(inserted), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("NOTIFY did not wake the loop; the one-minute poll would have")
	}
}

func TestReclaimerRunOnce(t *testing.T) {
	t.Parallel()
	b := setupClaimed(t)
	b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', '1', 'upsert', 'processing', 'w0', 1, now() - interval '1 second', now())`)
	r := NewReclaimer(Config{MaxAttempts: 5}, b.Store, zerolog.Nop())
	res, err := r.runOnce(context.Background(), 1)
	require.NoError(t, err)
	require.Len(t, res.Pending, 1)
	require.Equal(t, 1, b.Count(t, `status = 'pending' AND attempts = 1 AND error_history->0->>'event' = 'stuck_reclaimed'`))
}

func TestConfigOutOfRangeNamesTheField(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]Config{
		"BulkSize=100000 is out of range":        {BulkSize: 100000},
		"Concurrency=-1 is out of range":         {Concurrency: -1},
		"Lease=2h0m0s is out of range":           {Lease: 2 * time.Hour},
		"MaxBackoff=1s must not be below":        {BaseBackoff: time.Minute, MaxBackoff: time.Second},
		"ShutdownGrace=1h0m0s is out of range":   {ShutdownGrace: time.Hour},
		"PollInterval=1ms is out of range [10ms": {PollInterval: time.Millisecond},
		"ClaimCooldown=2s is out of range":       {ClaimCooldown: 2 * time.Second},
	} {
		err := cfg.WithDefaults().Validate()
		require.ErrorContains(t, err, field)
	}
	require.NoError(t, Config{}.WithDefaults().Validate())
}

func TestDecideClassifiesEachResult(t *testing.T) {
	t.Parallel()
	cfg := Config{MaxAttempts: 3}.WithDefaults()
	byID := map[int64]outbox.Event{1: {ID: 1}, 2: {ID: 2}, 3: {ID: 3, Attempts: 2}, 4: {ID: 4}, 5: {ID: 5}}
	out := decide(byID, []projection.Result{
		{ID: 1},
		{ID: 2, Err: classify.New(classify.ServerError, "503")},
		{ID: 3, Err: classify.New(classify.ServerError, "503")},
		{ID: 4, Err: classify.New(classify.MappingError, "strict")},
		{ID: 5, Superseded: true},
	}, cfg)
	require.Equal(t, []int64{1, 5}, out.done)
	require.Equal(t, map[int64]string{5: causeProjection}, out.superseded)
	require.Equal(t, []int64{1}, out.applied(), "a superseded event moves no ledger entry")
	require.Len(t, out.failures, 3)
	retry, last, bad := out.failures[0], out.failures[1], out.failures[2]
	require.False(t, retry.Terminal, "a transient error with attempts left retries")
	require.GreaterOrEqual(t, retry.RetryIn, cfg.BaseBackoff/2)
	require.Equal(t, "server_error", retry.Reason)
	require.True(t, last.Terminal, "the last attempt is terminal")
	require.Zero(t, last.RetryIn)
	require.True(t, bad.Terminal, "a deterministic error is terminal at once")
	require.Equal(t, "deterministic", bad.Class)
}
