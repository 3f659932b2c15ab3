package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// carrySQL moves a row from partition 1 into partition 2 as the outbox's
// rotation carries a needed row into the current partition
// (outbox/prune.go, carryEventsSQL): a DELETE and an INSERT in one
// statement, the row as it was but for its slot.
const carrySQL = `
WITH moved AS (DELETE FROM outbox_events_1 m WHERE m.id = $1 RETURNING m.*)
INSERT INTO outbox_events_2
SELECT r.* FROM moved
 CROSS JOIN LATERAL jsonb_populate_record(NULL::outbox_events, to_jsonb(moved) || jsonb_build_object('slot', 2::smallint)) r`

// TestReplayByIDWhileTheRotationMovesTheRow: the replay's lock waits for
// the rotation's move of the failed row; once the move commits, the row
// its statement saw is deleted and the moved one was not in its snapshot.
// The replay reads the missing ids again, in a snapshot that sees the
// move, and replays the row instead of calling an existing id unknown.
func TestReplayByIDWhileTheRotationMovesTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")[0]

	carry, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer carry.Rollback(b.ctx) //nolint:errcheck
	_, err = carry.Exec(b.ctx, carrySQL, id)
	require.NoError(t, err)

	type result struct {
		rep Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Replay(b.ctx, b.db.Pool, Request{IDs: []int64{id}, By: "alice", Why: "during a rotation"})
		done <- result{rep, err}
	}()
	require.Eventually(t, func() bool {
		// The database is this test's own; the query's text is not
		// matched, since pg_stat_activity keeps only its first 1 kB.
		return b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the replay waits for the moving row's lock")
	require.NoError(t, carry.Commit(b.ctx))

	r := <-done
	require.NoError(t, r.err, "the moved row is found, not unknown")
	require.Equal(t, []int64{id}, r.rep.IDs())
	require.Empty(t, r.rep.Missing)
	require.Equal(t, "pending", b.row(t, id).Status)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox_events_2 WHERE id = $1 AND status = 'pending'`, id),
		"the replay changed the moved row, in its new partition")
	require.Equal(t, 1, b.audits(t))
}
