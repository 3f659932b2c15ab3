package replay

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

func TestListPageWalksEveryOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insertFailed(t, 23, "timeout")
	// Ties on every sort key, so the id must break them.
	b.exec(t, `UPDATE outbox_events SET attempts = id % 3, replay_count = id % 2,
	                  updated_at = now() - make_interval(mins => (id % 4)::int) WHERE id = ANY($1)`, id)
	b.exec(t, `UPDATE outbox_events SET status = 'done' WHERE id = $1`, id[22])
	all, err := List(b.ctx, b.db.Pool, Filter{})
	require.NoError(t, err)
	require.Len(t, all, 22)

	for _, key := range SortKeys {
		for _, asc := range []bool{false, true} {
			s := Sort{Key: key, Asc: asc}
			want := slices.Clone(all)
			slices.SortFunc(want, func(x, y FailedEvent) int {
				c := cmp.Or(cmp.Compare(s.cursor(x).Value, s.cursor(y).Value), cmp.Compare(x.ID, y.ID))
				if !asc {
					c = -c
				}
				return c
			})
			// Forward with pages of 5, then back from the last page.
			var got []FailedEvent
			var pages []Page
			req := PageRequest{Sort: s, Size: 5}
			for {
				p, err := ListPage(b.ctx, b.db.Pool, req)
				require.NoError(t, err)
				pages = append(pages, p)
				got = append(got, p.Events...)
				if p.Next == nil {
					break
				}
				req.After = p.Next
			}
			require.Equal(t, ids(want), ids(got), "%s", s)
			require.Len(t, pages, 5, "%s", s)
			require.Nil(t, pages[0].Prev)
			for i := len(pages) - 1; i > 0; i-- {
				p, err := ListPage(b.ctx, b.db.Pool, PageRequest{Sort: s, Size: 5, Before: pages[i].Prev})
				require.NoError(t, err)
				require.Equal(t, ids(pages[i-1].Events), ids(p.Events), "%s: back from page %d", s, i)
				require.Equal(t, i > 1, p.Prev != nil, "%s", s)
				require.Equal(t, pages[i-1].Next, p.Next)
			}
			// A cursor survives its string form.
			c, err := ParseCursor(pages[1].Next.String())
			require.NoError(t, err)
			require.Equal(t, *pages[1].Next, c)
			parsed, err := ParseSort(s.String())
			require.NoError(t, err)
			require.Equal(t, s, parsed)
		}
	}

	p, err := ListPage(b.ctx, b.db.Pool, PageRequest{Filter: Filter{Reason: "mapping_error"}})
	require.NoError(t, err)
	require.Empty(t, p.Events)
	require.Nil(t, p.Next)
	_, err = ListPage(b.ctx, b.db.Pool, PageRequest{Size: 1001})
	require.ErrorContains(t, err, "Size=1001 is out of range")
	_, err = ParseSort("colour")
	require.ErrorContains(t, err, `unknown sort "colour"`)
	_, err = ParseCursor("1.x")
	require.ErrorContains(t, err, "malformed page cursor")
}

func TestFilterByClassTextScopeAndEntity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 6)
	b.fail(t, "timeout", time.Hour, id[:3]...)
	b.fail(t, "mapping_error", time.Hour, id[3:]...)
	b.exec(t, `UPDATE outbox_events SET last_error = 'Field [ISBN] 100% unknown', entity_type = 'block' WHERE id = $1`, id[4])
	for f, want := range map[Filter][]int64{
		{Class: "transient"}:               id[:3],
		{Class: "deterministic"}:           id[3:],
		{Text: "isbn] 100%"}:               id[4:5],
		{Text: "_"}:                        {id[3], id[5]}, // mapping_error, literally: not a wildcard
		{ScopeKey: "lib-1"}:                {id[0], id[2], id[4]},
		{EntityType: "block"}:              id[4:5],
		{Class: "transient", Text: "boom"}: id[:3],
	} {
		n, err := Count(b.ctx, b.db.Pool, f)
		require.NoError(t, err)
		require.Equal(t, int64(len(want)), n, "%+v", f)
		p, err := ListPage(b.ctx, b.db.Pool, PageRequest{Filter: f, Sort: Sort{Key: SortID, Asc: true}})
		require.NoError(t, err)
		require.Equal(t, want, nilIfEmpty(ids(p.Events)), "%+v", f)
	}

	reasons, err := Reasons(b.ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"mapping_error", "timeout"}, reasons)

	// The actions take the same selectors.
	rep := b.discard(t, Request{Class: "deterministic", Text: "ISBN", By: "alice", Why: "gone", DryRun: true})
	require.Equal(t, id[4:5], rep.IDs())
	rep = b.replay(t, Request{ScopeKey: "lib-1", EntityType: "book", By: "alice", Why: "fixed"})
	require.Equal(t, []int64{id[0], id[2]}, rep.IDs())
	var sel string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT selector::text FROM outbox_replay_audit WHERE id = $1`, rep.AuditID).Scan(&sel))
	require.JSONEq(t, `{"scope_key": "lib-1", "entity_type": "book"}`, sel)
}

func nilIfEmpty(s []int64) []int64 {
	if len(s) == 0 {
		return nil
	}
	return s
}

func TestExpectHoldsAnActionToItsDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 4)
	b.fail(t, "timeout", time.Hour, id[:3]...)
	dry := b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x", DryRun: true})
	require.Equal(t, SelectionToken(id[:3]), dry.Token)

	// Another row starts to match: refused, nothing changed.
	b.fail(t, "timeout", time.Hour, id[3])
	rep, err := Replay(b.ctx, b.db.Pool, Request{Reason: "timeout", By: "alice", Why: "x", Expect: dry.Token})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.True(t, refused.Changed)
	require.ErrorContains(t, err, "the selection changed since the dry run: 4 failed events match now")
	require.Empty(t, rep.Events)
	require.Equal(t, []string{"failed", "failed", "failed", "failed"}, b.statuses(t, id...))
	require.Zero(t, b.audits(t))

	// The token of the rows as they are goes through.
	dry = b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x", DryRun: true})
	rep = b.replay(t, Request{Reason: "timeout", By: "alice", Why: "x", Expect: dry.Token})
	require.Len(t, rep.Events, 4)
	require.Equal(t, dry.Token, rep.Token)
}

func TestSelectionToken(t *testing.T) {
	t.Parallel()
	require.Equal(t, SelectionToken([]int64{3, 1, 2}), SelectionToken([]int64{1, 2, 3, 3}))
	require.NotEqual(t, SelectionToken([]int64{1, 2}), SelectionToken([]int64{1, 3}))
	require.NotEqual(t, SelectionToken(nil), SelectionToken([]int64{0}))
	require.Regexp(t, `^3-[0-9a-f]{24}$`, SelectionToken([]int64{1, 2, 3}))
}

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

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 10, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"2025-06-01":           time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC),
		"2025-06-01T10:00:00Z": time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := ParseTime(v, now)
		require.NoError(t, err, v)
		require.True(t, want.Equal(got), "%s: %s", v, got)
	}
	for _, v := range []string{"yesterday", "-1h", "10x", "2025-13-01"} {
		_, err := ParseTime(v, now)
		require.ErrorContains(t, err, "is neither an RFC3339 time", v)
	}
}
