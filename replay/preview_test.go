package replay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// hold locks row id in a transaction of its own, as an ack or another
// operator's action would, until the returned function runs sql on it (if
// any) and commits.
func (b bundle) hold(t *testing.T, id int64) (release func(sql string)) {
	t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	return func(sql string) {
		if sql != "" {
			_, err := tx.Exec(b.ctx, sql, id)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(b.ctx))
	}
}

// waitBlocked waits until a session waits for a lock on a row of the
// outbox.
func (b bundle) waitBlocked(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "a session waiting for a row lock", func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) > 0
	})
}

// A dry run reads the rows it would change and locks none: with a row of
// the selection held by another transaction (an ack, another operator's
// replay), every dry run answers at once, where one that locked its
// selection waited for it, holding every other matching row and vacuum
// meanwhile. A selection larger than a page comes back whole, with the
// token its confirmation checks.
func TestDryRunsLockNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2*previewPage+5, "timeout")
	b.hold(t, id[3])
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	by := Request{By: "alice", Why: "x", DryRun: true}

	replayAll := by
	replayAll.Reason, replayAll.Yes = "timeout", true
	rep, err := Replay(ctx, b.db.Pool, replayAll)
	require.NoError(t, err, "replay --yes --dry-run")
	require.Equal(t, id, rep.IDs())
	require.Equal(t, SelectionToken(id), rep.Token)

	discardSome := by
	discardSome.IDs, discardSome.Limit = id[:10], 5
	rep, err = Discard(ctx, b.db.Pool, discardSome)
	require.NoError(t, err, "discard --ids --dry-run")
	require.Equal(t, id[:5], rep.IDs())
	require.Equal(t, id[5:10], rep.Skipped)

	capped := by
	capped.Reason = "timeout"
	_, err = Replay(ctx, b.db.Pool, capped)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "replay --dry-run over --max")
	require.EqualValues(t, len(id), refused.Matching)

	rep, err = Archive(ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Minute, By: "alice", Why: "x", DryRun: true})
	require.NoError(t, err, "archive --dry-run")
	require.Equal(t, id, rep.IDs())
	require.Equal(t, len(id), b.count(t, `SELECT count(*) FROM outbox_events WHERE status = 'failed'`), "nothing changed")
	require.Zero(t, b.audits(t))
}

// A confirmation of a dry run larger than a batch (the console's, held to
// the dry run by its token) goes in transactions of a batch, each with
// its own audit row, never one transaction locking the whole selection. A
// row someone else changed after the selection was checked is left alone
// and reported.
func TestConfirmedArchiveGoesInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 25, "timeout")
	req := ArchiveRequest{OlderThan: time.Minute, By: "alice", Why: "x", BatchSize: 10}
	dry := req
	dry.DryRun = true
	seen, err := Archive(b.ctx, b.db.Pool, dry)
	require.NoError(t, err)

	release := b.hold(t, id[22])
	done := make(chan struct{})
	var rep Report
	go func() {
		defer close(done)
		req.Expect = seen.Token
		rep, err = Archive(b.ctx, b.db.Pool, req)
	}()
	b.waitBlocked(t)
	require.Equal(t, 20, b.count(t, `SELECT count(*) FROM outbox_dead_letter`), "two batches committed while the third waits")
	release(`UPDATE outbox_events SET status = 'pending' WHERE id = $1`)
	<-done
	require.NoError(t, err)
	require.Equal(t, append(append([]int64{}, id[:22]...), id[23:]...), rep.IDs())
	require.Equal(t, []IDStatus{{ID: id[22], Status: "pending"}}, rep.NotFailed)
	require.Len(t, rep.AuditIDs, 3)
	require.Equal(t, 24, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
}
