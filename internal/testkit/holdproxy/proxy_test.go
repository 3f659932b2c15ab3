package holdproxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/holdproxy"
)

// received is what the server read on one connection, and how it ended.
type received struct {
	data string
	err  error // nil for a clean end
}

// server answers "ok" to every chunk it reads and reports, per connection,
// everything it read once the connection ends.
type server struct {
	ln       net.Listener
	accepted atomic.Int64
	ended    chan received
}

func startServer(t *testing.T) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &server{ln: ln, ended: make(chan received, 16)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			go func() {
				defer c.Close()
				var got []byte
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						got = append(got, buf[:n]...)
						_, _ = c.Write([]byte("ok"))
					}
					if err != nil {
						if errors.Is(err, io.EOF) {
							err = nil
						}
						s.ended <- received{string(got), err}
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *server) next(t *testing.T) received {
	t.Helper()
	select {
	case r := <-s.ended:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the server's connection did not end")
		return received{}
	}
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_, err := c.Write([]byte(s))
	require.NoError(t, err)
}

func readN(c net.Conn, n int, within time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(within))
	buf := make([]byte, n)
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

// waitHeld waits until the proxy holds want from one client that has
// ended as end.
func waitHeld(t *testing.T, p *holdproxy.Proxy, want string, end holdproxy.End) {
	t.Helper()
	require.Eventually(t, func() bool {
		h := p.Held()
		return len(h) == 1 && string(h[0].Bytes) == want && h[0].End == end
	}, 5*time.Second, 10*time.Millisecond, "held: %v", p.Held())
}

// An open client's held bytes reach the server only at Release, and the
// server's answers to what got through before the hold are not held.
func TestHoldDeliversAnOpenClientsBytesAtRelease(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	p := holdproxy.Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr())
	send(t, c, "a")
	got, err := readN(c, 2, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok", got)

	p.Hold()
	send(t, c, "bc")
	waitHeld(t, p, "bc", holdproxy.Open)
	_, err = readN(c, 1, 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "the server answered bytes that were held")

	require.Equal(t, holdproxy.Released{Delivered: 1, DeliveredBytes: 2}, p.Release())
	got, err = readN(c, 2, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok", got)
	require.Empty(t, p.Held())
	require.NoError(t, c.Close())
	require.Equal(t, received{data: "abc"}, s.next(t))
}

// A client that closed cleanly during the hold still has its bytes
// delivered, then its FIN: its kernel would have kept retransmitting them.
func TestHoldDeliversAfterACleanClose(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	p := holdproxy.Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr())
	send(t, c, "a")
	_, err := readN(c, 2, 2*time.Second)
	require.NoError(t, err)

	p.Hold()
	send(t, c, "bc")
	require.NoError(t, c.Close())
	waitHeld(t, p, "bc", holdproxy.Closed)
	select {
	case r := <-s.ended:
		t.Fatalf("the server saw the close during the hold: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}

	require.Equal(t, holdproxy.Released{Delivered: 1, DeliveredBytes: 2}, p.Release())
	require.Equal(t, received{data: "abc"}, s.next(t))
}

// A client reset during the hold (SO_LINGER 0, or killed with it set) has
// its held bytes dropped, and the server side is reset: what got through
// before the hold is all the server ever reads.
func TestHoldDropsAfterAReset(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	p := holdproxy.Start(t, s.ln.Addr().String())
	c := dial(t, p.Addr())
	send(t, c, "a")
	_, err := readN(c, 2, 2*time.Second)
	require.NoError(t, err)

	p.Hold()
	send(t, c, "bc")
	waitHeld(t, p, "bc", holdproxy.Open)
	require.NoError(t, c.SetLinger(0))
	require.NoError(t, c.Close())
	waitHeld(t, p, "bc", holdproxy.Reset)

	require.Equal(t, holdproxy.Released{Dropped: 1, DroppedBytes: 2}, p.Release())
	r := s.next(t)
	require.Equal(t, "a", r.data)
	require.Error(t, r.err, "want a reset, not a clean close")
}

// A connection opened during the hold reaches the server only at Release;
// reset before it, it never reaches the server at all.
func TestHoldHoldsNewConnections(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	p := holdproxy.Start(t, s.ln.Addr().String())
	p.Hold()
	kept, dropped := dial(t, p.Addr()), dial(t, p.Addr())
	send(t, kept, "kept")
	send(t, dropped, "dropped")
	require.NoError(t, dropped.SetLinger(0))
	require.NoError(t, dropped.Close())
	require.Eventually(t, func() bool {
		ends := map[holdproxy.End]string{}
		for _, h := range p.Held() {
			ends[h.End] = string(h.Bytes)
		}
		return ends[holdproxy.Open] == "kept" && ends[holdproxy.Reset] == "dropped"
	}, 5*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.Zero(t, s.accepted.Load(), "a connection opened during the hold reached the server")

	require.Equal(t, holdproxy.Released{Delivered: 1, DeliveredBytes: 4, Dropped: 1, DroppedBytes: 7}, p.Release())
	got, err := readN(kept, 2, 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ok", got)
	require.NoError(t, kept.Close())
	require.Equal(t, received{data: "kept"}, s.next(t))
	require.EqualValues(t, 1, s.accepted.Load())
}
