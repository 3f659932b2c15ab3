package migrations_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// 00023: rows a producer queued with a null xid before it (never read by
// any position) become pending, which the claim sends; rows with an xid
// stay queued; and the cluster the positions belong to is recorded.
func TestQueueHomeMigrationSendsRowsQueuedWithoutXid(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()
	expect := migrations.Expect{Database: db.Name}
	_, err := migrations.Run(ctx, db.URL, expect, migrations.Config{UpTo: 22}, zerolog.Nop())
	require.NoError(t, err)
	db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, xid) VALUES ('book', 'lost', 'upsert', NULL)`)
	db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'fine', 'upsert')`)

	_, err = migrations.Up(ctx, db.URL, expect)
	require.NoError(t, err)
	require.Equal(t, []string{"pending"}, harness.Column[string](t, db, `SELECT status FROM outbox_events WHERE entity_id = 'lost'`))
	require.Equal(t, []string{"queued"}, harness.Column[string](t, db, `SELECT status FROM outbox_events WHERE entity_id = 'fine'`))
	require.Equal(t, 1, db.Int(t, `SELECT count(*)::int FROM outbox_queue_home h, pg_control_system() s
	                                WHERE h.system_identifier = s.system_identifier`))
}
