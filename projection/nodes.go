package projection

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
)

// A node that failed is left out of the rotation for reviveMin, doubled at
// each failure in a row up to reviveMax, then sent a real request again: a
// node that comes back gets its share within reviveMax.
const (
	reviveMin = time.Second
	reviveMax = 30 * time.Second
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

// nodePicker sends each request to the next live node, round robin, and
// takes a node out of the rotation when a request to it fails without an
// answer (refused, reset, timed out): the loop's retry of that bulk then
// goes to another node. When every node is out, the one due back first is
// tried anyway, so that each attempt the loop counts is a real one.
type nodePicker struct {
	nodes []*url.URL
	next  http.RoundTripper

	mu        sync.Mutex
	turn      int
	fails     []int
	deadUntil []time.Time
	now       func() time.Time
}

func newNodePicker(nodes []*url.URL, next http.RoundTripper) *nodePicker {
	return &nodePicker{nodes: nodes, next: next, fails: make([]int, len(nodes)),
		deadUntil: make([]time.Time, len(nodes)), now: time.Now}
}

// pick is the index of the node for the next request.
func (p *nodePicker) pick() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	soonest := -1
	for k := range p.nodes {
		i := (p.turn + k) % len(p.nodes)
		if !p.deadUntil[i].After(now) {
			p.turn = i + 1
			if p.fails[i] > 0 {
				// A node due back gets one request; the others wait for
				// its outcome (answered or failed) or for reviveMin.
				p.deadUntil[i] = now.Add(reviveMin)
			}
			return i
		}
		if soonest < 0 || p.deadUntil[i].Before(p.deadUntil[soonest]) {
			soonest = i
		}
	}
	p.turn = soonest + 1
	return soonest
}

func (p *nodePicker) failed(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fails[i]++
	p.deadUntil[i] = p.now().Add(min(reviveMin<<min(p.fails[i]-1, 10), reviveMax))
}

func (p *nodePicker) answered(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fails[i], p.deadUntil[i] = 0, time.Time{}
}

func (p *nodePicker) RoundTrip(req *http.Request) (*http.Response, error) {
	i := p.pick()
	node := p.nodes[i]
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = node.Scheme, node.Host, node.Host
	if first := p.nodes[0].Path; node.Path != first {
		// olivere put the first node's path in front of the API's.
		r.URL.Path = strings.TrimRight(node.Path, "/") + strings.TrimPrefix(req.URL.Path, strings.TrimRight(first, "/"))
		r.URL.RawPath = ""
	}
	resp, err := p.next.RoundTrip(r)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			// The caller giving up says nothing about the node, and
			// olivere must see its context error as it is; a deadline
			// (the client's timeout) does: the node did not answer.
			if errors.Is(ctxErr, context.DeadlineExceeded) {
				p.failed(i)
			}
			return nil, err
		}
		p.failed(i)
		return nil, &nodeError{node: node.Redacted(), err: err}
	}
	p.answered(i)
	return resp, nil
}

// nodeError names the node a request went to: the client's own error names
// olivere's URL, the first node's. Timeout and Temporary are the wrapped
// error's, which *url.Error and classify ask.
type nodeError struct {
	node string
	err  error
}

func (e *nodeError) Error() string { return "node " + e.node + ": " + e.err.Error() }
func (e *nodeError) Unwrap() error { return e.err }

func (e *nodeError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.err, &t) && t.Timeout()
}

func (e *nodeError) Temporary() bool {
	var t interface{ Temporary() bool }
	return errors.As(e.err, &t) && t.Temporary()
}
