package harness

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Holder is a session of a test's that holds back the vacuum horizon of its
// database, as a forgotten session of an application would.
type Holder struct {
	// PID is its backend.
	PID  int32
	conn *pgx.Conn
	once sync.Once
}

// HoldSnapshot opens a session named application on dbURL, idle in a
// REPEATABLE READ transaction that has run a query: its snapshot, and with
// it the database's horizon, stays until Release or the end of the test.
func HoldSnapshot(t testing.TB, dbURL, application string) *Holder {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	h := &Holder{conn: conn, PID: int32(conn.PgConn().PID())}
	t.Cleanup(h.Release)
	_, err = conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT count(*) FROM pg_class`)
	require.NoError(t, err)
	return h
}

// Release ends the transaction and the session; a second call does nothing.
func (h *Holder) Release() {
	h.once.Do(func() { _ = h.conn.Close(context.Background()) })
}

// PrepareTransaction leaves a prepared transaction gid, with a transaction
// id of its own, in db's database, as a two-phase commit coordinator that
// died between PREPARE and COMMIT would; it is rolled back when the test
// ends. It fails, not skips, on a server with max_prepared_transactions = 0
// (scripts/stack.sh starts Postgres with more).
func PrepareTransaction(t testing.TB, db DB, gid string) {
	t.Helper()
	ctx := context.Background()
	require.Positive(t, db.Int(t, `SELECT current_setting('max_prepared_transactions')::int`),
		"max_prepared_transactions is 0 on the test server: start it with scripts/stack.sh")
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, stmt := range []string{`BEGIN`, `SELECT txid_current()`, `PREPARE TRANSACTION ` + quoteLiteral(gid)} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `ROLLBACK PREPARED `+quoteLiteral(gid))
	})
}

// quoteLiteral quotes s as an SQL string literal: PREPARE TRANSACTION and
// ROLLBACK PREPARED take no parameters.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
