package pgpool

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestOpenRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), "postgres://u@127.0.0.1:1,127.0.0.1:2/db?connect_timeout=1", 2, "test")
	var urlErr *URLError
	require.ErrorAs(t, err, &urlErr)
	require.ErrorContains(t, err, "DATABASE_URL: names 2 hosts (127.0.0.1:1, 127.0.0.1:2) but not target_session_attrs=read-write")
}

// With target_session_attrs=read-write every connection of the pool skips a
// closed port and a standby listed before the primary; without it, the
// same list lands on the standby (which is what Open refuses).
func TestOpenFollowsTargetSessionAttrs(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	closed, err := harness.FreePort()
	require.NoError(t, err)
	hosts := []string{"127.0.0.1:" + strconv.Itoa(closed), pair.Standby.Addr(), pair.Primary.Addr()}
	ctx := context.Background()

	pool, err := Open(ctx, pair.URL(hosts, "target_session_attrs=read-write"), 3, "test")
	require.NoError(t, err)
	defer pool.Close()
	for range 3 {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		var inRecovery bool
		var port int
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), inet_server_port()`).Scan(&inRecovery, &port))
		require.False(t, inRecovery)
		require.Equal(t, pair.Primary.Port, port)
	}

	conn, err := pgx.Connect(ctx, pair.URL(hosts))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery, "without target_session_attrs the first host that answers is the standby")
}
