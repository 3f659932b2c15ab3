package projection

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestWriteLifetimeFitsTheDefaultGCDeletes(t *testing.T) {
	t.Parallel()
	gcDefault, err := parseTimeValue(gcDeletesDefault)
	require.NoError(t, err)
	require.Equal(t, 50*time.Second, WriteLifetime(0))
	require.Equal(t, WriteLifetime(TimeoutDefault), WriteLifetime(0))
	require.Less(t, WriteLifetime(0), gcDefault, "a default install would warn")
	require.Equal(t, 10*time.Minute+200*time.Second+TCPUserTimeout, WriteLifetime(TimeoutRange.Max))
}

// TestEngineConnectionsBoundWrites reads the socket options of the
// client's own connection, found by its address among the process's file
// descriptors, while it talks to the real engine through a local server.
func TestEngineConnectionsBoundWrites(t *testing.T) {
	t.Parallel()
	target, err := url.Parse(harness.ElasticURL(t))
	require.NoError(t, err)
	var mu sync.Mutex
	var clients []string
	srv := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			clients = append(clients, c.RemoteAddr().String())
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	client, err := NewElasticClient(ElasticOptions{URL: srv.URL})
	require.NoError(t, err)
	_, err = Identify(context.Background(), client)
	require.NoError(t, err)
	mu.Lock()
	require.Len(t, clients, 1)
	local := clients[0]
	mu.Unlock()

	// The connection stays open, idle in the client's pool.
	fd := socketFD(t, local, srv.Listener.Addr().String())
	userTimeout, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	require.NoError(t, err)
	require.Equal(t, int(TCPUserTimeout/time.Millisecond), userTimeout, "TCP_USER_TIMEOUT in ms")
	linger, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER)
	require.NoError(t, err)
	require.Equal(t, unix.Linger{Onoff: 1, Linger: 0}, *linger, "SO_LINGER")
}

// socketFD finds the process's TCP socket from local to peer.
func socketFD(t *testing.T, local, peer string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		sa, err := unix.Getsockname(fd)
		if err != nil || sockaddrString(sa) != local {
			continue
		}
		if pa, err := unix.Getpeername(fd); err == nil && sockaddrString(pa) == peer {
			return fd
		}
	}
	t.Fatalf("no socket from %s to %s in /proc/self/fd", local, peer)
	return -1
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	}
	return ""
}

// holdProxy forwards TCP to the engine until hold is set; from then on it
// keeps what clients send, as a network holding their packets would, and
// reports how a held client's side of the connection ended.
type holdProxy struct {
	ln     net.Listener
	target string
	hold   atomic.Bool
	mu     sync.Mutex
	held   []byte
	ended  chan error
}

func startHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdProxy{ln: ln, target: target, ended: make(chan error, 8)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(conn)
		}
	}()
	return p
}

func (p *holdProxy) serve(conn net.Conn) {
	defer conn.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	go func() { _, _ = io.Copy(conn, up) }()
	buf := make([]byte, 32<<10)
	held := false
	for {
		n, err := conn.Read(buf)
		if n > 0 && p.hold.Load() {
			p.mu.Lock()
			p.held = append(p.held, buf[:n]...)
			p.mu.Unlock()
			held = true
		} else if n > 0 {
			if _, err := up.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			if held {
				p.ended <- err
			}
			return
		}
	}
}

func (p *holdProxy) heldBytes() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.held)
}

// TestStalledBulkIsAbandonedWithAReset: a bulk the network holds ends at
// its deadline as a transient failure, and the client resets the
// connection, so that its kernel never delivers the held bytes later.
func TestStalledBulkIsAbandonedWithAReset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(b.base)
	require.NoError(t, err)
	proxy := startHoldProxy(t, u.Host)
	const timeout = time.Second
	s := b.searchAt(t, ElasticOptions{URL: "http://" + proxy.ln.Addr().String(), Timeout: timeout}, 0)

	// Through the proxy to the engine, server-side timeout and all.
	res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireApplied(t, res[1])
	b.requireDoc(t, "book:1", 1, "Dune")

	proxy.hold.Store(true)
	start := time.Now()
	res = handle(t, s, upsert(2, "book", "1", v(2), book("Dune Messiah")))
	took := time.Since(start)
	requireFailed(t, res[2], classify.Transient, classify.Timeout)
	deadline, server := bulkTimeouts(timeout)
	require.Less(t, took, deadline+time.Second, "the bulk outlived its deadline")

	select {
	case err := <-proxy.ended:
		require.True(t, errors.Is(err, syscall.ECONNRESET), "the held connection ended with %v, not a reset", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the client kept the stalled connection open")
	}
	line, _, _ := strings.Cut(proxy.heldBytes(), "\r\n")
	require.Contains(t, line, "/_bulk?")
	require.Contains(t, line, "timeout="+strconv.FormatInt(server.Milliseconds(), 10)+"ms", "the engine gets no server-side timeout")
	b.requireDoc(t, "book:1", 1, "Dune")
}

func TestCheckGCDeletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	probe := NewEngineProbe(b.client, b.base)
	ctx := context.Background()
	lifetime := WriteLifetime(0)

	found, err := probe.CheckGCDeletes(ctx, b.index, lifetime)
	require.NoError(t, err)
	require.Equal(t, []GCDeletes{{Index: b.index, Setting: "60s", Value: time.Minute}}, found, "a default index")

	require.NoError(t, harness.ES(ctx, b.base, http.MethodPut, "/"+b.index+"/_settings", []byte(`{"index":{"gc_deletes":"5s"}}`), nil))
	alias := harness.NewIndexName(t)
	require.NoError(t, harness.ES(ctx, b.base, http.MethodPut, "/"+b.index+"/_alias/"+alias, nil, nil))
	for _, name := range []string{b.index, alias} {
		found, err = probe.CheckGCDeletes(ctx, name, lifetime)
		require.NoError(t, err)
		require.Len(t, found, 1, name)
		g := found[0]
		require.Equal(t, b.index, g.Index, "the concrete index behind %s", name)
		require.Equal(t, "5s", g.Setting)
		require.Equal(t, 5*time.Second, g.Value)
		require.True(t, g.Short, "gc_deletes of 5s against a write lifetime of %s", lifetime)
		require.Contains(t, g.Command, b.base+"/"+b.index+"/_settings")
		require.Contains(t, g.Command, `'{"index.gc_deletes":"1m"}'`)
	}

	// The command does what it says.
	out, err := exec.Command("sh", "-c", found[0].Command).CombinedOutput()
	require.NoError(t, err, "%s", out)
	found, err = probe.CheckGCDeletes(ctx, alias, lifetime)
	require.NoError(t, err)
	require.Equal(t, []GCDeletes{{Index: b.index, Setting: "1m", Value: time.Minute}}, found)

	// A longer write lifetime (ELASTIC_TIMEOUT_SECONDS at its maximum) wants
	// more than the default.
	found, err = probe.CheckGCDeletes(ctx, b.index, WriteLifetime(TimeoutRange.Max))
	require.NoError(t, err)
	require.True(t, found[0].Short)
	require.Contains(t, found[0].Command, `"index.gc_deletes":"14m"`)

	found, err = probe.CheckGCDeletes(ctx, harness.NewIndexName(t), lifetime)
	require.NoError(t, err)
	require.Empty(t, found, "an index not created yet")
}

func TestParseTimeValue(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{
		"60s": time.Minute, "500ms": 500 * time.Millisecond, "1m": time.Minute, "2h": 2 * time.Hour,
		"1d": 24 * time.Hour, "100micros": 100 * time.Microsecond, "7nanos": 7, "-1": 0, "0s": 0,
	} {
		got, err := parseTimeValue(v)
		require.NoError(t, err, v)
		require.Equal(t, want, got, v)
	}
	for _, v := range []string{"", "60", "s", "1 fortnight"} {
		_, err := parseTimeValue(v)
		require.Error(t, err, v)
	}
}

// TestNewElasticClientAPIKey sends each kind of request the daemon makes
// (identify, health, bulk) to the real engine through a server that records
// the Authorization header: the key goes with every one, in the ApiKey
// scheme, whichever of its two forms was configured.
func TestNewElasticClientAPIKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id, secret = "VuaCfGcBCdbkQm-e5aOx", "ui2lp2axTNmsyakw9tvNnw"
	encoded := base64.StdEncoding.EncodeToString([]byte(id + ":" + secret))
	var mu sync.Mutex
	var auths []string
	f := newFront(t, b.base, func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		// The engine under test may run without security.
		r.Header.Del("Authorization")
		return false
	})
	for i, key := range []string{id + ":" + secret, encoded, " " + encoded + "\n", strings.TrimRight(encoded, "=")} {
		o := ElasticOptions{URL: f.URL, APIKey: key}
		require.NoError(t, o.ValidateAuth())
		client, err := NewElasticClient(o)
		require.NoError(t, err)
		_, err = Identify(context.Background(), client)
		require.NoError(t, err)
		require.NoError(t, NewEngineProbe(client, f.URL).Ping(context.Background()))
		s, err := NewSearch(SearchConfig{Client: client, Index: b.index})
		require.NoError(t, err)
		requireApplied(t, handle(t, s, upsert(int64(i+1), "book", "k", v(int64(i+1)), book("Dune")))[int64(i+1)])
	}
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(auths), 4*3)
	for _, a := range auths {
		require.Equal(t, "ApiKey "+encoded, a)
	}
}

func TestNewElasticClientRefusesBadAPIKeys(t *testing.T) {
	t.Parallel()
	const secret = "Zm9vYmFyc2VjcmV0"
	for _, key := range []string{secret, secret + "!", ":" + secret, secret + ":", "id:" + secret + " x",
		base64.StdEncoding.EncodeToString([]byte(secret)), base64.StdEncoding.EncodeToString([]byte("id:\x00" + secret))} {
		o := ElasticOptions{URL: "http://127.0.0.1:9200", APIKey: key}
		err := o.ValidateAuth()
		require.ErrorContains(t, err, "APIKey must be the id:key pair or its base64 form", "%q", key)
		require.NotContains(t, err.Error(), secret)
		_, err = NewElasticClient(o)
		require.ErrorContains(t, err, "APIKey must be", "%q", key)
		require.NotContains(t, err.Error(), secret)
	}

	for _, o := range []ElasticOptions{{Username: "elastic"}, {Password: "pw"}, {Username: "elastic", Password: "pw"}} {
		o.URL, o.APIKey = "http://127.0.0.1:9200", "id:"+secret
		err := o.ValidateAuth()
		require.EqualError(t, err, "APIKey cannot be used with Username or Password: use one way to authenticate")
		_, err = NewElasticClient(o)
		require.EqualError(t, err, "APIKey cannot be used with Username or Password: use one way to authenticate")
	}
	_, err := NewElasticClient(ElasticOptions{URL: "http://elastic:pw@127.0.0.1:9200", APIKey: "id:" + secret})
	require.EqualError(t, err, "APIKey cannot be used with URL: a user in the URL is basic auth; use one way to authenticate")
	require.NoError(t, ElasticOptions{URL: "http://127.0.0.1:9200"}.ValidateAuth(), "no credentials at all")
}
