package replay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// keptColumns are the columns an archive must keep to bring a row back.
const keptColumns = `id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
	attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at`

// snapshot is every kept column of the rows ids in table, as JSON by id.
func (b bundle) snapshot(t *testing.T, table string, ids ...int64) map[int64]string {
	t.Helper()
	return harness.Pairs[int64, string](t, b.db, `SELECT id, to_jsonb(r)::text FROM (SELECT `+keptColumns+` FROM `+
		pgx.Identifier{table}.Sanitize()+` WHERE id = ANY($1)) r`, ids)
}

// seedArchive makes six rows: failed 2h ago with every column set, discarded
// 3h ago, failed 10 minutes ago, pending and done 2h old, and failed 2h ago
// in another projection.
func (b bundle) seedArchive(t *testing.T) []int64 {
	t.Helper()
	id := b.insert(t, 6)
	b.fail(t, "mapping_error", 2*time.Hour, id[0])
	b.fail(t, "payload_invalid", 3*time.Hour, id[1])
	b.fail(t, "mapping_error", 10*time.Minute, id[2])
	b.fail(t, "timeout", 2*time.Hour, id[5])
	b.exec(t, `UPDATE outbox_events SET event_version = 7, payload = '{"title": "Dune", "n": [1, 2]}',
		replay_count = 2, created_at = now() - interval '5 hours' WHERE id = $1`, id[0])
	b.exec(t, `UPDATE outbox_events SET status = 'discarded' WHERE id = $1`, id[1])
	b.exec(t, `UPDATE outbox_events SET updated_at = now() - interval '2 hours' WHERE id = ANY($1)`, id[3:5])
	b.exec(t, `UPDATE outbox_events SET status = 'done' WHERE id = $1`, id[4])
	b.exec(t, `UPDATE outbox_events SET projection = 'chronicle' WHERE id = $1`, id[5])
	return id
}

// seedArchived is seedArchive with the rows that failed over an hour ago
// archived: id[0], id[1] and id[5].
func (b bundle) seedArchived(t *testing.T) []int64 {
	t.Helper()
	id := b.seedArchive(t)
	_, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, By: "alice", Why: "old"})
	require.NoError(t, err)
	return id
}

func TestArchiveMovesOldFailedAndDiscardedRowsWithEveryColumn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	before := b.snapshot(t, "outbox_events", id...)

	rep, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, Projection: "search", By: "alice",
		Why: "older than an hour", Given: map[string]string{"older-than": "1h"}})
	require.NoError(t, err)
	require.Equal(t, id[:2], rep.IDs())
	require.Equal(t, []string{"failed", "discarded"}, []string{rep.Events[0].Status, rep.Events[1].Status})
	require.Equal(t, []int64{rep.AuditID}, rep.AuditIDs)

	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_events WHERE id = ANY($1)`, id[:2]))
	require.Equal(t, []string{"failed", "pending", "done", "failed"}, b.statuses(t, id[2:]...))
	after := b.snapshot(t, "outbox_dead_letter", id...)
	require.Equal(t, map[int64]string{id[0]: before[id[0]], id[1]: before[id[1]]}, after, "every column kept")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM outbox_dead_letter
		WHERE archive_audit_id = $1 AND archived_at > now() - interval '1 minute'`, rep.AuditID))

	audits := b.auditRows(t)
	require.Len(t, audits, 1)
	require.Equal(t, "archive", audits[0].Action)
	require.Equal(t, id[:2], audits[0].IDs)
	require.Equal(t, 2, audits[0].Count)
	require.Equal(t, map[string]any{"older-than": "1h"}, audits[0].Selector["given"])
	require.Contains(t, audits[0].Selector, "until", "the resolved cut-off as well as what was typed")
}

func TestArchiveInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 6)
	b.fail(t, "timeout", 2*time.Hour, id[:5]...)

	rep, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, BatchSize: 2, By: "alice", Why: "x"})
	require.NoError(t, err)
	require.Equal(t, id[:5], rep.IDs())
	audits := b.auditRows(t)
	require.Len(t, audits, 3, "one audit row per batch")
	require.Equal(t, []int64{audits[0].ID, audits[1].ID, audits[2].ID}, rep.AuditIDs)
	require.Equal(t, audits[0].ID, rep.AuditID)
	for i, want := range [][]int64{id[0:2], id[2:4], id[4:5]} {
		require.Equal(t, want, audits[i].IDs)
	}
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
	require.Equal(t, []string{"pending"}, b.statuses(t, id[5]))
}

func TestArchiveRefusedByIDChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	missing := id[5] + 100

	rep, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, IDs: []int64{id[0], id[3], id[4], missing},
		By: "alice", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, "archive", refused.Action)
	require.Equal(t, []string{
		"unknown ids: " + itoa(missing),
		fmt.Sprintf("id %d is pending, not failed or discarded", id[3]),
		fmt.Sprintf("id %d is done, not failed or discarded", id[4]),
	}, refused.Problems)
	require.Empty(t, rep.Events)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
	require.Empty(t, b.auditRows(t))

	// By ids, a row that failed too recently is skipped, not refused.
	rep, err = Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, IDs: id[:3], By: "alice", Why: "x"})
	require.NoError(t, err)
	require.Equal(t, id[:2], rep.IDs())
	require.Equal(t, id[2:3], rep.Skipped)
}

func TestArchiveGuards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	for _, tc := range []struct {
		req   ArchiveRequest
		field string
	}{
		{ArchiveRequest{OlderThan: 0, By: "a", Why: "x"}, "OlderThan"},
		{ArchiveRequest{OlderThan: -time.Hour, By: "a", Why: "x"}, "OlderThan"},
		{ArchiveRequest{OlderThan: time.Hour, By: AutoBy, Why: "x"}, "By"},
		{ArchiveRequest{OlderThan: time.Hour, IDs: id, BatchSize: 2, By: "a", Why: "x"}, "IDs"},
		{ArchiveRequest{Before: time.Now().Add(time.Minute), By: "a", Why: "x"}, "Before"},
	} {
		_, err := Archive(b.ctx, b.db.Pool, tc.req)
		var field *bounds.FieldError
		require.ErrorAs(t, err, &field, "%+v", tc.req)
		require.Equal(t, tc.field, field.Field)
	}
	_, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, Why: "x"})
	require.EqualError(t, err, "By and Why are required: say who is archiving and why")

	dry, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, By: "a", Why: "x", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []int64{id[0], id[1], id[5]}, dry.IDs())
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
	require.Empty(t, b.auditRows(t))
}

func TestRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	before := b.snapshot(t, "outbox_events", id[0])[id[0]]
	arch, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, IDs: id[:1], By: "alice", Why: "old"})
	require.NoError(t, err)

	conn, err := pgx.Connect(b.ctx, b.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(b.ctx) })
	_, err = conn.Exec(b.ctx, `LISTEN outbox_events`)
	require.NoError(t, err)

	dry, err := Restore(b.ctx, b.db.Pool, Request{IDs: id[:1], By: "bob", Why: "customer asked", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, id[:1], dry.IDs())
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_events WHERE id = $1`, id[0]), "a dry run restores nothing")

	rep, err := Restore(b.ctx, b.db.Pool, Request{IDs: id[:1], By: "bob", Why: "customer asked"})
	require.NoError(t, err)
	require.Equal(t, id[:1], rep.IDs())
	require.False(t, rep.Events[0].ArchivedAt.IsZero(), "the row as it was, in the dead letter")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))

	r := b.row(t, id[0])
	require.Equal(t, "pending", r.Status)
	require.True(t, r.NextRetryDue)
	require.Equal(t, 3, r.ReplayCount, "replay_count + 1")
	require.Equal(t, 5, r.Attempts)
	require.Len(t, r.History, 2, "history kept and appended")
	require.Equal(t, map[string]any{"event": "restored", "by": "bob", "why": "customer asked",
		"audit_id": float64(rep.AuditID), "reset_attempts": false, "at": r.History[1]["at"]}, r.History[1])
	var same int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `
		SELECT count(*) FROM outbox_events e, jsonb_to_record($2::jsonb) AS o(payload jsonb, event_version bigint,
		       created_at timestamptz, error_reason text, last_error text, scope_key text)
		 WHERE e.id = $1 AND e.payload = o.payload AND e.event_version = o.event_version
		   AND e.created_at = o.created_at AND e.error_reason = o.error_reason
		   AND e.last_error = o.last_error AND e.scope_key = o.scope_key`, id[0], before).Scan(&same))
	require.Equal(t, 1, same, "payload, version, creation and errors as before the archive")

	audits := b.auditRows(t)
	require.Len(t, audits, 2)
	require.Equal(t, []string{"archive", "restore"}, []string{audits[0].Action, audits[1].Action})
	require.Equal(t, arch.AuditID, audits[0].ID)
	require.Equal(t, auditRow{ID: rep.AuditID, Action: "restore", By: "bob", Why: "customer asked",
		Selector: map[string]any{"ids": itoa(id[0])}, Count: 1, IDs: id[:1]}, audits[1])

	n, err := conn.WaitForNotification(b.ctx)
	require.NoError(t, err)
	require.Equal(t, "outbox_events", n.Channel, "the leader is woken")
}

func TestRestoreRefusesUnknownArchivedIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchived(t)

	// id[2] exists, but in outbox_events: not archived.
	rep, err := Restore(b.ctx, b.db.Pool, Request{IDs: []int64{id[0], id[2]}, By: "bob", Why: "x"})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.EqualError(t, err, "restore refused, nothing changed: unknown archived ids: "+itoa(id[2]))
	require.Equal(t, []int64{id[2]}, rep.Missing)
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
	require.Len(t, b.auditRows(t), 1, "only the archive")

	_, err = Restore(b.ctx, b.db.Pool, Request{Reason: "mapping_error", By: "bob", Why: "x"})
	var field *bounds.FieldError
	require.ErrorAs(t, err, &field)
	require.Equal(t, "IDs", field.Field)
}

func TestListAndStatsArchived(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchived(t)

	all, err := List(b.ctx, b.db.Pool, Filter{Archived: true})
	require.NoError(t, err)
	require.Equal(t, []int64{id[5], id[0], id[1]}, ids(all), "newest failure first")
	require.Equal(t, "discarded", all[2].Status)
	require.WithinDuration(t, time.Now(), all[0].ArchivedAt, time.Minute)
	require.True(t, strings.HasPrefix(all[1].LastError, "boom: mapping_error"))
	for name, tc := range map[string]struct {
		f    Filter
		want []int64
	}{
		"reason":     {Filter{Archived: true, Reason: "payload_invalid"}, []int64{id[1]}},
		"projection": {Filter{Archived: true, Projection: "chronicle"}, []int64{id[5]}},
		"until":      {Filter{Archived: true, Until: time.Now().Add(-150 * time.Minute)}, []int64{id[1]}},
		"limit":      {Filter{Archived: true, Limit: 1}, []int64{id[5]}},
	} {
		got, err := List(b.ctx, b.db.Pool, tc.f)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, ids(got), name)
	}
	live, err := List(b.ctx, b.db.Pool, Filter{})
	require.NoError(t, err)
	require.Equal(t, []int64{id[2]}, ids(live), "the failed listing no longer has them")

	stats, err := Stats(b.ctx, b.db.Pool, Filter{Archived: true, Projection: "search"})
	require.NoError(t, err)
	require.Len(t, stats, 2)
	require.Equal(t, Stat{Projection: "search", Reason: "mapping_error", Class: "deterministic", Count: 1,
		Oldest: stats[0].Oldest, Newest: stats[0].Oldest}, stats[0])
}

// The audit table serves every action; the auto-replay budget counts only
// the replays by "auto" (its plan: outbox/audit_test.go).
func TestAuditActionsAndAutoBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 2, "timeout")
	b.discard(t, Request{IDs: id[:1], By: "alice", Why: "x"})
	res := b.pass(t, newAuto(t, b, AutoReplayerConfig{PerMinute: 5}, nil))
	require.Equal(t, id[1:], res.Revived)
	require.Equal(t, []string{"discard", "replay"}, []string{b.auditRows(t)[0].Action, b.auditRows(t)[1].Action})
	spent, err := outbox.AuditedSince(b.ctx, b.db.Pool, AutoBy, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, spent)

	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // read only
	_, err = tx.Exec(b.ctx, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids)
		VALUES ('bogus', 'a', 'b', '{}', 0, '{}')`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr))
	require.Equal(t, "outbox_replay_audit_action_check", pgErr.ConstraintName)
}

// TestArchiveHeldToItsDryRun: with Expect, the confirmed archive moves the
// dry run's rows at the dry run's cut-off (Before) in one transaction, or
// refuses and moves nothing when the selection changed meanwhile.
func TestArchiveHeldToItsDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	cutoff := time.Now().Add(-time.Hour)
	dry, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{Before: cutoff, Projection: "search", By: "a", Why: "x", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, id[:2], dry.IDs())

	// Someone else archives id[1] first: the selection changed.
	_, err = Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, IDs: id[1:2], By: "bob", Why: "y"})
	require.NoError(t, err)
	_, err = Archive(b.ctx, b.db.Pool, ArchiveRequest{Before: cutoff, Projection: "search", By: "a", Why: "x", Expect: dry.Token})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.True(t, refused.Changed)
	require.Equal(t, []string{"failed"}, b.statuses(t, id[0]), "nothing moved")
	require.Len(t, b.auditRows(t), 1, "only bob's archive is audited")

	again, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{Before: cutoff, Projection: "search", By: "a", Why: "x", DryRun: true})
	require.NoError(t, err)
	rep, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{Before: cutoff, Projection: "search", By: "a", Why: "x",
		Expect: again.Token, BatchSize: 1})
	require.NoError(t, err)
	require.Equal(t, id[:1], rep.IDs())
	require.Len(t, rep.AuditIDs, 1, "one transaction, whatever the batch size")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
}

// TestArchiveCappedInOneTransaction: with Max, a selection without ids in
// one transaction (a dry run) is capped as a replay is; Yes lifts it.
func TestArchiveCappedInOneTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	_, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, By: "a", Why: "x", DryRun: true, Max: 2})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, int64(3), refused.Matching)
	require.Equal(t, 2, refused.Max)
	dry, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Hour, By: "a", Why: "x", DryRun: true, Max: 2, Yes: true})
	require.NoError(t, err)
	require.Equal(t, []int64{id[0], id[1], id[5]}, dry.IDs())
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
}

// TestArchivedDiscardedRowsAreNeverRestored: discarded is terminal for good.
// An archive keeps a discarded row as discarded, and a restore naming it
// refuses and changes nothing, even with failed rows beside it; a failed
// archived row still comes back.
func TestArchivedDiscardedRowsAreNeverRestored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchived(t) // id[0] and id[5] failed, id[1] discarded
	more := b.insertFailed(t, 1, "timeout")
	b.discard(t, Request{IDs: more, By: "alice", Why: "junk"})
	_, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Minute, IDs: more, By: "alice", Why: "old"})
	require.NoError(t, err)
	discarded := []int64{id[1], more[0]}
	require.Equal(t, []string{"discarded", "discarded"},
		harness.Column[string](t, b.db, `SELECT status FROM outbox_dead_letter WHERE id = ANY($1) ORDER BY id`, discarded),
		"the dead letter remembers that they were discarded")

	dead := b.snapshot(t, "outbox_dead_letter", append(id, more...)...)
	live := b.snapshot(t, "outbox_events", append(id, more...)...)
	audits := len(b.auditRows(t))
	unchanged := func(msg string) {
		t.Helper()
		require.Equal(t, dead, b.snapshot(t, "outbox_dead_letter", append(id, more...)...), msg)
		require.Equal(t, live, b.snapshot(t, "outbox_events", append(id, more...)...), msg)
		require.Len(t, b.auditRows(t), audits, msg+": no audit row")
	}

	for _, req := range []Request{
		{IDs: []int64{id[1]}, By: "bob", Why: "x"},
		{IDs: []int64{id[1]}, By: "bob", Why: "x", DryRun: true},
		{IDs: []int64{id[0], id[1], more[0]}, By: "bob", Why: "x", ResetAttempts: true},
	} {
		rep, err := Restore(b.ctx, b.db.Pool, req)
		var refused *RefusedError
		require.ErrorAs(t, err, &refused, "%+v", req)
		require.Empty(t, rep.Events)
		unchanged(fmt.Sprintf("%v", req.IDs))
	}
	_, err = Restore(b.ctx, b.db.Pool, Request{IDs: []int64{id[1]}, By: "bob", Why: "x"})
	require.EqualError(t, err, fmt.Sprintf("restore refused, nothing changed: archived id %d was discarded; "+
		"discarded events are never revived", id[1]))
	_, err = Restore(b.ctx, b.db.Pool, Request{IDs: []int64{id[0], id[1], more[0]}, By: "bob", Why: "x"})
	require.EqualError(t, err, fmt.Sprintf("restore refused, nothing changed: archived ids %s were discarded; "+
		"discarded events are never revived", FormatIDs(discarded)))

	// A failed archived row still restores.
	rep, err := Restore(b.ctx, b.db.Pool, Request{IDs: id[:1], By: "bob", Why: "x"})
	require.NoError(t, err)
	require.Equal(t, id[:1], rep.IDs())
	require.Equal(t, []string{"pending"}, b.statuses(t, id[0]))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM outbox_dead_letter`), "id[5] and both discarded rows stay")
}

// A batch that comes back short does not end the archive: here a row of
// the first batch is replayed while the batch waits for its lock, and the
// rows behind it are archived all the same.
func TestArchiveGoesOnPastAShortBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 30, "timeout")
	release := b.hold(t, id[3])
	done := make(chan struct{})
	var rep Report
	var err error
	go func() {
		defer close(done)
		rep, err = Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Minute, BatchSize: 10, By: "alice", Why: "x"})
	}()
	b.waitBlocked(t)
	release(`UPDATE outbox_events SET status = 'pending' WHERE id = $1`)
	<-done
	require.NoError(t, err)
	require.Equal(t, 29, len(rep.Events))
	require.Equal(t, 29, b.count(t, `SELECT count(*) FROM outbox_dead_letter`))
	require.Equal(t, []string{"pending"}, b.statuses(t, id[3]))
}
