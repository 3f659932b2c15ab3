package tcpproxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
)

// echoServer echoes every connection and counts the ones it accepted.
type echoServer struct {
	ln       net.Listener
	accepted atomic.Int64
	conns    chan net.Conn
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &echoServer{ln: ln, conns: make(chan net.Conn, 16)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.conns <- c
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	return s
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func readN(t *testing.T, c net.Conn, n int, within time.Duration) (string, error) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

// requireSilent asserts that c neither receives bytes nor is closed or reset
// for a while: what a partition looks like from either end.
func requireSilent(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := readN(t, c, 1, 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "want silence, not data, EOF or reset")
}

func TestBlackholeHoldsBytesAndCloses(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	p := tcpproxy.Start(t, echo.ln.Addr().String())

	c := dial(t, p.Addr())
	_, err := c.Write([]byte("a"))
	require.NoError(t, err)
	got, err := readN(t, c, 1, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "a", got)
	server := <-echo.conns

	p.Blackhole()
	_, err = c.Write([]byte("b"))
	require.NoError(t, err)
	requireSilent(t, c)

	// A new connection is accepted by the proxy but never reaches the server.
	c2 := dial(t, p.Addr())
	_, err = c2.Write([]byte("c"))
	require.NoError(t, err)
	requireSilent(t, c2)
	require.EqualValues(t, 1, echo.accepted.Load())

	p.Restore()
	got, err = readN(t, c, 1, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "b", got, "bytes sent during the blackhole arrive after it")
	got, err = readN(t, c2, 1, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "c", got)
	require.EqualValues(t, 2, echo.accepted.Load())

	// A close during the blackhole reaches the server only after Restore.
	p.Blackhole()
	require.NoError(t, c.Close())
	requireSilent(t, server)
	p.Restore()
	_, err = readN(t, server, 1, 2*time.Second)
	require.ErrorIs(t, err, io.EOF)
}

func TestCloseAllAndClose(t *testing.T) {
	t.Parallel()
	echo := startEcho(t)
	p, err := tcpproxy.New(echo.ln.Addr().String())
	require.NoError(t, err)

	c := dial(t, p.Addr())
	_, err = c.Write([]byte("a"))
	require.NoError(t, err)
	_, err = readN(t, c, 1, 2*time.Second)
	require.NoError(t, err)

	p.CloseAll()
	_, err = readN(t, c, 1, 2*time.Second)
	require.ErrorIs(t, err, io.EOF)

	c2 := dial(t, p.Addr())
	_, err = c2.Write([]byte("z"))
	require.NoError(t, err)
	got, err := readN(t, c2, 1, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "z", got)

	// Close must not hang on a blackholed connection.
	p.Blackhole()
	require.NoError(t, p.Close())
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.Error(t, err)
}

type pgBundle struct {
	proxy   *tcpproxy.Proxy
	db      harness.DB
	proxied string // the database URL through the proxy
}

func setupPG(t *testing.T) pgBundle {
	t.Helper()
	db := harness.NewEmptyDatabase(t)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	p := tcpproxy.Start(t, u.Host)
	u.Host = p.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return pgBundle{proxy: p, db: db, proxied: u.String()}
}

func connect(t *testing.T, dsn string) (*pgx.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
	}
	return conn, err
}

// connectOK connects through the proxy and checks that the session answers.
func connectOK(t *testing.T, b pgBundle) *pgx.Conn {
	t.Helper()
	conn, err := connect(t, b.proxied)
	require.NoError(t, err)
	require.NoError(t, selectOne(conn, 5*time.Second))
	return conn
}

func selectOne(conn *pgx.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return err
	}
	if one != 1 {
		return errors.New("SELECT 1 did not return 1")
	}
	return nil
}

func backendAlive(t *testing.T, b pgBundle, pid uint32) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n))
	return n == 1
}

func TestPostgresBlackhole(t *testing.T) {
	t.Parallel()
	b := setupPG(t)

	conn := connectOK(t, b)
	pid := conn.PgConn().PID()

	b.proxy.Blackhole()
	start := time.Now()
	err := selectOne(conn, time.Second)
	require.Error(t, err)
	require.Less(t, time.Since(start), 3*time.Second, "the query must fail by its own timeout")

	// Nothing reached the server: its session is still there.
	time.Sleep(300 * time.Millisecond)
	require.True(t, backendAlive(t, b, pid), "the server saw the client go")

	_, err = connect(t, b.proxied)
	require.Error(t, err, "a new connection must not get through a blackhole")

	b.proxy.Restore()
	connectOK(t, b)

	// The old client's close, held during the blackhole, now ends its session.
	harness.Eventually(t, 5*time.Second, "old backend to exit", func() bool { return !backendAlive(t, b, pid) })
}

func TestPostgresDropUpstreamReleasesLock(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	ctx := context.Background()
	const key = 4242

	conn := connectOK(t, b)
	_, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	pid := conn.PgConn().PID()

	b.proxy.Blackhole()
	b.proxy.DropUpstream()
	harness.Eventually(t, 5*time.Second, "backend to exit after DropUpstream", func() bool { return !backendAlive(t, b, pid) })
	var got bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got))
	require.True(t, got, "the dropped session still holds its advisory lock")

	// The client learns of it only once the path is open again.
	b.proxy.Restore()
	require.Error(t, selectOne(conn, 2*time.Second))
}

func TestPostgresCloseAll(t *testing.T) {
	t.Parallel()
	b := setupPG(t)

	conn := connectOK(t, b)
	b.proxy.CloseAll()
	require.Error(t, selectOne(conn, 2*time.Second))
	connectOK(t, b)
}

// Refuse is a stopped server: the open session fails at once, and so does
// every new connection, quickly rather than by a timeout, until Restore.
func TestPostgresRefuse(t *testing.T) {
	t.Parallel()
	b := setupPG(t)

	conn := connectOK(t, b)
	b.proxy.Refuse()
	start := time.Now()
	require.Error(t, selectOne(conn, 5*time.Second))
	_, err := connect(t, b.proxied)
	require.Error(t, err, "a new connection must not get through while refusing")
	require.Less(t, time.Since(start), time.Second, "refused at once, not timed out")

	b.proxy.Restore()
	connectOK(t, b)
}
