// Package tcpproxy is a TCP proxy for tests and drills that can cut the path
// between a client and its server the way a network partition does: bytes
// stop flowing in both directions, and neither side is told (no FIN, no RST).
//
// Bytes and closes sent during a partition are held, not dropped, and
// delivered on Restore, as TCP retransmission would deliver them once the
// network heals. Two things a userspace proxy cannot fake: the proxy's kernel
// still acknowledges TCP keepalive probes, so neither side's keepalive ever
// notices the cut (DropUpstream stands in for the server's keepalive firing),
// and a new connection completes its TCP handshake with the proxy; it is then
// held without reaching the server, so the client times out in its protocol
// handshake rather than in connect.
//
// Why not github.com/Shopify/toxiproxy/v2 (v2.5.0) as a library: its
// `timeout` toxic drops what it stops (toxics/timeout.go:41), lets a close
// through at once (:38) and closes every connection when removed (:48), so
// nothing is held for Restore; it dials the upstream on accept, before any
// toxic (proxy.go:188), so a new connection reaches the server mid-partition;
// `reset_peer` fires only on the next chunk of data and, added to an open
// connection, closes with a FIN (toxics/reset_peer.go:28, link.go:95); and it
// does not expose its connections, so DropUpstream has nothing to reset.
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/wlproj/wlproj/internal/testkit"
)

const dialTimeout = 10 * time.Second

// Proxy forwards TCP connections from a loopback port to one target.
type Proxy struct {
	target string
	ln     net.Listener
	done   chan struct{}
	wg     sync.WaitGroup

	mu         sync.Mutex
	open       chan struct{} // closed while forwarding
	blackholed bool
	refusing   bool
	conns      map[*pair]struct{}
	closed     bool
}

// pair is one client connection and its upstream connection.
type pair struct {
	client   net.Conn
	mu       sync.Mutex
	upstream net.Conn // nil until dialled
	done     chan struct{}
	once     sync.Once
}

// Start starts a proxy to target (host:port) on a free loopback port and
// closes it when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	return testkit.Closing[*Proxy](t)(New(target))
}

// New starts a proxy to target (host:port) on a free loopback port. The caller
// must Close it.
func New(target string) (*Proxy, error) {
	ln, err := testkit.ListenFor("tcpproxy", target)
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{target: target, ln: ln, done: make(chan struct{}), open: open, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, to be used instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops forwarding in both directions without closing anything, on
// existing and new connections alike, until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackholed {
		p.blackholed = true
		p.open = make(chan struct{})
	}
}

// Refuse stands in for a stopped server, until Restore: every open
// connection is reset on both sides, and every new one is reset as soon as
// it is accepted, so a client fails at once, as against a server that is
// down, instead of waiting out a timeout as in a blackhole.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refusing = true
	p.mu.Unlock()
	for _, c := range p.snapshot() {
		c.close(true)
	}
}

// refused reports whether Refuse is in force.
func (p *Proxy) refused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusing
}

// Restore forwards again, delivering what was held during the blackhole,
// and ends a Refuse.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = false
	if p.blackholed {
		p.blackholed = false
		close(p.open)
	}
}

// DropUpstream resets the server side of every open connection, as the
// server's TCP keepalive would after a partition outlasting it: the server
// ends the session (releasing, say, an advisory lock). The client side learns
// of it (an RST) only once the path is open, immediately if not blackholed.
func (p *Proxy) DropUpstream() {
	for _, c := range p.snapshot() {
		c.mu.Lock()
		up := c.upstream
		c.mu.Unlock()
		if up != nil {
			testkit.Reset(up)
		}
	}
}

// CloseAll closes every open connection on both sides. The proxy keeps
// accepting new ones.
func (p *Proxy) CloseAll() {
	for _, c := range p.snapshot() {
		c.close(false)
	}
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	err := p.ln.Close()
	p.CloseAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) snapshot() []*pair {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	return cs
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		conn, ok := testkit.Accept(p.ln)
		if !ok {
			return
		}
		c := &pair{client: conn, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = conn.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(c)
	}
}

// waitOpen blocks while blackholed; false means c or the proxy was closed.
func (p *Proxy) waitOpen(c *pair) bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	case <-c.done:
		return false
	case <-p.done:
		return false
	}
}

func (p *Proxy) handle(c *pair) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	// A connection opened during a partition never reaches the server until
	// the partition heals.
	if !p.waitOpen(c) {
		c.close(false)
		return
	}
	if p.refused() {
		c.close(true)
		return
	}
	up, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		// The closest a proxy can come to the refusal the client would have
		// seen from the server itself.
		c.close(true)
		return
	}
	c.mu.Lock()
	select {
	case <-c.done: // closed by CloseAll or Close while dialling
		c.mu.Unlock()
		_ = up.Close()
		return
	default:
	}
	c.upstream = up
	c.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.pipe(c, c.client, up)
	}()
	p.pipe(c, up, c.client)
	wg.Wait()
}

// pipe copies src to dst until either ends. Each chunk, and the end of the
// stream, waits for the path to be open, so nothing crosses a blackhole.
func (p *Proxy) pipe(c *pair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				c.close(true)
				return
			}
		}
		if err != nil {
			if !p.waitOpen(c) {
				return
			}
			// A clean end is passed on as a close; anything else (a reset,
			// or an upstream dropped by DropUpstream) as a reset.
			c.close(!errors.Is(err, io.EOF))
			return
		}
	}
}

// close closes both sides once, with an RST when reset is true.
func (c *pair) close(reset bool) {
	c.once.Do(func() {
		// Under mu, so that handle either sees done or has set upstream.
		c.mu.Lock()
		close(c.done)
		up := c.upstream
		c.mu.Unlock()
		for _, conn := range []net.Conn{c.client, up} {
			if conn == nil {
				continue
			}
			if reset {
				testkit.Reset(conn)
			} else {
				_ = conn.Close()
			}
		}
	})
}
