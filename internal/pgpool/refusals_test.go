package pgpool

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// lagging is a database on a fresh pair that the primary has committed and
// the standby has flushed (synchronous_commit=on) but not applied: replay
// is paused, as on a standby that is behind. It returns URLs of the
// database naming the standby first.
func lagging(t *testing.T) (pair *harness.PGPair, standbyFirst string) {
	t.Helper()
	pair = harness.StartPGPair(t)
	ctx := context.Background()
	standby, err := pgx.Connect(ctx, pair.URL([]string{pair.Standby.Addr()}))
	require.NoError(t, err)
	defer standby.Close(ctx)
	_, err = standby.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	primary, err := pgx.Connect(ctx, pair.URL([]string{pair.Primary.Addr()}))
	require.NoError(t, err)
	defer primary.Close(ctx)
	name := harness.UniqueName("wlproj_t_")
	_, err = primary.Exec(ctx, `SET synchronous_commit = on`)
	require.NoError(t, err)
	_, err = primary.Exec(ctx, `CREATE DATABASE `+name)
	require.NoError(t, err)
	url := pair.URL([]string{pair.Standby.Addr(), pair.Primary.Addr()}, "target_session_attrs=read-write")
	return pair, strings.Replace(url, "/postgres?", "/"+name+"?", 1)
}

// serverPort is the port of the server conn reached.
func serverPort(t *testing.T, conn interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var port int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT inet_server_port()`).Scan(&port))
	return port
}

// requireConnsOn opens n connections of pool at once and requires each to
// have reached the server at port.
func requireConnsOn(t *testing.T, pool *pgxpool.Pool, n, port int) {
	t.Helper()
	for range n {
		conn, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		defer conn.Release()
		require.Equal(t, port, serverPort(t, conn))
	}
}

// A standby listed first that has not applied the database yet answers
// 3D000, with which pgx (like libpq) stops instead of trying the next host.
// Connect goes on to the primary.
func TestConnectGoesPastAStandbyWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	pair, url := lagging(t)
	ctx := context.Background()
	_, err := pgx.Connect(ctx, url)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "pgx alone")
	require.Equal(t, "3D000", pe.Code)

	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	conn, err := Connect(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, pair.Primary.Port, serverPort(t, conn))
}

// The pool's connections go past such a standby too.
func TestOpenGoesPastAStandbyWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	pair, url := lagging(t)
	ctx := context.Background()
	pool, err := Open(ctx, url, 3, "test")
	require.NoError(t, err)
	defer pool.Close()
	requireConnsOn(t, pool, 3, pair.Primary.Port)
}

// TestArrangeTriesRefusingHostsLast: a host that refused a session lately
// moves behind the others, never out; sslmode=prefer's two tries of a host
// stay together, and a refusal older than refusalMemory moves nothing.
func TestArrangeTriesRefusingHostsLast(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.ParseConfig("postgres://u@arrange-a:1,arrange-b:2,arrange-c:3/db?sslmode=prefer&target_session_attrs=read-write")
	require.NoError(t, err)
	order := func() []string {
		var out []string
		for _, e := range chainOf(cfg) {
			out = append(out, hostPort(e))
		}
		return out
	}
	require.Equal(t, []string{"arrange-a:1", "arrange-a:1", "arrange-b:2", "arrange-b:2", "arrange-c:3", "arrange-c:3"}, order())

	hosts.mu.Lock()
	hosts.refused["arrange-a:1"] = time.Now().Add(-2 * refusalMemory)
	hosts.refused["arrange-b:2"] = time.Now()
	hosts.mu.Unlock()
	arrange(cfg)
	require.Equal(t, []string{"arrange-a:1", "arrange-a:1", "arrange-c:3", "arrange-c:3", "arrange-b:2", "arrange-b:2"}, order())
	require.Equal(t, []string{"arrange-a:1", "arrange-c:3", "arrange-b:2"}, Hosts(cfg))

	require.True(t, after(cfg, "arrange-a:1"))
	require.Equal(t, []string{"arrange-c:3", "arrange-b:2"}, Hosts(cfg))
	require.False(t, after(cfg, "arrange-b:2"), "nothing after the last host")
	only(cfg, "arrange-b:2")
	require.Equal(t, []string{"arrange-b:2", "arrange-b:2"}, order())
}
