package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
)

func TestAuditLogFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Exec(t, `
		INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, replayed_at)
		SELECT CASE WHEN g <= 4 THEN 'replay' ELSE 'discard' END, CASE WHEN g % 2 = 0 THEN 'bob' ELSE 'alice' END,
		       'Ticket ' || g, '{}', 1, ARRAY[g::bigint, 100], now() - make_interval(hours => g)
		  FROM generate_series(1, 6) g`)
	for f, want := range map[outbox.AuditFilter][]int64{
		{}:                       {6, 5, 4, 3, 2, 1},
		{Action: "discard"}:      {6, 5},
		{By: "bob"}:              {6, 4, 2},
		{Text: "ticket 3"}:       {3},
		{EventID: 100, Limit: 2}: {6, 5},
		{EventID: 2}:             {2},
		{Before: 3}:              {2, 1},
		{Since: time.Now().Add(-150 * time.Minute)}: {2, 1},
		{Until: time.Now().Add(-330 * time.Minute)}: {6},
	} {
		got, err := outbox.AuditLog(context.Background(), b.Pool, f)
		require.NoError(t, err)
		var gotIDs []int64
		for _, a := range got {
			gotIDs = append(gotIDs, a.ID)
		}
		require.Equal(t, want, gotIDs, "%+v", f)
	}
	_, err := outbox.AuditLog(context.Background(), b.Pool, outbox.AuditFilter{Limit: -1})
	require.ErrorContains(t, err, "Limit")
}

// The auto-replay's budget reads only one actor's recent rows, through the
// audit table's index by actor and time, however long the trail.
func TestAuditedSinceUsesItsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Exec(t, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, replayed_at)
		VALUES ('replay', 'auto', 'x', '{}', 3, '{}', now()), ('replay', 'auto', 'x', '{}', 5, '{}', now() - interval '2 minutes'),
		       ('replay', 'alice', 'x', '{}', 7, '{}', now())`)
	n, err := outbox.AuditedSince(ctx, b.Pool, "auto", time.Minute)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	_, err = tx.Exec(ctx, `SET LOCAL enable_seqscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, `EXPLAIN `+outbox.AuditedSinceSQL, "auto", 60.0)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "outbox_replay_audit_by_time_idx")
}

// Every audit row records the actor of its context and the (projection,
// scope key) pairs of the events it took, and a scoped reader of the trail
// sees only the rows all of whose pairs its grants allow.
func TestAuditRecordsTheActorAndIsHeldToTheReadersScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var lib3, lib4 int64
	require.NoError(t, b.Pool.QueryRow(ctx, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, payload, scope_key)
		VALUES ('books', 'book', '1', 'upsert', '{}', 'library-3') RETURNING id`).Scan(&lib3))
	require.NoError(t, b.Pool.QueryRow(ctx, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, payload, scope_key)
		VALUES ('books', 'book', '2', 'upsert', '{}', 'library-4') RETURNING id`).Scan(&lib4))
	write := func(a outbox.Audit, who *policy.Actor) int64 {
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		id, _, err := outbox.WriteAudit(policy.With(ctx, who), tx, a)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return id
	}
	ada := &policy.Actor{User: "ada", Auth: policy.AuthOIDC, Via: policy.ViaConsole, RequestID: "REQ1", Roles: []string{"lib3"}}
	only3 := write(outbox.Audit{Action: "replay", By: "ada", Why: "t", EventIDs: []int64{lib3}, Count: 1}, ada)
	both := write(outbox.Audit{Action: "discard", By: "ada", Why: "t", EventIDs: []int64{lib3, lib4}, Count: 2}, ada)
	pause := write(outbox.Audit{Action: "pause", By: "ada", Why: "t", Projection: "books"}, policy.CLI("ada"))
	b.Exec(t, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids)
		VALUES ('replay', 'old', 'before 27', '{}', 1, ARRAY[$1::bigint])`, lib3)

	e, err := outbox.ReadAudit(ctx, b.Pool, only3)
	require.NoError(t, err)
	require.Equal(t, "REQ1", e.RequestID)
	require.JSONEq(t, `{"user":"ada","roles":["lib3"],"auth":"oidc","via":"console","request_id":"REQ1"}`, string(e.Actor))

	ids := func(allowed *policy.Allowed) []int64 {
		got, err := outbox.AuditLog(ctx, b.Pool, outbox.AuditFilter{Allowed: allowed})
		require.NoError(t, err)
		var out []int64
		for _, a := range got {
			if a.ID >= only3 {
				out = append(out, a.ID)
			}
		}
		return out
	}
	lib3Grants := policy.NewGrants(policy.Grant{Role: "lib3", Projections: []string{"books"}, Scopes: []string{"library-3"}})
	require.Equal(t, []int64{only3}, ids(lib3Grants.Allowed(policy.View)),
		"a row that also took library-4's event, a pause of the whole projection and a row of before 27 are not library-3's")
	require.Equal(t, []int64{pause + 1, pause, both, only3}, ids(nil))
	everyScope := policy.NewGrants(policy.Grant{Role: "books", Projections: []string{"books"}, Scopes: []string{"*"}})
	require.Equal(t, []int64{pause, both, only3}, ids(everyScope.Allowed(policy.View)))
	require.Empty(t, ids(policy.NewGrants().Allowed(policy.View)))
}
