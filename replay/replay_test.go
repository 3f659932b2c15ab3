package replay

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// row is the lifecycle state a replay changes, as the operator sees it
// (outbox_event_states): a row inserted without a status is queued, which
// is pending until a position passes it; every other row reads as in
// outbox_events.
type row struct {
	Status       string
	Attempts     int
	ReplayCount  int
	LockedBy     *string
	ClaimToken   *int64
	ErrorReason  *string
	History      []map[string]any
	NextRetryDue bool
}

func (b bundle) row(t *testing.T, id int64) row {
	t.Helper()
	var r row
	var hist []byte
	err := b.db.Pool.QueryRow(b.ctx, `
		SELECT status, attempts, replay_count, locked_by, claim_token, error_reason, error_history,
		       next_retry_at <= now()
		  FROM outbox_event_states WHERE id = $1`, id).
		Scan(&r.Status, &r.Attempts, &r.ReplayCount, &r.LockedBy, &r.ClaimToken, &r.ErrorReason, &hist, &r.NextRetryDue)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(hist, &r.History))
	return r
}

func (b bundle) statuses(t *testing.T, ids ...int64) []string {
	t.Helper()
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = b.row(t, id).Status
	}
	return out
}

func (b bundle) audits(t *testing.T) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM outbox_replay_audit`)
}

func TestReplayByIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 3, "mapping_error")

	// Listen before the replay: the NOTIFY must arrive after commit.
	conn, err := pgx.Connect(b.ctx, b.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(b.ctx) })
	_, err = conn.Exec(b.ctx, `LISTEN outbox_events`)
	require.NoError(t, err)

	rep := b.replay(t, Request{
		IDs: []int64{id[0], id[1]}, By: "alice", Why: "mapping fixed",
		Given: map[string]string{"ids": FormatIDs(id[:2])},
	})
	require.Equal(t, id[:2], rep.IDs())
	require.NotZero(t, rep.AuditID)
	require.Equal(t, "mapping_error", rep.Events[0].ErrorReason, "the rows as they were")

	r := b.row(t, id[0])
	require.Equal(t, "pending", r.Status)
	require.Equal(t, 5, r.Attempts, "attempts kept")
	require.Equal(t, 1, r.ReplayCount)
	require.Nil(t, r.LockedBy)
	require.Nil(t, r.ClaimToken)
	require.True(t, r.NextRetryDue)
	require.Equal(t, "mapping_error", *r.ErrorReason, "error fields kept")
	require.Len(t, r.History, 2, "history kept and appended")
	require.Equal(t, "replayed", r.History[1]["event"])
	require.Equal(t, "alice", r.History[1]["by"])
	require.Equal(t, "mapping fixed", r.History[1]["why"])
	require.EqualValues(t, rep.AuditID, r.History[1]["audit_id"])
	require.Equal(t, "failed", b.row(t, id[2]).Status, "not selected")

	// Exactly one audit row, with the selector as given.
	require.Equal(t, 1, b.audits(t))
	var by, why string
	var sel []byte
	var count int
	var auditIDs []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `
		SELECT replayed_by, reason, selector, event_count, event_ids FROM outbox_replay_audit`).
		Scan(&by, &why, &sel, &count, &auditIDs))
	require.Equal(t, "alice", by)
	require.Equal(t, "mapping fixed", why)
	require.Equal(t, 2, count)
	require.Equal(t, id[:2], auditIDs)
	require.JSONEq(t, `{"ids": "`+FormatIDs(id[:2])+`", "given": {"ids": "`+FormatIDs(id[:2])+`"}}`, string(sel))

	n, err := conn.WaitForNotification(b.ctx)
	require.NoError(t, err)
	require.Equal(t, "outbox_events", n.Channel)
}

func TestReplayResetAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	b.replay(t, Request{IDs: id, By: "bob", Why: "retry", ResetAttempts: true})
	require.Equal(t, 0, b.row(t, id[0]).Attempts)
}

func TestReplayRequiresByAndWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	for _, req := range []Request{
		{IDs: id},
		{IDs: id, By: "alice"},
		{IDs: id, Why: "because"},
		{IDs: id, By: "  ", Why: "because"},
	} {
		_, err := Replay(b.ctx, b.db.Pool, req)
		require.ErrorIs(t, err, ErrAuditRequired)
	}
	_, err := Replay(b.ctx, b.db.Pool, Request{IDs: id, By: "auto", Why: "x"})
	require.ErrorContains(t, err, "reserved")
	_, err = Replay(b.ctx, b.db.Pool, Request{By: "alice", Why: "x", Limit: 5})
	require.ErrorIs(t, err, ErrNoSelector)
	require.Equal(t, "failed", b.row(t, id[0]).Status)
	require.Zero(t, b.audits(t))
}

func TestReplayUnknownIDChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2, "timeout")
	missing := id[1] + 100

	rep, err := Replay(b.ctx, b.db.Pool, Request{IDs: []int64{id[0], id[1], missing}, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.ErrorContains(t, err, "unknown ids: "+FormatIDs([]int64{missing}))
	require.Equal(t, []int64{missing}, rep.Missing)
	require.Empty(t, rep.Events)
	require.Equal(t, []string{"failed", "failed"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))
}

func TestReplayOfDoneRowRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 4)
	b.fail(t, "timeout", time.Hour, id[0])
	b.exec(t, `UPDATE outbox_events SET status = 'done' WHERE id = $1`, id[1])

	rep, err := Replay(b.ctx, b.db.Pool, Request{IDs: id, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, []string{
		"id " + itoa(id[1]) + " is done, not failed",
		"ids " + FormatIDs(id[2:]) + " are pending, not failed",
	}, refused.Problems)
	require.Equal(t, []IDStatus{{id[1], "done"}, {id[2], "pending"}, {id[3], "pending"}}, rep.NotFailed)
	require.Empty(t, rep.Events)
	require.Equal(t, []string{"failed", "done", "pending", "pending"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))
}

// A queued row's own status only says that a position decides it: a
// refusal names what the position says, done or pending, as status and the
// console do, never "queued". Discard and archive refuse by the same code.
func TestRefusalNamesAQueuedRowsStatusByItsPosition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 2)
	b.fail(t, "timeout", time.Hour, id[0])
	// A position whose snapshots see id[1] committed: it is done, untouched.
	b.exec(t, `INSERT INTO outbox_positions (projection, done_prev, done_cur, claimed_prev, claimed_cur)
		VALUES ('search', pg_current_snapshot(), pg_current_snapshot(), pg_current_snapshot(), pg_current_snapshot())`)
	id = append(id, b.insert(t, 1)...) // after the position: pending
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM outbox_events WHERE id = ANY($1) AND status = 'queued'`, id[1:]))

	rep, err := Replay(b.ctx, b.db.Pool, Request{IDs: id, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, []string{
		"id " + itoa(id[1]) + " is done, not failed",
		"id " + itoa(id[2]) + " is pending, not failed",
	}, refused.Problems)
	require.Equal(t, []IDStatus{{id[1], "done"}, {id[2], "pending"}}, rep.NotFailed)
	require.Equal(t, []string{"failed", "done", "pending"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))
}

func TestReplayIDsWithOtherSelectors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 4)
	b.fail(t, "timeout", time.Hour, id[0], id[2], id[3])
	b.fail(t, "mapping_error", time.Hour, id[1])

	rep := b.replay(t, Request{IDs: id, Reason: "timeout", Limit: 2, By: "alice", Why: "x", DryRun: true})
	require.Equal(t, []int64{id[0], id[2]}, rep.IDs())
	require.Equal(t, []int64{id[1], id[3]}, rep.Skipped, "filtered out by reason, then by limit")
}

func TestReplayDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 3, "timeout")

	dry := b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x", DryRun: true})
	require.True(t, dry.DryRun)
	require.Equal(t, id, dry.IDs())
	require.Zero(t, dry.AuditID)
	require.Equal(t, []string{"failed", "failed", "failed"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))

	// The real run changes exactly the rows the dry run listed.
	real := b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x"})
	require.Equal(t, dry.Events, real.Events)
	require.Equal(t, []string{"pending", "pending", "pending"}, b.statuses(t, id...))
	require.Equal(t, 1, b.audits(t))
}

func TestReplaySelectors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 6)
	b.fail(t, "timeout", time.Hour, id[0], id[1])
	b.fail(t, "timeout", 48*time.Hour, id[2])
	b.fail(t, "server_error", time.Hour, id[3])
	b.fail(t, "timeout", time.Hour, id[4])
	b.exec(t, `UPDATE outbox_events SET projection = 'chronicle' WHERE id = $1`, id[4])

	rep := b.replay(t, Request{
		Reason: "timeout", Projection: "search", Since: time.Now().Add(-24 * time.Hour), Until: time.Now(),
		By: "alice", Why: "engine back", DryRun: true,
	})
	require.Equal(t, []int64{id[0], id[1]}, rep.IDs())

	rep = b.replay(t, Request{Reason: "timeout", Limit: 2, By: "alice", Why: "x", DryRun: true})
	require.Equal(t, []int64{id[0], id[1]}, rep.IDs(), "limit keeps the lowest ids")

	// Nothing matching: no change and no audit row.
	rep = b.replay(t, Request{Reason: "parse_error", By: "alice", Why: "x"})
	require.Empty(t, rep.Events)
	require.Zero(t, rep.AuditID)
	require.Zero(t, b.audits(t))
}

func TestReplayCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 5, "timeout")

	rep, err := Replay(b.ctx, b.db.Pool, Request{Reason: "timeout", Max: 3, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.ErrorContains(t, err, "5 failed events match, more than Max 3")
	require.EqualValues(t, 5, rep.Matching)
	require.Equal(t, []string{"failed", "failed", "failed", "failed", "failed"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))

	// A limit under the cap is fine; --ids are not capped.
	rep = b.replay(t, Request{Reason: "timeout", Max: 3, Limit: 3, By: "alice", Why: "x", DryRun: true})
	require.Len(t, rep.Events, 3)
	rep = b.replay(t, Request{IDs: id, Max: 3, By: "alice", Why: "x", DryRun: true})
	require.Len(t, rep.Events, 5)

	rep = b.replay(t, Request{Reason: "timeout", Max: 3, Yes: true, By: "alice", Why: "x"})
	require.Len(t, rep.Events, 5)
	require.Equal(t, 1, b.audits(t))
}

func TestReplayTwiceSecondFindsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	b.replay(t, Request{IDs: id, By: "a", Why: "x"})
	_, err := Replay(b.ctx, b.db.Pool, Request{IDs: id, By: "a", Why: "x"})
	require.ErrorContains(t, err, "is pending, not failed")
	require.Equal(t, 1, b.row(t, id[0]).ReplayCount)
}

func TestParseAndFormatIDs(t *testing.T) {
	t.Parallel()
	got, err := ParseIDs(" 12, 3,10-12 ,5-5,")
	require.NoError(t, err)
	require.Equal(t, []int64{3, 5, 10, 11, 12}, got)
	require.Equal(t, "3,5,10-12", FormatIDs(got))
	require.Equal(t, "", FormatIDs(nil))

	for _, bad := range []string{"", ",", "a", "0", "-3", "5-2", "1-x", "1-200000"} {
		_, err := ParseIDs(bad)
		require.Error(t, err, bad)
	}
}

func TestRefusedErrorIsNotUsage(t *testing.T) {
	t.Parallel()
	err := error(&RefusedError{Action: "replay", Problems: []string{"a", "b"}})
	require.Equal(t, "replay refused, nothing changed: a; b", err.Error())
	require.False(t, errors.Is(err, ErrAuditRequired))
}

func itoa(n int64) string { return FormatIDs([]int64{n}) }

// A replay with Yes of a selection larger than a batch commits batch by
// batch, each with its own audit row, oldest failure first: one
// transaction over the whole selection would hold its xid and its row
// locks, and so vacuum, for as long as it took. A row that fails again
// while the command runs is not replayed again by it: here every replay
// fails again at once, as a row with a deterministic error would.
func TestReplayWithYesCommitsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2*BatchDefault+5, "mapping_error")
	b.exec(t, `CREATE FUNCTION fails_again() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN NEW.status := 'failed'; RETURN NEW; END $$`)
	b.exec(t, `CREATE TRIGGER fails_again BEFORE UPDATE ON outbox_events FOR EACH ROW
		WHEN (NEW.status = 'pending') EXECUTE FUNCTION fails_again()`)

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	rep, err := Replay(ctx, b.db.Pool, Request{Reason: "mapping_error", Yes: true, By: "alice", Why: "fixed the mapping"})
	require.NoError(t, err)
	require.Equal(t, id, rep.IDs(), "each row replayed once")
	audits := b.auditRows(t)
	require.Len(t, audits, 3, "one audit row per batch")
	require.Equal(t, []int64{audits[0].ID, audits[1].ID, audits[2].ID}, rep.AuditIDs)
	for i, n := range []int{BatchDefault, BatchDefault, 5} {
		require.Len(t, audits[i].IDs, n)
	}
	require.Equal(t, len(id), b.count(t, `SELECT count(*) FROM outbox_events WHERE replay_count = 1`))
}
