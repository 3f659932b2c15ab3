package replay

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

func TestEventDetail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 2)
	b.fail(t, "mapping_error", time.Hour, id[0])
	b.exec(t, `UPDATE outbox_events SET payload = '{"b": 1, "a": [1, 2]}', event_version = 9,
	              error_history = jsonb_build_array(
	                  jsonb_build_object('at', '2025-01-02T03:04:05.123456+00:00', 'attempt', 1, 'class', 'deterministic',
	                                     'reason', 'mapping_error', 'error', 'strict', 'worker', 'w1', 'epoch', 2),
	                  jsonb_build_object('at', now(), 'event', 'replayed', 'by', 'bob', 'why', 'fixed', 'audit_id', 5,
	                                     'reset_attempts', true))
	            WHERE id = $1`, id[0])
	d, err := Event(b.ctx, b.db.Pool, id[0])
	require.NoError(t, err)
	require.Equal(t, "failed", d.Status)
	require.Equal(t, int64(9), *d.EventVersion)
	require.Contains(t, d.Payload, "\"a\": [\n")
	require.Len(t, d.LastError, 419, "the whole last error, not the listing's 300")
	require.Len(t, d.History, 2)
	require.Equal(t, HistoryEntry{At: time.Date(2025, 1, 2, 3, 4, 5, 123456000, time.UTC), Attempt: 1, Class: "deterministic",
		Reason: "mapping_error", Error: "strict", Worker: "w1", Epoch: 2}, withUTC(d.History[0]))
	require.Equal(t, []any{"replayed", "bob", "fixed", int64(5), true},
		[]any{d.History[1].Event, d.History[1].By, d.History[1].Why, d.History[1].AuditID, d.History[1].ResetAttempts})
	require.True(t, d.ArchivedAt.IsZero())

	_, err = Event(b.ctx, b.db.Pool, 999_999)
	require.True(t, errors.Is(err, ErrNotFound))

	rep, err := Archive(b.ctx, b.db.Pool, ArchiveRequest{OlderThan: time.Minute, IDs: id[:1], By: "alice", Why: "old"})
	require.NoError(t, err)
	d, err = Event(b.ctx, b.db.Pool, id[0])
	require.NoError(t, err, "an archived row is found in the dead letter")
	require.False(t, d.ArchivedAt.IsZero())
	require.Len(t, d.History, 2)

	audits, err := outbox.AuditLog(b.ctx, b.db.Pool, outbox.AuditFilter{EventID: id[0]})
	require.NoError(t, err)
	require.Len(t, audits, 1)
	require.Equal(t, rep.AuditID, audits[0].ID)
	a, err := outbox.ReadAudit(b.ctx, b.db.Pool, rep.AuditID)
	require.NoError(t, err)
	require.Equal(t, []any{"archive", "alice", "old", 1, id[:1]}, []any{a.Action, a.By, a.Why, a.Count, a.IDs})
	var sel map[string]any
	require.NoError(t, json.Unmarshal(a.Selector, &sel))
	require.Equal(t, FormatIDs(id[:1]), sel["ids"])
	require.Contains(t, sel, "until")
	_, err = outbox.ReadAudit(b.ctx, b.db.Pool, 999_999)
	require.True(t, errors.Is(err, ErrNotFound))
}

func withUTC(h HistoryEntry) HistoryEntry {
	h.At = h.At.UTC()
	return h
}
