package replay

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/policy"
)

// An actor scoped to library-3 lists, counts, pages, dry-runs and acts on
// library-3's failed rows only, whatever filter it gives: a filter narrows
// its grants, never widens them.
func TestAllowedHoldsEveryReadAndActionToTheGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insertFailed(t, 6, "timeout")
	for i, id := range ids {
		scope := []string{"library-3", "library-4", ""}[i%3]
		b.exec(t, `UPDATE outbox_events SET scope_key = NULLIF($2, '') WHERE id = $1`, id, scope)
	}
	lib3 := policy.NewGrants(policy.Grant{Role: "lib3", Actions: []policy.Action{policy.Replay},
		Projections: []string{"*"}, Scopes: []string{"library-3"}})
	allowed := lib3.Allowed(policy.Replay)
	mine := []int64{ids[0], ids[3]}

	listed, err := List(b.ctx, b.db.Pool, Filter{Allowed: allowed})
	require.NoError(t, err)
	require.ElementsMatch(t, mine, idsOf(listed))
	listed, err = List(b.ctx, b.db.Pool, Filter{ScopeKey: "library-4", Allowed: allowed})
	require.NoError(t, err)
	require.Empty(t, listed, "a filter on another library does not widen the grants")
	stats, err := Stats(b.ctx, b.db.Pool, Filter{Allowed: allowed})
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.EqualValues(t, 2, stats[0].Count)

	dry := b.replay(t, Request{Reason: "timeout", By: "ada", Why: "t", DryRun: true, Allowed: allowed})
	require.ElementsMatch(t, mine, dry.IDs())
	rep := b.replay(t, Request{IDs: []int64{ids[0], ids[1]}, By: "ada", Why: "t", Allowed: allowed})
	require.Equal(t, []int64{ids[0]}, rep.IDs())
	require.Equal(t, []int64{ids[1]}, rep.Skipped, "library-4's row is left alone")
	require.Equal(t, "failed", b.row(t, ids[1]).Status)
	rep = b.replay(t, Request{Reason: "timeout", By: "ada", Why: "t", Allowed: allowed, Expect: ""})
	require.Equal(t, []int64{ids[3]}, rep.IDs())
	for _, id := range []int64{ids[1], ids[2], ids[4], ids[5]} {
		require.Equal(t, "failed", b.row(t, id).Status, "id %d is not library-3's", id)
	}

	outside, err := NotAllowed(b.ctx, b.db.Pool, false, []int64{ids[1], ids[0], 999999, ids[1]}, allowed)
	require.NoError(t, err)
	require.Equal(t, []int64{ids[1], 999999}, outside, "another scope's id, and an id of no row, read alike")
	outside, err = NotAllowed(b.ctx, b.db.Pool, false, []int64{ids[1], 999999}, nil)
	require.NoError(t, err)
	require.Empty(t, outside, "every scope: the action itself says what is missing")

	none, err := List(b.ctx, b.db.Pool, Filter{Allowed: policy.NewGrants().Allowed(policy.View)})
	require.NoError(t, err)
	require.Empty(t, none, "no grant: no row")
}

func idsOf(events []FailedEvent) []int64 {
	var out []int64
	for _, e := range events {
		out = append(out, e.ID)
	}
	return out
}
