package projection

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// A node is probed by asking its cluster health: cheap, answered by every
// engine, allowed to the credentials wlproj needs (readiness asks the
// same), and a node cut off from its master does not answer it, where GET /
// would still answer.
const (
	probePath = "/_cluster/health"
	// probeTimeout bounds one probe: a node whose cluster health has not
	// answered within it is out of the rotation. A few seconds: on a
	// healthy cluster it answers in milliseconds.
	probeTimeout = 3 * time.Second
	// suspectAfter is how long a request to a node waits for its answer
	// before the node is probed, and again after each probe that answered
	// while the request still waits. A bulk may rightly take longer: it
	// keeps waiting while its node's probes answer.
	suspectAfter = time.Second
)

// errNodeSilent ends the resendable requests in flight to a node whose
// probe got no answer while another node is live; they are sent there
// instead. It
// classifies as a timeout, should it reach the caller.
var errNodeSilent error = nodeSilentError{}

type nodeSilentError struct{}

func (nodeSilentError) Error() string {
	return fmt.Sprintf("no answer, and none to a cluster health probe within %s", probeTimeout)
}
func (nodeSilentError) Timeout() bool   { return true }
func (nodeSilentError) Temporary() bool { return true }

// probeDue starts a probe of each node out of the rotation that is due for
// one and has none in flight. Called with p.mu held.
func (p *nodePicker) probeDue(now time.Time) {
	for i := range p.state {
		s := &p.state[i]
		if s.out && !s.probing && !now.Before(s.nextProbe) {
			s.probing = true
			go p.probe(i)
		}
	}
}

// watch probes node i, unless a probe of it is in flight, when a request
// to it has waited longer than suspectAfter.
func (p *nodePicker) watch(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.state[i]
	if !s.probing && s.suspect(time.Now()) {
		s.probing = true
		go p.probe(i)
	}
}

// probe asks node i's cluster health and judges the node by the answer.
func (p *nodePicker) probe(i int) {
	alive := p.healthy(i)
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.state[i]
	s.probing = false
	if alive {
		s.out, s.fails = false, 0
		if len(s.inflight) > 0 {
			// A request still waiting has its node probed again.
			time.AfterFunc(suspectAfter, func() { p.watch(i) })
		}
		return
	}
	p.markOut(i)
	for j := range p.state {
		if j != i && !p.state[j].out {
			for a := range s.inflight {
				if a.resendable {
					a.cancel(errNodeSilent)
				}
			}
			return
		}
	}
}

// healthy says whether node i answers its cluster health within
// probeTimeout with anything but "unavailable". A refusal of the
// credentials is an answer: the node is there.
func (p *nodePicker) healthy(i int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.nodes[i].JoinPath(probePath).String(), nil)
	if err != nil {
		return false
	}
	req.Header.Set("Accept", "application/json")
	resp, err := p.next.RoundTrip(req)
	if err != nil {
		return false
	}
	discard(resp)
	return !unavailable(resp.StatusCode)
}

// nodeNamingClient is olivere's HTTP client with a node list. olivere's URL
// is the first node's, and so is the URL of the client's errors; this one's
// name the node the request last went to instead.
type nodeNamingClient struct{ *http.Client }

type sentToKey struct{}

// sentToHolder is where the picker writes the URL of each attempt.
type sentToHolder struct {
	mu  sync.Mutex
	url string
}

func (c nodeNamingClient) Do(req *http.Request) (*http.Response, error) {
	h := &sentToHolder{}
	resp, err := c.Client.Do(req.WithContext(context.WithValue(req.Context(), sentToKey{}, h)))
	var ue *url.Error
	if err != nil && errors.As(err, &ue) {
		h.mu.Lock()
		if h.url != "" {
			ue.URL = h.url
		}
		h.mu.Unlock()
	}
	return resp, err
}

// sentTo records u as where the request of ctx went, if its client asks.
func sentTo(ctx context.Context, u *url.URL) {
	if h, ok := ctx.Value(sentToKey{}).(*sentToHolder); ok {
		h.mu.Lock()
		h.url = u.String()
		h.mu.Unlock()
	}
}
