package harness

import (
	"context"
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
