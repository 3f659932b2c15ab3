package replay

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// auditRow is one outbox_replay_audit row.
type auditRow struct {
	ID       int64
	Action   string
	By, Why  string
	Selector map[string]any
	Count    int
	IDs      []int64
}

func (b bundle) auditRows(t *testing.T) []auditRow {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT id, action, replayed_by, reason, selector, event_count, event_ids FROM outbox_replay_audit ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var a auditRow
		require.NoError(t, rows.Scan(&a.ID, &a.Action, &a.By, &a.Why, &a.Selector, &a.Count, &a.IDs))
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

// failedAt is the row's time of failure, as Postgres has it.
func (b bundle) failedAt(t *testing.T, id int64) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT updated_at FROM outbox_events WHERE id = $1`, id).Scan(&at))
	return at
}

func TestDiscardByIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 3, "payload_invalid")
	before := b.failedAt(t, id[0])

	rep := b.discard(t, Request{
		IDs: id[:2], By: "alice", Why: "producer bug, superseded (CHG-9)", Given: map[string]string{"ids": FormatIDs(id[:2])},
	})
	require.Equal(t, id[:2], rep.IDs())
	require.Equal(t, "failed", rep.Events[0].Status, "the rows as they were")
	require.Equal(t, []string{"discarded", "discarded", "failed"}, b.statuses(t, id...))

	r := b.row(t, id[0])
	require.Equal(t, 5, r.Attempts, "attempts kept")
	require.Zero(t, r.ReplayCount)
	require.Equal(t, "payload_invalid", *r.ErrorReason, "error fields kept")
	require.Len(t, r.History, 2)
	last := r.History[1]
	require.Equal(t, "discarded", last["event"])
	require.Equal(t, "alice", last["by"])
	require.Equal(t, "producer bug, superseded (CHG-9)", last["why"])
	require.EqualValues(t, rep.AuditID, last["audit_id"])
	require.Contains(t, last, "at")
	require.True(t, before.Equal(b.failedAt(t, id[0])), "updated_at stays the time of failure")

	audits := b.auditRows(t)
	require.Len(t, audits, 1)
	require.Equal(t, auditRow{
		ID: rep.AuditID, Action: "discard", By: "alice", Why: "producer bug, superseded (CHG-9)", Count: 2, IDs: id[:2],
		Selector: map[string]any{"ids": FormatIDs(id[:2]), "given": map[string]any{"ids": FormatIDs(id[:2])}},
	}, audits[0])
}

func TestDiscardGuards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 5, "mapping_error")
	for _, req := range []Request{{IDs: id}, {IDs: id, By: "alice"}, {IDs: id, By: " ", Why: "x"}} {
		_, err := Discard(b.ctx, b.db.Pool, req)
		require.ErrorIs(t, err, ErrAuditRequired)
		require.EqualError(t, err, "By and Why are required: say who is discarding and why")
	}
	_, err := Discard(b.ctx, b.db.Pool, Request{IDs: id, By: AutoBy, Why: "x"})
	var field *bounds.FieldError
	require.ErrorAs(t, err, &field)
	require.Equal(t, "By", field.Field)
	_, err = Discard(b.ctx, b.db.Pool, Request{By: "alice", Why: "x"})
	require.ErrorIs(t, err, ErrNoSelector)
	_, err = Discard(b.ctx, b.db.Pool, Request{Reason: "mapping_error", Limit: -1, By: "alice", Why: "x"})
	require.ErrorContains(t, err, "Limit must not be negative")

	// The cap, as for a replay: refused with the count, lifted by Yes.
	rep, err := Discard(b.ctx, b.db.Pool, Request{Reason: "mapping_error", Max: 4, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, "discard", refused.Action)
	require.EqualError(t, err, "discard refused, nothing changed: 5 failed events match, more than Max 4; narrow the selector, raise Max, or set Yes")
	require.EqualValues(t, 5, rep.Matching)
	require.Empty(t, b.auditRows(t))
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM outbox_events WHERE status = 'failed'`))

	rep = b.discard(t, Request{Reason: "mapping_error", Max: 4, Yes: true, By: "alice", Why: "x"})
	require.Len(t, rep.Events, 5)
	require.Len(t, b.auditRows(t), 1)
}

func TestDiscardRefusedByIDChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 4)
	b.fail(t, "timeout", time.Hour, id[0], id[1])
	b.discard(t, Request{IDs: id[1:2], By: "alice", Why: "x"})
	missing := id[3] + 100

	rep, err := Discard(b.ctx, b.db.Pool, Request{IDs: []int64{id[0], id[1], id[2], missing}, By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, []string{
		"unknown ids: " + itoa(missing),
		fmt.Sprintf("id %d is discarded, not failed", id[1]),
		fmt.Sprintf("id %d is pending, not failed", id[2]),
	}, refused.Problems)
	require.Equal(t, []int64{missing}, rep.Missing)
	require.Equal(t, []IDStatus{{id[1], "discarded"}, {id[2], "pending"}}, rep.NotFailed)
	require.Empty(t, rep.Events)
	require.Equal(t, []string{"failed", "discarded", "pending", "pending"}, b.statuses(t, id...))
	require.Len(t, b.auditRows(t), 1, "only the first discard")
}

func TestDiscardDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 3)
	b.fail(t, "mapping_error", time.Hour, id[0], id[1])
	b.fail(t, "timeout", time.Hour, id[2])

	dry := b.discard(t, Request{Reason: "mapping_error", By: "alice", Why: "x", DryRun: true})
	require.Equal(t, id[:2], dry.IDs())
	require.Zero(t, dry.AuditID)
	require.Equal(t, []string{"failed", "failed", "failed"}, b.statuses(t, id...))
	require.Empty(t, b.auditRows(t))

	real := b.discard(t, Request{Reason: "mapping_error", By: "alice", Why: "x"})
	require.Equal(t, dry.Events, real.Events, "the real run changes exactly the rows the dry run listed")
	require.Equal(t, []string{"discarded", "discarded", "failed"}, b.statuses(t, id...))
}

// Discarded is terminal: neither auto-replay nor a replay takes it.
func TestDiscardedIsNeverRevived(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	b.discard(t, Request{IDs: id, By: "alice", Why: "x"})

	res := b.pass(t, newAuto(t, b, AutoReplayerConfig{}, nil))
	require.Empty(t, res.Revived)
	_, err := Replay(b.ctx, b.db.Pool, Request{IDs: id, By: "alice", Why: "x"})
	require.ErrorContains(t, err, fmt.Sprintf("replay refused, nothing changed: id %d is discarded, not failed", id[0]))
	rep := b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x"})
	require.Empty(t, rep.Events)
	require.Equal(t, []string{"discarded"}, b.statuses(t, id...))
}

func TestDiscardHistoryIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 1, "timeout")
	full, err := json.Marshal(make([]struct{}, outbox.HistoryKeep))
	require.NoError(t, err)
	b.exec(t, `UPDATE outbox_events SET error_history = $2 WHERE id = $1`, id[0], string(full))

	b.discard(t, Request{IDs: id, By: "alice", Why: "x"})
	h := b.row(t, id[0]).History
	require.Len(t, h, outbox.HistoryKeep)
	require.Equal(t, "discarded", h[len(h)-1]["event"])
}
