package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
	"github.com/wlproj/wlproj/outbox"
)

func TestUpTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()

	first, err := migrations.Up(ctx, db.URL, migrations.Expect{Database: db.Name})
	require.NoError(t, err)
	require.NotEmpty(t, first.Applied)

	second, err := migrations.Up(ctx, db.URL, migrations.Expect{Database: db.Name})
	require.NoError(t, err)
	require.Empty(t, second.Applied, "second run must apply nothing")
	require.Equal(t, first.Current, second.Current)
}

func TestUpRefusesWrongDatabase(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()

	for _, want := range []migrations.Expect{
		{Database: "production"},
		{Database: db.Name, Port: 1},
		{Database: db.Name, Host: "db.example.internal"},
	} {
		_, err := migrations.Up(ctx, db.URL, want)
		var wrong *migrations.ErrWrongDatabase
		require.True(t, errors.As(err, &wrong), "expected ErrWrongDatabase for %+v, got %v", want, err)
		require.Equal(t, db.Name, wrong.Found.Database)
		require.Contains(t, err.Error(), "nothing was changed")
	}

	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables))
	require.Zero(t, tables, "a refused migration must create nothing")
}

func TestProducerInsert(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()

	var (
		id                 int64
		status, projection string
		attempts           int
		history            string
	)
	err := db.Pool.QueryRow(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		VALUES ('book', '42', 'upsert', 3, '{"title":"Dune"}', 'library-7')
		RETURNING id, status, projection, attempts, error_history::text`).Scan(&id, &status, &projection, &attempts, &history)
	require.NoError(t, err)
	require.Equal(t, "queued", status, "read by position, never updated when it succeeds (00018)")
	require.Equal(t, "search", projection)
	require.Zero(t, attempts)
	require.Equal(t, "[]", history)

	// The minimal producer row: no version, payload or scope.
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('block', '9', 'delete')`)
	require.NoError(t, err)
}

func TestInsertRejectsUnknownOp(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	_, err := db.Pool.Exec(context.Background(),
		`INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'merge')`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "expected a Postgres error, got %v", err)
	require.Equal(t, "23514", pgErr.Code, "check_violation")
	require.Equal(t, "outbox_events_op_check", pgErr.ConstraintName)
}

func TestInsertNotifies(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN outbox_events")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', '1', 'upsert')`)
	require.NoError(t, err)
	n, err := conn.Conn().WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.NotifyChannel, n.Channel)
}

func TestAppendErrorKeepsNewest(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	var got string
	err := db.Pool.QueryRow(context.Background(), `
		SELECT outbox_append_error(outbox_append_error(outbox_append_error('[]', '1', 2), '2', 2), '3', 2)::text`).Scan(&got)
	require.NoError(t, err)
	require.Equal(t, "[2, 3]", got)
}

// Behind a URL of several hosts the guard compares the host the migration
// reached, not the first one named (a host that may be down). (`wlproj
// migrate` refuses a list without target_session_attrs=read-write first.)
func TestUpGuardsTheHostReachedOfSeveral(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	closed := harness.Port(t)
	u.Host = fmt.Sprintf("localhost:%d,127.0.0.1:%s", closed, u.Port())
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	_, err = migrations.Up(ctx, u.String(), migrations.Expect{Database: db.Name, Host: "localhost"})
	var wrong *migrations.ErrWrongDatabase
	require.True(t, errors.As(err, &wrong), "the first host named is not the one reached: %v", err)
	require.Equal(t, "127.0.0.1", wrong.Found.Host)

	res, err := migrations.Up(ctx, u.String(), migrations.Expect{Database: db.Name, Host: "127.0.0.1"})
	require.NoError(t, err)
	require.NotEmpty(t, res.Applied)
}

// The switch to queued rows waits for a binary that reads them. On an
// upgrade from a release before 17 (schema 16), new rows stay pending, the
// only rows that release claims, through wlproj migrate to head and until
// a leader of 19 or newer takes the ledger; only then are they queued. A
// database migrated from nothing has no older binary: queued at once.
func TestNewRowsQueuedOnceABinaryThatReadsThemLeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	insert := func(db harness.DB, id string) string {
		db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', $1, 'upsert')`, id)
		return harness.Column[string](t, db, `SELECT status FROM outbox_events WHERE entity_id = $1`, id)[0]
	}
	upgraded := harness.NewEmptyDatabase(t)
	want := migrations.Expect{Database: upgraded.Name}
	_, err := migrations.Run(ctx, upgraded.URL, want, migrations.Config{UpTo: 16}, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, "pending", insert(upgraded, "on-16"))
	res, err := migrations.Up(ctx, upgraded.URL, want)
	require.NoError(t, err)
	require.Equal(t, int64(16), res.From)
	require.Equal(t, "pending", insert(upgraded, "on-head"), "the previous release's leader still claims every new row")
	store := &outbox.Store{Pool: upgraded.Pool}
	_, _, err = store.LoadQueue(ctx)
	require.NoError(t, err, "what a leader of this binary does before it reads a queued row")
	require.Equal(t, "queued", insert(upgraded, "after-lead"))

	fresh := harness.NewEmptyDatabase(t)
	res, err = migrations.Up(ctx, fresh.URL, migrations.Expect{Database: fresh.Name})
	require.NoError(t, err)
	require.Zero(t, res.From)
	require.Equal(t, "queued", insert(fresh, "first"))
}
