package outbox_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// TestBacklogFiguresAtScale logs what `wlproj status`, the gauges and the
// console's overview cost beside 1 M queued rows a drained position has
// passed (created over two days, the retention keeps them all) and a
// backlog of 200, then again while a producer's transaction holds 200k
// uncommitted rows: "backlog-scale: <when> <what> <median ms> ms
// <buffers> buffers". Slow to load, so only with WLPROJ_BACKLOG_SCALE=1:
//
//	WLPROJ_BACKLOG_SCALE=1 scripts/stack.sh exec go test -count=1 -v ./outbox -run TestBacklogFiguresAtScale
func TestBacklogFiguresAtScale(t *testing.T) {
	if os.Getenv("WLPROJ_BACKLOG_SCALE") == "" {
		t.Skip("WLPROJ_BACKLOG_SCALE=1 runs it (1 M rows)")
	}
	b, origin := queuedBundle(t)
	for i := range 100 {
		b.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, payload, created_at)
			SELECT 'book', g::text, 'upsert', '{"t":1}', now() - make_interval(secs => (1000000 - ($1 * 10000 + g)) * 0.17)
			  FROM generate_series(1, 10000) g`, i)
	}
	b.drainedPast(t, origin, 1_000_000)
	b.insert(t, 200)
	b.Exec(t, `VACUUM ANALYZE outbox_events`)
	logBacklogFigures(t, b, "no open transaction")
	b.openProducer(t, 200_000)
	b.insert(t, 10) // a later commit: the open transaction is in progress in every snapshot after it
	logBacklogFigures(t, b, "200k uncommitted")
}

// logBacklogFigures times status, the gauges and the console's overview
// reads (median of 7) and EXPLAINs the status and gauge statements.
func logBacklogFigures(t *testing.T, b bundle, when string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.URL+"&jit=off") // as pgpool opens the replicas' and the CLI's sessions
	require.NoError(t, err)
	defer conn.Close(ctx)
	status := outbox.SnapshotOptions{MaxProcessing: time.Minute, Retention: 252 * time.Hour, Projections: []string{"search"}, Rebuilds: true}
	console := outbox.SnapshotOptions{MaxProcessing: time.Minute, Projections: []string{"search"}, Rebuilds: true}
	for name, read := range map[string]func() error{
		"status": func() error { _, err := outbox.TakeSnapshotWith(ctx, conn, status); return err },
		"gauges": func() error { _, err := outbox.ReadGauges(ctx, conn, time.Minute); return err },
		"console": func() error {
			if _, err := outbox.TakeSnapshotWith(ctx, conn, console); err != nil {
				return err
			}
			if _, err := outbox.Stuck(ctx, conn, time.Minute, 20); err != nil {
				return err
			}
			_, err := outbox.Activity(ctx, conn, time.Hour, time.Minute)
			return err
		},
	} {
		var took []time.Duration
		for range 7 {
			start := time.Now()
			require.NoError(t, read())
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		t.Logf("backlog-scale: %s %s %.1f ms", when, name, float64(took[3].Microseconds())/1000)
	}
	for name, q := range map[string][]any{
		"status statement": {outbox.SnapshotSQL, 60.0, false, (252 * time.Hour).Seconds()},
		"gauges statement": {outbox.GaugesSQL, 60.0, outbox.GaugeCountCap},
	} {
		rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q[0].(string), q[1:]...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		_, buffers := planBuffers(t, lines)
		t.Logf("backlog-scale: %s %s %s, %d buffers", when, name, lines[len(lines)-1], buffers)
	}
}
