package replay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type bundle struct {
	db  harness.DB
	ctx context.Context
}

func setup(t *testing.T) bundle {
	t.Helper()
	return bundle{db: harness.NewDatabase(t), ctx: context.Background()}
}

// insert adds n pending rows and returns their ids.
func (b bundle) insert(t *testing.T, n int) []int64 {
	t.Helper()
	return harness.Column[int64](t, b.db, `
		INSERT INTO outbox_events (entity_type, entity_id, op, scope_key)
		SELECT 'book', 'b' || g, 'upsert', 'lib-' || (g % 2) FROM generate_series(1, $1) g
		RETURNING id`, n)
}

// fail marks ids failed with reason, failed ago in the past, the way the
// daemon's terminal ack leaves them.
func (b bundle) fail(t *testing.T, reason string, ago time.Duration, ids ...int64) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, `
		UPDATE outbox_events
		   SET status = 'failed', attempts = 5, error_reason = $2,
		       error_class = CASE WHEN $2 IN ('mapping_error', 'parse_error', 'payload_invalid') THEN 'deterministic' ELSE 'transient' END,
		       last_error = 'boom: ' || $2 || repeat('x', 400),
		       error_history = jsonb_build_array(jsonb_build_object('reason', $2)),
		       locked_by = 'w1', claim_token = 3,
		       updated_at = now() - make_interval(secs => $3)
		 WHERE id = ANY($1)`, ids, reason, ago.Seconds())
	require.NoError(t, err)
}

// insertFailed adds n rows failed with reason an hour ago and returns
// their ids.
func (b bundle) insertFailed(t *testing.T, n int, reason string) []int64 {
	t.Helper()
	id := b.insert(t, n)
	b.fail(t, reason, time.Hour, id...)
	return id
}

// replay and discard are the operator's calls, failing the test on an
// error.
func (b bundle) replay(t *testing.T, req Request) Report {
	t.Helper()
	rep, err := Replay(b.ctx, b.db.Pool, req)
	require.NoError(t, err)
	return rep
}

func (b bundle) discard(t *testing.T, req Request) Report {
	t.Helper()
	rep, err := Discard(b.ctx, b.db.Pool, req)
	require.NoError(t, err)
	return rep
}

func (b bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err)
}

func (b bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

func ids(events []FailedEvent) []int64 {
	return harness.Map(events, func(e FailedEvent) int64 { return e.ID })
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 8)
	b.fail(t, "timeout", time.Hour, id[0], id[1])
	b.fail(t, "mapping_error", 2*time.Hour, id[2], id[3])
	b.fail(t, "server_error", 48*time.Hour, id[4])
	b.exec(t, `UPDATE outbox_events SET projection = 'chronicle', entity_type = 'block' WHERE id = $1`, id[3])
	b.exec(t, `UPDATE outbox_events SET status = 'done' WHERE id = $1`, id[5])

	all, err := List(b.ctx, b.db.Pool, Filter{})
	require.NoError(t, err)
	require.Equal(t, []int64{id[1], id[0], id[3], id[2], id[4]}, ids(all), "newest failure first")
	e := all[0]
	require.Equal(t, "search", e.Projection)
	require.Equal(t, "book", e.EntityType)
	require.Equal(t, "b2", e.EntityID)
	require.Equal(t, "upsert", e.Op)
	require.Equal(t, 5, e.Attempts)
	require.Equal(t, "timeout", e.ErrorReason)
	require.Equal(t, "transient", e.ErrorClass)
	require.True(t, strings.HasPrefix(e.LastError, "boom: timeout"))
	require.Len(t, e.LastError, 300, "a snippet, not the whole error")
	require.Equal(t, "lib-0", e.ScopeKey)
	require.WithinDuration(t, time.Now().Add(-time.Hour), e.UpdatedAt, time.Minute)

	for name, tc := range map[string]struct {
		f    Filter
		want []int64
	}{
		"reason":      {Filter{Reason: "mapping_error"}, []int64{id[3], id[2]}},
		"projection":  {Filter{Projection: "chronicle"}, []int64{id[3]}},
		"entity type": {Filter{EntityType: "block"}, []int64{id[3]}},
		"scope key":   {Filter{ScopeKey: "lib-1"}, []int64{id[0], id[2], id[4]}},
		"since":       {Filter{Since: time.Now().Add(-3 * time.Hour)}, []int64{id[1], id[0], id[3], id[2]}},
		"until":       {Filter{Until: time.Now().Add(-3 * time.Hour)}, []int64{id[4]}},
		"window":      {Filter{Since: time.Now().Add(-150 * time.Minute), Until: time.Now().Add(-90 * time.Minute)}, []int64{id[3], id[2]}},
		"and":         {Filter{Reason: "mapping_error", Projection: "search"}, []int64{id[2]}},
		"limit":       {Filter{Limit: 2}, []int64{id[1], id[0]}},
		"none":        {Filter{Reason: "parse_error"}, []int64{}},
	} {
		got, err := List(b.ctx, b.db.Pool, tc.f)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, ids(got), name)
	}

	_, err = List(b.ctx, b.db.Pool, Filter{Limit: -1})
	require.ErrorContains(t, err, "Limit must not be negative")
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 6)
	b.fail(t, "timeout", time.Hour, id[0])
	b.fail(t, "timeout", 3*time.Hour, id[1])
	b.fail(t, "timeout", 2*time.Hour, id[2])
	b.fail(t, "mapping_error", time.Minute, id[3])
	b.exec(t, `UPDATE outbox_events SET projection = 'chronicle' WHERE id = $1`, id[3])

	stats, err := Stats(b.ctx, b.db.Pool, Filter{})
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, "search", stats[0].Projection)
	require.Equal(t, "timeout", stats[0].Reason)
	require.Equal(t, "transient", stats[0].Class)
	require.EqualValues(t, 3, stats[0].Count)
	require.WithinDuration(t, time.Now().Add(-3*time.Hour), stats[0].Oldest, time.Minute)
	require.WithinDuration(t, time.Now().Add(-time.Hour), stats[0].Newest, time.Minute)
	require.Equal(t, Stat{Projection: "chronicle", Reason: "mapping_error", Class: "deterministic", Count: 1,
		Oldest: stats[1].Oldest, Newest: stats[1].Oldest}, stats[1])

	stats, err = Stats(b.ctx, b.db.Pool, Filter{Since: time.Now().Add(-90 * time.Minute)})
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.EqualValues(t, 1, stats[0].Count)
}

// Stats reads a page of statsPage rows per statement: groups that span
// pages add up, with their oldest and newest failure, and the order is the
// single statement's (largest first, then projection and reason).
func TestStatsAcrossPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, statsPage+statsPage/2)
	b.exec(t, `UPDATE outbox_events SET status = 'failed', error_class = 'transient',
		error_reason = CASE WHEN id % 3 = 0 THEN 'server_error' ELSE 'timeout' END,
		updated_at = now() - make_interval(secs => id) WHERE id = ANY($1)`, id)
	want := harness.Column[string](t, b.db, `SELECT format('%s %s %s %s %s %s', projection, error_reason, max(error_class),
		count(*), min(updated_at), max(updated_at)) FROM outbox_events WHERE status = 'failed'
		GROUP BY projection, error_reason ORDER BY count(*) DESC, projection, error_reason`)

	stats, err := Stats(b.ctx, b.db.Pool, Filter{})
	require.NoError(t, err)
	var got []string
	for _, s := range stats {
		var oldest, newest string
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT $1::timestamptz::text, $2::timestamptz::text`, s.Oldest, s.Newest).
			Scan(&oldest, &newest))
		got = append(got, fmt.Sprintf("%s %s %s %d %s %s", s.Projection, s.Reason, s.Class, s.Count, oldest, newest))
	}
	require.Equal(t, want, got)
}
