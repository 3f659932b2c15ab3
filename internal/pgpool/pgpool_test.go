package pgpool

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
)

func TestOpenRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), "postgres://u@127.0.0.1:1,127.0.0.1:2/db?connect_timeout=1", 2, "test")
	var urlErr *URLError
	require.ErrorAs(t, err, &urlErr)
	require.ErrorContains(t, err, "DatabaseURL names 2 hosts (127.0.0.1:1, 127.0.0.1:2) but not target_session_attrs=read-write")
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
	requireConnsOn(t, pool, 3, pair.Primary.Port)

	conn, err := pgx.Connect(ctx, pair.URL(hosts))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var inRecovery bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery, "without target_session_attrs the first host that answers is the standby")
}

// A first host that accepts the TCP connection and never answers (a
// partition, a frozen server) costs each new connection the connect
// timeout, 5 s, not the whole wait: the pool goes on to the next host.
func TestOpenGivesUpOnAHostThatNeverAnswers(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	silent := tcpproxy.Start(t, u.Host)
	silent.Blackhole()
	u.Host = silent.Addr() + "," + u.Host
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	q.Del("connect_timeout")
	u.RawQuery = q.Encode()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := Open(ctx, u.String(), 1, "test")
	require.NoError(t, err)
	defer pool.Close()
	start := time.Now()
	var one int
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(&one), "the second host, after the first timed out")
	require.Less(t, time.Since(start), 10*time.Second)
}

// wlproj's sessions, the pool's and the CLI's, run with JIT off (their
// short statements compiled for seconds when an estimate crossed
// jit_above_cost); a URL that sets jit keeps its own.
func TestSessionsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := harness.NewDatabase(t)
	jit := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var v string
		require.NoError(t, q.QueryRow(ctx, `SHOW jit`).Scan(&v))
		return v
	}
	pool, err := Open(ctx, db.URL, 1, "test")
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "off", jit(pool))

	cfg, err := ParseURL(db.URL)
	require.NoError(t, err)
	conn, err := Connect(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, "off", jit(conn))

	sep := "?"
	if u, _ := url.Parse(db.URL); u.RawQuery != "" {
		sep = "&"
	}
	own, err := Open(ctx, db.URL+sep+"jit=on", 1, "test")
	require.NoError(t, err)
	defer own.Close()
	require.Equal(t, "on", jit(own), "the URL's own setting")
}
