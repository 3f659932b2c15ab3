package replay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// newAuto is an AutoReplayer that sees the engine as *healthy says; nil is
// always healthy.
func newAuto(t *testing.T, b bundle, cfg AutoReplayerConfig, healthy *bool) *AutoReplayer {
	t.Helper()
	if healthy == nil {
		healthy = new(true)
	}
	a, err := NewAutoReplayer(b.db.Pool, cfg, func(context.Context) bool { return *healthy }, zerolog.Nop())
	require.NoError(t, err)
	return a
}

// pass is one pass of a, failing the test on an error.
func (b bundle) pass(t *testing.T, a *AutoReplayer) autoResult {
	t.Helper()
	res, err := a.runOnce(b.ctx)
	require.NoError(t, err)
	return res
}

// passMinute ages the auto audit rows, as if a minute went by.
func (b bundle) passMinute(t *testing.T) {
	t.Helper()
	b.exec(t, `UPDATE outbox_replay_audit SET replayed_at = replayed_at - interval '61 seconds'`)
}

func TestAutoReplayRate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 8)
	// Oldest failure first: id[4] failed longest ago.
	b.fail(t, "timeout", 10*time.Minute, id[0])
	b.fail(t, "server_error", 20*time.Minute, id[1])
	b.fail(t, "rate_limited", 30*time.Minute, id[2])
	b.fail(t, "connection", 40*time.Minute, id[3])
	b.fail(t, "timeout", 50*time.Minute, id[4])
	a := newAuto(t, b, AutoReplayerConfig{PerMinute: 2}, nil)
	a.replayed = metrics.NewSet().NewCounter(`outbox_replayed_total{by="auto"}`)

	res := b.pass(t, a)
	require.True(t, res.Healthy)
	require.Equal(t, 2, res.Budget)
	require.Equal(t, []int64{id[3], id[4]}, res.Revived)

	// Same minute: the budget is spent.
	res = b.pass(t, a)
	require.Zero(t, res.Budget)
	require.Empty(t, res.Revived)

	// A second replica (a new leader) shares the budget: it is in the audit table.
	other := newAuto(t, b, AutoReplayerConfig{PerMinute: 2}, nil)
	res = b.pass(t, other)
	require.Empty(t, res.Revived)

	b.passMinute(t)
	res = b.pass(t, a)
	require.Equal(t, []int64{id[1], id[2]}, res.Revived)

	require.Equal(t, []string{"failed", "pending", "pending", "pending", "pending"}, b.statuses(t, id[:5]...))
	require.EqualValues(t, 4, a.replayed.Get())

	// One audit row per run that revived something, by auto.
	rows, err := b.db.Pool.Query(b.ctx, `SELECT replayed_by, event_count, event_ids FROM outbox_replay_audit ORDER BY id`)
	require.NoError(t, err)
	var got [][]int64
	for rows.Next() {
		var by string
		var n int
		var ids []int64
		require.NoError(t, rows.Scan(&by, &n, &ids))
		require.Equal(t, "auto", by)
		require.Equal(t, len(ids), n)
		got = append(got, ids)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, [][]int64{{id[3], id[4]}, {id[1], id[2]}}, got)
	require.Equal(t, "auto", b.row(t, id[1]).History[1]["by"])
}

func TestAutoReplayNeverTouchesDeterministic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 7)
	b.fail(t, "mapping_error", time.Hour, id[0])
	b.fail(t, "parse_error", time.Hour, id[1])
	b.fail(t, "payload_invalid", time.Hour, id[2])
	b.fail(t, "client_error", time.Hour, id[3])
	b.fail(t, "unknown_projection", time.Hour, id[4])
	b.fail(t, "stuck", time.Hour, id[5]) // transient, but a person should look at it
	b.fail(t, "timeout", time.Minute, id[6])
	a := newAuto(t, b, AutoReplayerConfig{PerMinute: 100}, nil)

	res := b.pass(t, a)
	require.Equal(t, []int64{id[6]}, res.Revived)
	for _, i := range id[:6] {
		require.Equal(t, "failed", b.row(t, i).Status)
	}
}

func TestAutoReplayWaitsForHealthyEngine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2, "server_error")
	healthy := false
	a := newAuto(t, b, AutoReplayerConfig{}, &healthy)

	res := b.pass(t, a)
	require.False(t, res.Healthy)
	require.Empty(t, res.Revived)
	require.Equal(t, []string{"failed", "failed"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))

	healthy = true
	res = b.pass(t, a)
	require.Equal(t, id, res.Revived)
}

func TestAutoReplayStopsAfterMaxReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2, "timeout")
	b.exec(t, `UPDATE outbox_events SET replay_count = 2 WHERE id = $1`, id[0])
	a := newAuto(t, b, AutoReplayerConfig{MaxReplays: 2}, nil)

	res := b.pass(t, a)
	require.Equal(t, []int64{id[1]}, res.Revived)
	require.Equal(t, "failed", b.row(t, id[0]).Status)
}

func TestAutoReplayerConfig(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) bool { return true }
	a, err := NewAutoReplayer(nil, AutoReplayerConfig{}, ok, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, AutoReplayerConfig{PerMinute: 60, Interval: 10 * time.Second, MaxReplays: 3}, a.cfg)

	_, err = NewAutoReplayer(nil, AutoReplayerConfig{PerMinute: -1}, ok, zerolog.Nop())
	require.ErrorContains(t, err, "PerMinute=")
	_, err = NewAutoReplayer(nil, AutoReplayerConfig{Interval: -time.Second}, ok, zerolog.Nop())
	require.ErrorContains(t, err, "Interval=-1s is out of range")
	_, err = NewAutoReplayer(nil, AutoReplayerConfig{MaxReplays: -1}, ok, zerolog.Nop())
	require.ErrorContains(t, err, "MaxReplays=-1 is out of range")
	_, err = NewAutoReplayer(nil, AutoReplayerConfig{}, nil, zerolog.Nop())
	require.Error(t, err)
}

func TestAutoReplayRunStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	a := newAuto(t, b, AutoReplayerConfig{Interval: 10 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Run(ctx, 1, nil)
	}()
	require.Eventually(t, func() bool {
		var status string
		_ = b.db.Pool.QueryRow(b.ctx, `SELECT status FROM outbox_events WHERE id = $1`, id[0]).Scan(&status)
		return status == "pending"
	}, 5*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// A run that finds another under way (a deposed and a new leader, briefly
// both running it) leaves the round to it at once, rather than wait in a
// statement whose snapshot would hold vacuum back as long; the next round
// revives the rows.
func TestAutoReplayLeavesTheRoundToARunUnderWay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2, "timeout")
	other, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer other.Rollback(b.ctx) //nolint:errcheck // the test's own
	_, err = other.Exec(b.ctx, strings.Replace(autoLockSQL, "pg_try_advisory_xact_lock", "pg_advisory_xact_lock", 1))
	require.NoError(t, err)
	a := newAuto(t, b, AutoReplayerConfig{}, nil)

	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	res, err := a.runOnce(ctx)
	require.NoError(t, err, "the run waited for the lock")
	require.Less(t, time.Since(start), time.Second)
	require.True(t, res.Busy)
	require.Empty(t, res.Revived)
	require.Equal(t, []string{"failed", "failed"}, b.statuses(t, id...))

	require.NoError(t, other.Rollback(b.ctx))
	res = b.pass(t, a)
	require.False(t, res.Busy)
	require.Equal(t, id, res.Revived)
}

// The policy sweeps the failed rows a few pages a run, from where the last
// run stopped, instead of walking every failed row for each run: behind
// rows it may not revive (replayed MaxReplays times, or deterministic), the
// first runs revive nothing and the sweep goes on; every revivable row is
// revived within a sweep, a failure newer than the sweep's position too,
// and the sweep starts again from the oldest once it has read the newest.
func TestAutoReplaySweepsInPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spent := b.insertFailed(t, 7, "timeout")
	b.exec(t, `UPDATE outbox_events SET replay_count = 3, updated_at = now() - interval '2 hours' WHERE id = ANY($1)`, spent)
	old := b.insert(t, 1)
	b.fail(t, "mapping_error", 90*time.Minute, old...)
	later := b.insertFailed(t, 2, "server_error") // an hour ago
	a := newAuto(t, b, AutoReplayerConfig{PerMinute: 100}, nil)
	a.replayed = metrics.NewSet().NewCounter(`outbox_replayed_total{by="auto"}`)
	a.page, a.pages = 2, 2

	require.Empty(t, b.pass(t, a).Revived, "4 rows read, none revivable")
	require.Empty(t, b.pass(t, a).Revived, "4 more: the last spent ones and the mapping error")
	res := b.pass(t, a)
	require.Equal(t, later, res.Revived)
	require.Equal(t, sweepStart, a.swept, "the newest failure read: the next run starts again")

	fresh := b.insert(t, 1)
	b.fail(t, "connection", 0, fresh...)
	var revived []int64
	for range 4 {
		revived = append(revived, b.pass(t, a).Revived...)
	}
	require.Equal(t, fresh, revived, "found once the sweep reached it")
}
