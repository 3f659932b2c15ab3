package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// known are the projections the tests' binary would know.
var known = []string{"chronicle", "search"}

func (b bundle) setPaused(t *testing.T, projection string, paused bool) outbox.PauseResult {
	t.Helper()
	res, err := outbox.SetPaused(context.Background(), b.Pool,
		outbox.PauseRequest{Projection: projection, Paused: paused, By: "alice", Why: "INC-7", Known: known})
	require.NoError(t, err)
	return res
}

// A paused projection's rows stay pending and do not hold up the rows
// behind them; a resume claims them again, oldest first.
func TestClaimSkipsPausedProjections(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Lead(t, 1)
	b.Exec(t, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op)
		SELECT CASE WHEN g <= 3 OR g = 5 THEN 'chronicle' ELSE 'search' END, 'book', g::text, 'upsert'
		  FROM generate_series(1, 6) g`)

	b.setPaused(t, "chronicle", true)
	require.Equal(t, []int64{4, 6}, claimedIDs(b.claim(t, 1, 2)), "the paused rows ahead block nothing")
	require.Empty(t, b.claim(t, 1, 10))
	require.Equal(t, map[string]int{"pending": 4, "processing": 2}, b.statuses(t))

	b.setPaused(t, "chronicle", false)
	require.Equal(t, []int64{1, 2, 3, 5}, claimedIDs(b.claim(t, 1, 10)))
}

func TestPauseAndResumeAreAuditedCompareAndSet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Exec(t, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, status, locked_by, claim_token, lease_until)
		VALUES ('chronicle', 'book', '1', 'upsert', 'processing', 'w1', 1, now() + interval '1 minute')`)

	res := b.setPaused(t, "chronicle", false)
	require.False(t, res.Changed, "resuming a projection never paused changes nothing")
	require.Equal(t, outbox.ProjectionState{Projection: "chronicle"}, res.State)

	res = b.setPaused(t, "chronicle", true)
	require.True(t, res.Changed)
	require.NotZero(t, res.AuditID)
	require.EqualValues(t, 1, res.InFlight, "the claimed row finishes")
	require.True(t, res.State.Paused)
	require.Equal(t, "alice", res.State.ChangedBy)
	require.Equal(t, "INC-7", res.State.Why)

	again := b.setPaused(t, "chronicle", true)
	require.False(t, again.Changed, "pausing a paused projection changes nothing")
	require.Equal(t, res.State, again.State)

	resumed := b.setPaused(t, "chronicle", false)
	require.True(t, resumed.Changed)
	require.False(t, resumed.State.Paused)

	rows, err := b.Pool.Query(ctx, `
		SELECT action, replayed_by, reason, selector, event_count, cardinality(event_ids)
		  FROM outbox_replay_audit ORDER BY id`)
	require.NoError(t, err)
	type audit struct {
		action, by, why string
		selector        map[string]string
		count, ids      int
	}
	var got []audit
	for rows.Next() {
		var a audit
		var sel []byte
		require.NoError(t, rows.Scan(&a.action, &a.by, &a.why, &sel, &a.count, &a.ids))
		require.NoError(t, json.Unmarshal(sel, &a.selector))
		got = append(got, a)
	}
	require.NoError(t, rows.Err())
	sel := map[string]string{"projection": "chronicle"}
	require.Equal(t, []audit{{"pause", "alice", "INC-7", sel, 0, 0}, {"resume", "alice", "INC-7", sel, 0, 0}}, got,
		"one audit row per change, none for the no-ops")

	states, err := outbox.ProjectionStates(ctx, b.Pool)
	require.NoError(t, err)
	require.Len(t, states, 1)
	require.False(t, states[0].Paused)
}

func TestPauseRequiresByAndWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for field, req := range map[string]outbox.PauseRequest{
		"By":         {Projection: "search", Paused: true, Why: "x", Known: known},
		"Why":        {Projection: "search", Paused: true, By: "alice", Why: "  ", Known: known},
		"Projection": {Paused: true, By: "alice", Why: "x", Known: known},
	} {
		_, err := outbox.SetPaused(context.Background(), b.Pool, req)
		var fe *bounds.FieldError
		require.ErrorAs(t, err, &fe, field)
		require.Equal(t, field, fe.Field)
	}
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_projection_state`))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
}

// A projection the binary does not know is refused, whatever its spelling
// (outbox names are case-sensitive): a typo must not pause nothing.
func TestPauseRefusesAnUnknownProjection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range []string{"timeline", "Search"} {
		_, err := outbox.SetPaused(context.Background(), b.Pool,
			outbox.PauseRequest{Projection: name, Paused: true, By: "alice", Why: "x", Known: known})
		var unknown *outbox.UnknownProjectionError
		require.ErrorAs(t, err, &unknown, name)
		require.EqualError(t, err, `unknown projection "`+name+`"; this wlproj knows chronicle, search; nothing changed`)
	}
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_projection_state`))
	require.Zero(t, b.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
}
