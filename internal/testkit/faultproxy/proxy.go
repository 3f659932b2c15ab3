// Package faultproxy is an HTTP reverse proxy that sits in front of the real
// search engine and, on command, makes it misbehave: answer 429 or 503 with
// the engine's own error body, delay, reset the connection, or stop listening.
// Independently of the fault it can add network latency (SetDelay): a fixed
// and a jittered delay on the way in and on the way out of every request.
// Tests, drills and the bench use it so that every failure they exercise comes from a
// real client talking to a real server, with only the fault injected.
package faultproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wlproj/wlproj/internal/testkit"
)

// Fault describes how the proxy treats the requests that follow Set. The zero
// Fault forwards everything.
type Fault struct {
	// Status answers with this HTTP status and an engine-style error body
	// without forwarding the request. 0 forwards.
	Status int
	// RetryAfter is sent as the Retry-After header with Status. Empty sends none.
	RetryAfter string
	// Delay waits this long before forwarding or answering. A client that gives
	// up meanwhile gets nothing, as from a stalled server.
	Delay time.Duration
	// Reset hijacks the connection and resets it (SO_LINGER 0) without a
	// response.
	Reset bool
	// Refuse closes the listener and every open connection, so that new
	// connections are refused until another Set or Clear. Times does not apply:
	// a refused connection never becomes a request to count.
	Refuse bool
	// Times limits the fault to the next Times requests, after which the proxy
	// forwards normally. 0 applies it until cleared.
	Times int
	// PathSuffix limits the fault to requests whose path ends with it (for
	// example "/_bulk"), so a replica's other calls to the engine neither
	// take the fault nor use up Times. Empty matches every request.
	PathSuffix string
}

// Direction is which way a latency delays: the request on its way to the
// engine, the response on its way back, or both.
type Direction int

const (
	Requests Direction = 1 << iota
	Responses
	Both = Requests | Responses
)

// latency is the network delay SetDelay configures.
type latency struct {
	fixed, jitter time.Duration
	dir           Direction
}

// Proxy forwards to one engine, injecting the current Fault.
type Proxy struct {
	addr      string // fixed after the first listen so URL survives Refuse
	rp        *httputil.ReverseProxy
	transport *http.Transport
	requests  atomic.Int64

	mu        sync.Mutex
	fault     Fault
	remaining int // requests left when fault.Times > 0
	latency   latency
	srv       *http.Server // nil while refusing or closed
	ln        net.Listener // srv's listener, closed by Set(Refuse) itself
	closed    bool
	done      chan struct{}
	received  []*Received
}

// Received is one request the proxy has received: what it asked for, and
// when it came and ended (the answer written, or the client gone).
type Received struct {
	Method, Path string
	Start        time.Time
	// End is zero while the request is in flight.
	End time.Time
}

// Start starts a proxy to target (the engine's base URL) on a free loopback
// port and closes it when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	return testkit.Closing[*Proxy](t)(New(target))
}

// New starts a proxy to target on a free loopback port. The caller must Close it.
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: target %q is not an http(s) base URL", target)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &Proxy{transport: tr, done: make(chan struct{})}
	p.rp = &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport: tr,
		// The engine being down is a normal state in tests; answer like a
		// load balancer would, without logging to stderr.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			http.Error(w, "faultproxy: upstream: "+err.Error(), http.StatusBadGateway)
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	return p, nil
}

// URL is the proxy's base URL, to be used instead of the engine's.
func (p *Proxy) URL() string { return "http://" + p.addr }

// Set makes f apply to the requests that follow, replacing any earlier fault.
func (p *Proxy) Set(f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.fault, p.remaining = f, f.Times
	if f.Refuse {
		if p.srv != nil {
			// Close drops the open connections too, as a stopped engine does;
			// otherwise pooled keep-alive connections would keep working.
			_ = p.srv.Close()
			// srv.Close misses a listener its Serve goroutine has not begun
			// tracking yet: the kernel would then accept a connection into the
			// backlog and reset it once Serve starts, a reset (maybe sent) where
			// a stopped engine refuses (never sent).
			_ = p.ln.Close()
			p.srv = nil
		}
		return
	}
	if p.srv == nil {
		p.relisten()
	}
}

// Clear forwards every following request unchanged, but for the latency
// SetDelay added, which stays until SetDelay(0, 0).
func (p *Proxy) Clear() { p.Set(Fault{}) }

// SetDelay adds a one-way network delay to every following request, in
// both directions: fixed plus a uniformly random part in [0, jitter], drawn
// anew for the request and for its response, so a round trip takes at least
// 2×fixed more. It applies to faulted requests too, and is not changed by Set
// or Clear: the network stays slow while the engine misbehaves.
// SetDelay(0, 0) removes it.
func (p *Proxy) SetDelay(fixed, jitter time.Duration) { p.SetDelayOn(Both, fixed, jitter) }

// SetDelayOn is SetDelay in the directions dir only.
func (p *Proxy) SetDelayOn(dir Direction, fixed, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = latency{fixed: max(fixed, 0), jitter: max(jitter, 0), dir: dir}
}

// delay is one direction's latency for one request, 0 if dir is not delayed.
func (l latency) delay(dir Direction) time.Duration {
	if l.dir&dir == 0 {
		return 0
	}
	d := l.fixed
	if l.jitter > 0 {
		d += rand.N(l.jitter + 1)
	}
	return d
}

// Requests is the number of requests the proxy has received, faulted or not.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Received lists the requests the proxy has received, faulted or not, in
// the order they came, each as it stands now.
func (p *Proxy) Received() []Received {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Received, len(p.received))
	for i, r := range p.received {
		out[i] = *r
	}
	return out
}

// RequestsTo is the number of requests received whose path ends with
// pathSuffix (for example "/_bulk").
func (p *Proxy) RequestsTo(pathSuffix string) int {
	n := 0
	for _, r := range p.Received() {
		if strings.HasSuffix(r.Path, pathSuffix) {
			n++
		}
	}
	return n
}

// receive records r's arrival and returns the function that records its end.
func (p *Proxy) receive(r *http.Request) (ended func()) {
	p.requests.Add(1)
	rec := &Received{Method: r.Method, Path: r.URL.Path, Start: time.Now()}
	p.mu.Lock()
	p.received = append(p.received, rec)
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		rec.End = time.Now()
		p.mu.Unlock()
	}
}

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	close(p.done)
	var err error
	if p.srv != nil {
		err = p.srv.Close()
		_ = p.ln.Close() // see Set
		p.srv = nil
	}
	p.transport.CloseIdleConnections()
	return err
}

// serve runs a fresh http.Server on ln: a closed server cannot be restarted.
// Called with p.mu held or before p is shared.
func (p *Proxy) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(p.handle), ReadHeaderTimeout: 10 * time.Second}
	p.srv, p.ln = srv, ln
	go func() { _ = srv.Serve(ln) }()
}

// relisten takes the old address back after Refuse, so URL stays valid.
// Called with p.mu held.
func (p *Proxy) relisten() {
	var err error
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return
		}
	}
	// Set has no error to return, and a proxy that silently stays down would
	// make a test pass for the wrong reason.
	panic(fmt.Sprintf("faultproxy: listen again on %s: %v", p.addr, err))
}

// take returns the fault for one request, counted against Times, and the
// latency.
func (p *Proxy) take(path string) (Fault, bool, latency) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, l := p.fault, p.latency
	if f == (Fault{}) || f.Refuse || !strings.HasSuffix(path, f.PathSuffix) {
		return Fault{}, false, l
	}
	if f.Times > 0 {
		p.remaining--
		if p.remaining <= 0 {
			p.fault = Fault{}
		}
	}
	return f, true, l
}

func (p *Proxy) handle(w http.ResponseWriter, r *http.Request) {
	defer p.receive(r)()
	f, ok, l := p.take(r.URL.Path)
	if d := l.delay(Requests); d > 0 && !sleep(r.Context(), p.done, d) {
		return
	}
	if d := l.delay(Responses); d > 0 {
		w = &delayedWriter{ResponseWriter: w, delay: d, ctx: r.Context(), done: p.done}
	}
	if !ok {
		p.rp.ServeHTTP(w, r)
		return
	}
	if f.Delay > 0 && !sleep(r.Context(), p.done, f.Delay) {
		return
	}
	switch {
	case f.Reset:
		reset(w)
	case f.Status != 0:
		writeEngineError(w, f.Status, f.RetryAfter)
	default:
		p.rp.ServeHTTP(w, r)
	}
}

func sleep(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
}

// delayedWriter holds the response back by delay before its first byte
// leaves, as a slow network does: the engine has answered, the client has
// not heard yet.
type delayedWriter struct {
	http.ResponseWriter
	delay time.Duration
	ctx   context.Context
	done  <-chan struct{}
	once  sync.Once
}

func (w *delayedWriter) wait() { w.once.Do(func() { sleep(w.ctx, w.done, w.delay) }) }

func (w *delayedWriter) WriteHeader(status int) {
	w.wait()
	w.ResponseWriter.WriteHeader(status)
}

func (w *delayedWriter) Write(b []byte) (int, error) {
	w.wait()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (the reverse proxy's flushes, the
// reset's hijack) reach the connection's own writer.
func (w *delayedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// reset closes the client's connection with an RST and no response.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if errors.Is(err, http.ErrNotSupported) {
		panic(errors.New("faultproxy: response writer cannot hijack"))
	}
	if err != nil {
		return
	}
	testkit.Reset(conn)
}

// Error bodies as Elasticsearch 7.x sends them, so that clients parse and
// classify an injected fault exactly as a real one.
var engineErrors = map[int]struct{ typ, reason string }{
	http.StatusTooManyRequests: {
		"es_rejected_execution_exception",
		"rejected execution of coordinating operation [coordinating_and_primary_bytes=52428800, replica_bytes=0, all_bytes=52428800, coordinating_operation_bytes=1048576, max_coordinating_and_primary_bytes=53687091]",
	},
	http.StatusServiceUnavailable: {
		"cluster_block_exception",
		"blocked by: [SERVICE_UNAVAILABLE/1/state not recovered / initialized];",
	},
	http.StatusInternalServerError: {"exception", "injected fault: internal server error"},
	http.StatusGatewayTimeout:      {"timeout_exception", "injected fault: timed out"},
}

type errorCause struct {
	Type   string `json:"type"`
	Reason string `json:"reason"`
}

type errorBody struct {
	Error struct {
		RootCause []errorCause `json:"root_cause"`
		errorCause
	} `json:"error"`
	Status int `json:"status"`
}

func writeEngineError(w http.ResponseWriter, status int, retryAfter string) {
	e, ok := engineErrors[status]
	if !ok {
		e.typ, e.reason = "exception", "injected fault: HTTP "+strconv.Itoa(status)
	}
	var b errorBody
	b.Error.errorCause = errorCause{Type: e.typ, Reason: e.reason}
	b.Error.RootCause = []errorCause{b.Error.errorCause}
	b.Status = status
	body, _ := json.Marshal(b)

	h := w.Header()
	h.Set("Content-Type", "application/json; charset=UTF-8")
	h.Set("X-Elastic-Product", "Elasticsearch")
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
