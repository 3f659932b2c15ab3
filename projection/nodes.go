package projection

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
)

// ParseNodes reads ElasticOptions.URL: one base URL or several separated by
// commas. It returns them without user info, and the user and password
// found in them: credentials in any one apply to all, and two URLs with
// different credentials are refused. Errors name the URL by its position
// and host only, never its credentials.
func ParseNodes(raw string) (nodes []*url.URL, user, password string, err error) {
	if strings.TrimSpace(raw) == "" {
		return nil, "", "", bounds.Invalid("URL", "is required")
	}
	parts := strings.Split(raw, ",")
	seen := map[string]bool{}
	credsFrom := 0
	for i, part := range parts {
		// FieldError says "URL <problem>": where goes in front of it.
		where := ""
		if len(parts) > 1 {
			where = fmt.Sprintf("%d of %d ", i+1, len(parts))
		}
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, "", "", bounds.Invalid("URL", "%sis empty", where)
		}
		u, perr := url.Parse(part)
		if perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// Not wrapped: url.Parse's error repeats the URL, password included.
			return nil, "", "", bounds.Invalid("URL", "%smust be an http or https URL", where)
		}
		if u.User != nil {
			p, _ := u.User.Password()
			if credsFrom > 0 && (u.User.Username() != user || p != password) {
				return nil, "", "", bounds.Invalid("URL", "%scarries other credentials than URL %d: give them once, they apply to every node", where, credsFrom)
			}
			user, password, credsFrom = u.User.Username(), p, i+1
			u.User = nil
		}
		if len(nodes) > 0 && u.Scheme != nodes[0].Scheme {
			return nil, "", "", bounds.Invalid("URL", "%shas another scheme than the first: every node is http, or every node https", where)
		}
		if seen[u.String()] {
			return nil, "", "", bounds.Invalid("URL", "%s(%s) is listed twice", where, u.Host)
		}
		seen[u.String()] = true
		nodes = append(nodes, u)
	}
	return nodes, user, password, nil
}

// RedactedURLs is raw (ElasticOptions.URL) for messages: each URL without
// its user info, comma-separated. A value ParseNodes refuses is "the engine".
func RedactedURLs(raw string) string {
	nodes, _, _, err := ParseNodes(raw)
	if err != nil {
		return "the engine"
	}
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Redacted()
	}
	return strings.Join(out, ",")
}

// How the client treats the nodes of a node list. A node that fails is left
// out of the rotation and probed in the background after reviveMin, then
// after twice as long at each failed probe in a row, up to reviveMax: a
// node that comes back gets its share within reviveMax + probeTimeout.
const (
	reviveMin = time.Second
	reviveMax = 30 * time.Second
)

// nodePicker spreads the requests over the nodes of a node list: each goes
// to the live node with the fewest requests in flight, ties in turn. A node
// is taken out of the rotation when a request to it fails without an answer
// (refused, reset, no connection within dialTimeout), when it answers that
// it cannot serve (502, 503, 504: a node cut off from its master, a proxy
// whose engine is gone), and when a request to it waits longer than
// suspectAfter and its cluster health does not answer within probeTimeout
// either (a lost host: no FIN, no RST). The request is then sent again to
// another live node, within its own deadline, so that a lost node costs
// the caller one short wait, not an attempt: a request its node never got,
// and one that may be sent twice (resendable; bulks carry external
// versions, and sending one twice changes nothing).
//
// A node out of the rotation gets no request of the caller's while another
// node is live. Probes of its cluster health (nodeprobe.go), one at a time,
// bring it back once one answers. When every node is out, a request goes
// to the one due to be probed first, so that each attempt the loop counts
// is a real one; its answer brings the node back too.
type nodePicker struct {
	nodes []*url.URL
	next  http.RoundTripper

	mu    sync.Mutex
	turn  int
	state []nodeState
}

// nodeState is what the picker knows of one node. Guarded by nodePicker.mu.
type nodeState struct {
	out       bool      // out of the rotation
	fails     int       // failures in a row
	nextProbe time.Time // when an out node is probed next
	probing   bool      // a probe of it is in flight
	inflight  map[*attempt]struct{}
}

// attempt is one request in flight to a node.
type attempt struct {
	started time.Time
	// cancel ends it, if resendable, when its node is found lost and
	// another is live.
	cancel     context.CancelCauseFunc
	resendable bool
	// watch probes its node if it waits longer than suspectAfter.
	watch *time.Timer
}

func newNodePicker(nodes []*url.URL, next http.RoundTripper) *nodePicker {
	p := &nodePicker{nodes: nodes, next: next, state: make([]nodeState, len(nodes))}
	for i := range p.state {
		p.state[i].inflight = map[*attempt]struct{}{}
	}
	return p
}

// RoundTrip sends req to a node, and again to each other live node in turn
// while the answer says the node was lost or cannot serve, unless the
// caller has given up or the request may not be sent twice
// (resendable). The caller sees the last answer or error.
func (p *nodePicker) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := replayable(req)
	if err != nil {
		return nil, err
	}
	again := resendable(req)
	tried := make([]bool, len(p.nodes))
	i, _ := p.pick(tried)
	for {
		tried[i] = true
		resp, err := p.send(req, i, body, again)
		if req.Context().Err() != nil || !worthAnother(again, resp, err) {
			return resp, err
		}
		next, ok := p.pick(tried)
		if !ok {
			return resp, err
		}
		if resp != nil {
			discard(resp)
		}
		i = next
	}
}

// pick is the node for a request that has been sent to the tried nodes:
// the live node, not tried yet, with the fewest requests in flight,
// preferring one whose requests are all younger than suspectAfter. On a
// first try with every node out it is the one due to be probed first; on a
// later try with none live left, there is none.
func (p *nodePicker) pick(tried []bool) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.probeDue(now)
	best, bestSuspect := -1, false
	for k := range p.nodes {
		i := (p.turn + k) % len(p.nodes)
		s := &p.state[i]
		if tried[i] || s.out {
			continue
		}
		suspect := s.suspect(now)
		if best < 0 || (bestSuspect && !suspect) ||
			(suspect == bestSuspect && len(s.inflight) < len(p.state[best].inflight)) {
			best, bestSuspect = i, suspect
		}
	}
	if best < 0 && !slices.Contains(tried, true) {
		for i := range p.state {
			if best < 0 || p.state[i].nextProbe.Before(p.state[best].nextProbe) {
				best = i
			}
		}
	}
	if best < 0 {
		return -1, false
	}
	p.turn = best + 1
	return best, true
}

// suspect says whether a request to the node has waited longer than
// suspectAfter for its answer.
func (s *nodeState) suspect(now time.Time) bool {
	for a := range s.inflight {
		if now.Sub(a.started) > suspectAfter {
			return true
		}
	}
	return false
}

// worthAnother says whether an attempt's outcome sends the request on to
// another node: a node that cannot serve it or did not answer, for a
// request that may be sent twice; any request its node never got.
func worthAnother(again bool, resp *http.Response, err error) bool {
	if err == nil {
		return again && unavailable(resp.StatusCode)
	}
	var op *net.OpError
	return again || (errors.As(err, &op) && op.Op == "dial")
}

// resendable says whether req may be sent again to another node after an
// attempt that may have reached its node: wlproj's bulks (their external
// versions make a second copy change nothing) and reads. Not a scroll's next
// page, which the first copy may have consumed, nor a request that changes
// the cluster (an index created, deleted, aliased, its settings).
func resendable(req *http.Request) bool {
	path := req.URL.Path
	switch {
	case strings.HasSuffix(path, "/_search/scroll"):
		return false
	case req.Method == http.MethodGet || req.Method == http.MethodHead:
		return true
	case req.Method == http.MethodPost:
		for _, read := range []string{"/_bulk", "/_search", "/_count", "/_mget"} {
			if strings.HasSuffix(path, read) {
				return true
			}
		}
	}
	return false
}

// send sends req to node i, with the body's own copy, and judges the node
// by the outcome. again says whether req is resendable.
func (p *nodePicker) send(req *http.Request, i int, body func() (io.ReadCloser, error), again bool) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	r := req.Clone(ctx)
	p.route(r, i)
	sentTo(req.Context(), r.URL)
	if body != nil {
		var err error
		if r.Body, err = body(); err != nil {
			cancel(nil)
			return nil, err
		}
		r.GetBody = body
	}
	a := p.begin(i, cancel, again)
	resp, err := p.next.RoundTrip(r)
	p.end(i, a)
	if err == nil && errors.Is(context.Cause(ctx), errNodeSilent) {
		// Given up by its node's probe just as it answered: the answer's
		// body is cut off with the attempt's context.
		discard(resp)
		resp, err = nil, errNodeSilent
	}
	if err != nil {
		cancel(nil)
		return nil, p.failedWith(ctx, req, i, err)
	}
	p.mu.Lock()
	if unavailable(resp.StatusCode) {
		p.markOut(i)
	} else {
		p.state[i].out, p.state[i].fails = false, 0
	}
	p.mu.Unlock()
	// The attempt's context lives until its body is read.
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// failedWith judges node i by req's attempt of context ctx, which got no
// answer, and returns the error the caller sees.
func (p *nodePicker) failedWith(ctx context.Context, req *http.Request, i int, err error) error {
	if ctxErr := req.Context().Err(); ctxErr != nil {
		// The caller giving up says nothing about the node, and olivere
		// must see its context error as it is; a deadline (the client's
		// timeout) does: the node did not answer in time.
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			p.failed(i)
		}
		return err
	}
	if errors.Is(context.Cause(ctx), errNodeSilent) {
		// Taken out by its probe already.
		return errNodeSilent
	}
	p.failed(i)
	return err
}

// route points r at node i. olivere put the first node's path in front of
// the API's.
func (p *nodePicker) route(r *http.Request, i int) {
	node := p.nodes[i]
	r.URL.Scheme, r.URL.Host, r.Host = node.Scheme, node.Host, node.Host
	if first := p.nodes[0].Path; node.Path != first {
		r.URL.Path = strings.TrimRight(node.Path, "/") + strings.TrimPrefix(r.URL.Path, strings.TrimRight(first, "/"))
		r.URL.RawPath = ""
	}
}

// begin records an attempt on node i, whose node is probed if it waits
// longer than suspectAfter.
func (p *nodePicker) begin(i int, cancel context.CancelCauseFunc, resendable bool) *attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := &attempt{started: time.Now(), cancel: cancel, resendable: resendable}
	a.watch = time.AfterFunc(suspectAfter, func() { p.watch(i) })
	p.state[i].inflight[a] = struct{}{}
	return a
}

func (p *nodePicker) end(i int, a *attempt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a.watch.Stop()
	delete(p.state[i].inflight, a)
}

// failed takes node i out after a request that got no answer.
func (p *nodePicker) failed(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.markOut(i)
}

// markOut takes node i out of the rotation, or keeps it out, and schedules
// its next probe. Called with p.mu held.
func (p *nodePicker) markOut(i int) {
	s := &p.state[i]
	s.out = true
	s.fails++
	s.nextProbe = time.Now().Add(min(reviveMin<<min(s.fails-1, 10), reviveMax))
}

// unavailable says whether a status is a node's (or the proxy's in front
// of it) saying that it cannot serve now: another node may.
func unavailable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable ||
		status == http.StatusGatewayTimeout
}

// replayable returns what gives each attempt its own copy of req's body,
// nil for a request without one. olivere sets no GetBody, so its body is
// read once here; it is in memory already.
func replayable(req *http.Request) (func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		_ = req.Body.Close()
		return req.GetBody, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, nil
}

// discard reads a little of an answer that will not be used, so that its
// connection can be kept, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// cancelOnClose ends an attempt's context once its answer is read.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
