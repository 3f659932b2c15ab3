// Package holdproxy is a TCP proxy for drills and tests that holds what
// clients send, as a network that has stopped delivering would, and on
// Release delivers it or drops it as the client's own kernel would have.
//
// Over a real network, bytes that do not get through stay in the client's
// send buffer, unacknowledged, and its kernel retransmits them until they
// are acknowledged, until TCP_USER_TIMEOUT gives up, or until the socket is
// closed abortively (SO_LINGER 0, or a close with unread data: an RST),
// which discards them. A clean close (FIN) does not discard them: the kernel
// keeps retransmitting a closed socket's data for up to ~15 minutes
// (tcp_retries2). A userspace proxy acknowledges the bytes itself, so the
// client's kernel believes them delivered; the proxy has to play that kernel
// instead. It reads held bytes at once, so as to see how the client ends, and
// on Release delivers them if the client side is still open or ended with a
// FIN, and drops them, resetting the server side, if it was reset: the
// network would drop a dead connection's data.
//
// Only the client → server direction is held, ends included: answers to what
// got through before the hold keep flowing. A connection opened during a
// hold reaches the server at Release, for clients that speak first (HTTP).
//
// Not modelled: the client's TCP_USER_TIMEOUT never fires, because the
// proxy's kernel acknowledges at once, so a client that stays open through a
// hold longer than its user timeout has its bytes delivered where a real
// kernel would have reset the connection. Drills end a held client by
// killing or cancelling it instead.
//
// A cleanly closed client's FIN reaches the server after its delivered
// bytes once the server has answered them, or after answerGrace: an HTTP
// proxy behind this one (the drill's fault proxy, Go's net/http) cancels a
// request whose client half-closed, which the engine itself does not do to
// a bulk it has read.
package holdproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/wlproj/wlproj/internal/testkit"
)

const (
	dialTimeout = 10 * time.Second
	// answerGrace bounds how long a cleanly closed client's FIN waits for
	// the server to answer the bytes delivered for it.
	answerGrace = 10 * time.Second
	readBuffer  = 32 << 10
)

// End is how the client side of a connection has ended so far.
type End int

const (
	// Open: the client has not closed its side.
	Open End = iota
	// Closed: a clean close, a FIN.
	Closed
	// Reset: an RST (or any read error but end of stream).
	Reset
)

func (e End) String() string {
	switch e {
	case Open:
		return "open"
	case Closed:
		return "closed"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("End(%d)", int(e))
}

// Held is what one connection's client sent during the hold, and how it
// has ended so far.
type Held struct {
	Bytes []byte
	End   End
}

// Released is what Release did with the held bytes, counted in connections
// that had some.
type Released struct {
	// Delivered connections' clients were open or closed cleanly: their
	// held bytes go on to the server.
	Delivered      int
	DeliveredBytes int64
	// Dropped connections' clients were reset: their held bytes are
	// discarded and the server side is reset.
	Dropped      int
	DroppedBytes int64
}

// Proxy forwards TCP connections from a loopback port to one target.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu sync.Mutex
	// changed is broadcast on every change a connection's writer may wait
	// for: bytes read, an end, a hold released, an answer, a close.
	changed *sync.Cond
	holding bool
	conns   map[*conn]struct{}
	closed  bool
}

// chunk is one read from a client.
type chunk struct {
	b []byte
	// held chunks were read during the hold and wait for Release.
	held bool
	// released chunks were held and are to be delivered: the server's
	// answer to them lets a clean close through.
	released bool
}

// conn is one client connection. Its fields are guarded by Proxy.mu; the
// sockets themselves are used without it.
type conn struct {
	client net.Conn
	up     net.Conn // nil until dialled
	queue  []chunk  // read from the client, not yet written to the server
	end    End
	// awaiting is set while released bytes written to the server have not
	// been answered yet.
	awaiting   bool
	graceOver  bool
	graceTimer *time.Timer
	closed     bool
}

// Start starts a proxy to target (host:port) on a free loopback port and
// closes it when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	return testkit.Closing[*Proxy](t)(New(target))
}

// New starts a proxy to target (host:port) on a free loopback port. The
// caller must Close it.
func New(target string) (*Proxy, error) {
	ln, err := testkit.ListenFor("holdproxy", target)
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[*conn]struct{}{}}
	p.changed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port, to be used instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Hold stops forwarding what clients send, on open and new connections
// alike, until Release. Bytes read before it still go through.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding = true
	p.changed.Broadcast()
}

// Held returns what each connection's client has sent during the hold and
// not yet released, for connections that sent anything.
func (p *Proxy) Held() []Held {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Held
	for c := range p.conns {
		var b []byte
		for _, ch := range c.queue {
			if ch.held {
				b = append(b, ch.b...)
			}
		}
		if len(b) > 0 {
			out = append(out, Held{Bytes: b, End: c.end})
		}
	}
	return out
}

// Release ends the hold. Each connection's held bytes are judged by how its
// client has ended by now: delivered if it is open or closed cleanly,
// dropped if it was reset. Delivery itself follows, in the background.
func (p *Proxy) Release() Released {
	p.mu.Lock()
	defer p.mu.Unlock()
	var r Released
	for c := range p.conns {
		var n int64
		kept := c.queue[:0]
		for _, ch := range c.queue {
			if !ch.held {
				kept = append(kept, ch)
				continue
			}
			n += int64(len(ch.b))
			if c.end != Reset {
				kept = append(kept, chunk{b: ch.b, released: true})
			}
		}
		c.queue = kept
		switch {
		case n == 0:
		case c.end == Reset:
			r.Dropped++
			r.DroppedBytes += n
		default:
			r.Delivered++
			r.DeliveredBytes += n
		}
	}
	p.holding = false
	p.changed.Broadcast()
	return r
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
	for c := range p.conns {
		p.closeConn(c, false)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		nc, ok := testkit.Accept(p.ln)
		if !ok {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = nc.Close()
			return
		}
		c := &conn{client: nc}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.read(c)
		go p.write(c)
	}
}

// read reads the client as fast as it sends, as the proxy's kernel
// acknowledges it, so that its end is known as soon as it happens.
func (p *Proxy) read(c *conn) {
	defer p.wg.Done()
	buf := make([]byte, readBuffer)
	for {
		n, err := c.client.Read(buf)
		p.mu.Lock()
		if n > 0 {
			c.queue = append(c.queue, chunk{b: bytes.Clone(buf[:n]), held: p.holding})
		}
		if err != nil && c.end == Open {
			c.end = Reset
			if errors.Is(err, io.EOF) {
				c.end = Closed
			}
		}
		p.changed.Broadcast()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// waitsForRelease says whether, during a hold, c has nothing it may pass
// on: not connected yet, held bytes next, or only its end left.
func (c *conn) waitsForRelease() bool {
	if c.up == nil {
		return true
	}
	if len(c.queue) > 0 {
		return c.queue[0].held
	}
	return c.end != Open
}

// write passes the client's bytes and end on to the server, dialling it
// first, in order.
func (p *Proxy) write(c *conn) {
	defer p.wg.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	for !c.closed {
		switch {
		case p.holding && c.waitsForRelease():
			p.changed.Wait()
		case c.up == nil && len(c.queue) == 0 && c.end != Open:
			// Ended with nothing to deliver: the server never hears of it.
			p.closeConn(c, c.end == Reset)
		case c.up == nil:
			p.dial(c)
		case len(c.queue) > 0:
			ch := c.queue[0]
			c.queue = c.queue[1:]
			if ch.released {
				c.awaiting = true
			}
			p.mu.Unlock()
			_, err := c.up.Write(ch.b)
			p.mu.Lock()
			if err != nil {
				p.closeConn(c, true)
			}
		case c.end == Open:
			p.changed.Wait()
		case c.end == Reset:
			p.closeConn(c, true)
		case c.awaiting && !c.graceOver:
			if c.graceTimer == nil {
				c.graceTimer = time.AfterFunc(answerGrace, func() {
					p.mu.Lock()
					defer p.mu.Unlock()
					c.graceOver = true
					p.changed.Broadcast()
				})
			}
			p.changed.Wait()
		default:
			// Closed cleanly and answered: pass the FIN on and let the
			// server end the connection; answer closes both sides then.
			if tc, ok := c.up.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// dial connects c to the server; called with p.mu held, which it releases
// meanwhile.
func (p *Proxy) dial(c *conn) {
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", p.target, dialTimeout)
	p.mu.Lock()
	switch {
	case err != nil:
		// The closest a proxy can come to the refusal the client would
		// have seen from the server itself.
		p.closeConn(c, true)
	case c.closed:
		_ = up.Close()
	default:
		c.up = up
		p.wg.Add(1)
		go p.answer(c)
	}
}

// answer copies the server's bytes to the client until either ends.
func (p *Proxy) answer(c *conn) {
	defer p.wg.Done()
	buf := make([]byte, readBuffer)
	for {
		n, err := c.up.Read(buf)
		if n > 0 {
			p.mu.Lock()
			c.awaiting = false
			p.changed.Broadcast()
			p.mu.Unlock()
			if _, werr := c.client.Write(buf[:n]); werr != nil {
				p.lockedClose(c, true)
				return
			}
		}
		if err != nil {
			// A clean end is passed on as a close; anything else as a reset.
			p.lockedClose(c, !errors.Is(err, io.EOF))
			return
		}
	}
}

func (p *Proxy) lockedClose(c *conn, reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeConn(c, reset)
}

// closeConn closes both sides of c once, with an RST when reset is true.
// Called with p.mu held.
func (p *Proxy) closeConn(c *conn, reset bool) {
	if c.closed {
		return
	}
	c.closed = true
	delete(p.conns, c)
	if c.graceTimer != nil {
		c.graceTimer.Stop()
	}
	for _, nc := range []net.Conn{c.client, c.up} {
		if nc == nil {
			continue
		}
		if reset {
			testkit.Reset(nc)
		} else {
			_ = nc.Close()
		}
	}
	p.changed.Broadcast()
}
