package replay

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
