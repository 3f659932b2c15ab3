package projection

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

func TestParseNodes(t *testing.T) {
	t.Parallel()
	nodes, user, pass, err := ParseNodes(" http://127.0.0.1:9200 ,http://elastic:s3cret@127.0.0.1:9201,http://127.0.0.1:9202/")
	require.NoError(t, err)
	require.Equal(t, "elastic", user)
	require.Equal(t, "s3cret", pass)
	var got []string
	for _, n := range nodes {
		got = append(got, n.String())
	}
	require.Equal(t, []string{"http://127.0.0.1:9200", "http://127.0.0.1:9201", "http://127.0.0.1:9202/"}, got)

	nodes, user, _, err = ParseNodes("https://u:p@es.example:9200")
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	require.Equal(t, "u", user)
	require.Nil(t, nodes[0].User)

	for raw, want := range map[string]string{
		"":                       "URL is required",
		"http://a:1,":            "URL 2 of 2 is empty",
		"http://a:1,,http://b:1": "URL 2 of 3 is empty",
		"http://a:1,b:1":         "URL 2 of 2 must be an http or https URL",
		"ftp://u:hunter2@a:1":    "URL must be an http or https URL",
		"http://a:1,https://b:1": "URL 2 of 2 has another scheme than the first",
		"http://a:1,http://a:1/": "",
		"http://a:1,http://a:1":  "URL 2 of 2 (a:1) is listed twice",
		"http://u:hunter2@a:1,http://u:0th3r-pw@b:1": "URL 2 of 2 carries other credentials than URL 1",
	} {
		_, _, _, err := ParseNodes(raw)
		if want == "" {
			require.NoError(t, err, raw)
			continue
		}
		require.Error(t, err, raw)
		var fe *bounds.FieldError
		require.ErrorAs(t, err, &fe, raw)
		require.Equal(t, "URL", fe.Field)
		require.Contains(t, err.Error(), want, raw)
		require.NotContains(t, err.Error(), "hunter2", raw)
		require.NotContains(t, err.Error(), "0th3r-pw", raw)
	}
}

func TestRedactedURLs(t *testing.T) {
	t.Parallel()
	require.Equal(t, "http://127.0.0.1:9200,http://127.0.0.1:9201",
		RedactedURLs("http://elastic:hunter2@127.0.0.1:9200, http://127.0.0.1:9201"))
	require.Equal(t, "the engine", RedactedURLs("http://a:1,"))
}

// countingNode is a local HTTP server standing in for a node: the picker
// under test only needs answers and refusals.
func countingNode(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"host":"` + r.Host + `"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestNodePickerSpreadsAndFailsOver(t *testing.T) {
	t.Parallel()
	a, aN := countingNode(t)
	b, bN := countingNode(t)
	unavailableNode := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(unavailableNode.Close)
	c, _ := countingNode(t)
	cURL := c.URL
	c.Close() // a node that is down: connections refused

	nodes, _, _, err := ParseNodes(a.URL + "," + b.URL + "," + cURL)
	require.NoError(t, err)
	p := newNodePicker(nodes, http.DefaultTransport)
	hc := nodeNamingClient{&http.Client{Transport: p}}
	get := func() error {
		req, err := http.NewRequest(http.MethodGet, a.URL+"/_cluster/health", nil)
		require.NoError(t, err)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	for range 30 {
		require.NoError(t, get(), "a request the down node refused goes to another node")
	}
	p.mu.Lock()
	require.True(t, p.state[2].out, "the down node is out of the rotation")
	p.mu.Unlock()
	require.InDelta(t, 15, aN.Load(), 1, "the live nodes share the requests")
	require.InDelta(t, 15, bN.Load(), 1)

	// A node answering 503 is out too, and its request goes on to the
	// next node. That one refuses: the error names it, the node the
	// request went to last, not olivere's URL (the first node's).
	nodes, _, _, err = ParseNodes(unavailableNode.URL + "," + cURL)
	require.NoError(t, err)
	p = newNodePicker(nodes, http.DefaultTransport)
	hc = nodeNamingClient{&http.Client{Transport: p}}
	err = get()
	require.Error(t, err)
	require.Equal(t, classify.Connection, classify.Classify(err).Reason)
	require.Contains(t, err.Error(), `Get "`+cURL+`/_cluster/health": dial tcp`)
	require.NotContains(t, err.Error(), a.URL)
	require.NotContains(t, err.Error(), unavailableNode.URL)
	p.mu.Lock()
	require.True(t, p.state[0].out && p.state[1].out)
	p.mu.Unlock()
}

// TestNodePickerPicksTheLeastBusyLiveNode: a request goes to the live node
// with the fewest requests in flight, one waiting past suspectAfter last;
// with every node out, to the one due to be probed first; a retry never to
// a node tried already.
func TestNodePickerPicksTheLeastBusyLiveNode(t *testing.T) {
	t.Parallel()
	nodes, _, _, err := ParseNodes("http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3")
	require.NoError(t, err)
	p := newNodePicker(nodes, http.DefaultTransport)
	later := time.Now().Add(time.Hour) // no probe starts meanwhile
	busy := func(i int, age time.Duration) {
		p.state[i].inflight[&attempt{started: time.Now().Add(-age)}] = struct{}{}
	}
	pick := func(tried ...int) int {
		t.Helper()
		seen := make([]bool, len(nodes))
		for _, i := range tried {
			seen[i] = true
		}
		i, ok := p.pick(seen)
		if !ok {
			return -1
		}
		return i
	}

	busy(0, 0)
	require.Equal(t, 1, pick())
	require.Equal(t, 2, pick(), "ties in turn")
	busy(1, 0)
	busy(2, 0)
	busy(2, 0)
	require.Equal(t, 0, pick(), "0 and 1 have one each; 0's turn")
	busy(0, 2*suspectAfter)
	require.Equal(t, 1, pick(), "0's oldest request waits past suspectAfter")

	p.state[1].out, p.state[1].nextProbe = true, later
	require.Equal(t, 2, pick(0), "out of the rotation")
	require.Equal(t, -1, pick(0, 2), "no live node left for a retry")

	for i := range p.state {
		p.state[i].out, p.state[i].nextProbe = true, later.Add(time.Duration(3-i)*time.Second)
	}
	require.Equal(t, 2, pick(), "every node out: the one due first")
	require.Equal(t, -1, pick(2))
}

// TestNewElasticClientNodeListFailsOver: two URLs, each a fault proxy in
// front of the one real engine; one proxy stops listening mid-stream. Every
// bulk is retried once at most, as the loop would, and lands; both proxies
// served while they were up.
func TestNewElasticClientNodeListFailsOver(t *testing.T) {
	t.Parallel()
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",") // one node of a cluster stack
	p1 := faultproxy.Start(t, engine)
	p2 := faultproxy.Start(t, engine)
	index := harness.NewIndex(t)
	client, err := NewElasticClient(ElasticOptions{URL: p1.URL() + "," + p2.URL()})
	require.NoError(t, err)
	ctx := context.Background()

	write := func(i int) {
		t.Helper()
		var err error
		for range 2 {
			_, err = client.Index().Index(index).Id(strings.Repeat("x", i%3+1) + time.Now().String()).
				BodyString(`{"kind":"book","title":"t"}`).Do(ctx)
			if err == nil {
				return
			}
			require.Equal(t, classify.Transient, classify.Classify(err).Class, "%v", err)
		}
		require.NoError(t, err, "the retry goes to the other node")
	}
	for i := range 10 {
		write(i)
	}
	require.Positive(t, p1.Requests())
	require.Positive(t, p2.Requests())

	p2.Set(faultproxy.Fault{Refuse: true})
	before := p1.Requests()
	for i := range 10 {
		write(i)
	}
	require.GreaterOrEqual(t, p1.Requests()-before, int64(10))
	_, err = Identify(ctx, client)
	require.NoError(t, err)
}

// TestEngineProbePingNeedsOneNode: readiness holds while one node of the
// list answers, though the client tries a lost node again now and then.
func TestEngineProbePingNeedsOneNode(t *testing.T) {
	t.Parallel()
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",")
	live := faultproxy.Start(t, engine)
	lost := faultproxy.Start(t, engine)
	lost.Set(faultproxy.Fault{Refuse: true})
	list := lost.URL() + "," + live.URL()
	client, err := NewElasticClient(ElasticOptions{URL: list})
	require.NoError(t, err)
	probe := NewEngineProbe(client, list)
	for i := range 4 {
		require.NoError(t, probe.Ping(context.Background()), "ping %d", i)
	}

	live.Set(faultproxy.Fault{Refuse: true})
	err = probe.Ping(context.Background())
	require.Error(t, err)
	require.Equal(t, classify.Connection, classify.Classify(err).Reason)
	require.Contains(t, err.Error(), list, "the error names every node")
}

// streamBulks sends one-event bulks through s from workers goroutines, as
// the loop's bulk slots do, until stop says so or for at most limit, and
// returns how long each bulk took. Every event must be applied: a node
// lost mid-stream costs no attempt.
func streamBulks(t *testing.T, s *Search, workers int, limit time.Duration, stop func() bool) []time.Duration {
	t.Helper()
	var (
		mu     sync.Mutex
		took   []time.Duration
		failed []error
		ids    atomic.Int64
		wg     sync.WaitGroup
	)
	end := time.Now().Add(limit)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && !stop() {
				id := ids.Add(1)
				start := time.Now()
				res := s.Handle(context.Background(), []outbox.Event{upsert(id, "book", strconv.FormatInt(id, 10), v(1), book("Dune"))})
				mu.Lock()
				took = append(took, time.Since(start))
				if res[0].Err != nil {
					failed = append(failed, res[0].Err)
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	require.Empty(t, failed, "bulks failed")
	return took
}

// silentFirst is a handler for b's index on a list of two nodes, each a
// fault proxy in front of the engine: the first accepts connections and
// never answers, as a lost host does (no FIN, no RST); the second forwards.
func silentFirst(t *testing.T, b bundle, timeout time.Duration) (s *Search, silent, live *faultproxy.Proxy) {
	t.Helper()
	engine, _, _ := strings.Cut(b.base, ",")
	silent = faultproxy.Start(t, engine)
	silent.Set(faultproxy.Fault{Delay: time.Hour})
	live = faultproxy.Start(t, engine)
	return b.searchAt(t, ElasticOptions{URL: silent.URL() + "," + live.URL(), Timeout: timeout}, 0), silent, live
}

// TestNewElasticClientSilentNodeCostsOneShortWait: of two nodes, the first
// accepts connections and never answers, as a lost host does (no FIN, no
// RST). Two bulk slots stream bulks: at most the bulk each slot first sent
// to the silent node waits, a few seconds, not its deadline; it is then
// sent to the other node, and no event fails.
func TestNewElasticClientSilentNodeCostsOneShortWait(t *testing.T) {
	t.Parallel()
	s, silent, live := silentFirst(t, setup(t), 0)

	took := streamBulks(t, s, 2, 8*time.Second, func() bool { return false })
	long, longest := 0, time.Duration(0)
	for _, d := range took {
		require.Less(t, d, 10*time.Second, "a bulk waited for its deadline (30s)")
		if d > 3*time.Second {
			long++
		}
		longest = max(longest, d)
	}
	t.Logf("%d bulks, %d waited over 3s, the longest %s", len(took), long, longest)
	require.LessOrEqual(t, long, 2, "bulks that waited long, of %d", len(took))
	require.LessOrEqual(t, silent.RequestsTo("/_bulk"), 2, "bulks sent to the silent node")
	require.Greater(t, len(took), 20)
	require.Equal(t, len(took), live.RequestsTo("/_bulk"), "every bulk reached the live node")
}

// TestNewElasticClientRevivesANodeByProbe: a node out of the rotation is
// tried again by a probe of its own, a cluster health request that gives up
// after a few seconds, one at a time, never by an event's bulk; once a probe
// answers, the node takes bulks again.
func TestNewElasticClientRevivesANodeByProbe(t *testing.T) {
	t.Parallel()
	s, silent, _ := silentFirst(t, setup(t), 0)

	streamBulks(t, s, 2, 10*time.Second, func() bool { return false })
	got := silent.Received()
	var probes []faultproxy.Received
	for _, r := range got {
		if r.Method == http.MethodGet && r.Path == probePath {
			probes = append(probes, r)
		}
	}
	require.LessOrEqual(t, silent.RequestsTo("/_bulk"), 2, "bulks sent to the silent node")
	require.Equal(t, len(got), len(probes)+silent.RequestsTo("/_bulk"), "only bulks and probes: %v", got)
	require.GreaterOrEqual(t, len(probes), 2)
	for k := 1; k < len(probes); k++ {
		require.False(t, probes[k-1].End.IsZero() || probes[k].Start.Before(probes[k-1].End), "probes overlap: %v", probes)
		require.Less(t, probes[k-1].End.Sub(probes[k-1].Start), 5*time.Second, "a probe waited too long")
	}

	silent.Clear()
	before := silent.RequestsTo("/_bulk")
	streamBulks(t, s, 2, 20*time.Second, func() bool { return silent.RequestsTo("/_bulk") > before })
	require.Greater(t, silent.RequestsTo("/_bulk"), before, "the node answering again takes bulks again")
}

// TestNewElasticClientRetriesWithinTheDeadline keeps WriteLifetime's
// promise for a bulk sent again to another node: every attempt starts
// within the bulk's deadline. Here the deadline (2 s) passes before the
// silent first node is found lost (suspectAfter + probeTimeout): the bulk
// fails as a timeout at its deadline, and the other node never gets it.
func TestNewElasticClientRetriesWithinTheDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	s, silent, live := silentFirst(t, setup(t), timeout)

	start := time.Now()
	res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireFailed(t, res[1], classify.Transient, classify.Timeout)
	require.Less(t, time.Since(start), timeout+time.Second)
	time.Sleep(suspectAfter + probeTimeout)
	require.Zero(t, live.RequestsTo("/_bulk"), "a bulk sent after its deadline")
	require.Equal(t, 1, silent.RequestsTo("/_bulk"))
}

// TestNewElasticClientProbesCarryCredentials: a probe is sent with the
// credentials of every other request, so that a node of a secured cluster
// can come back.
func TestNewElasticClientProbesCarryCredentials(t *testing.T) {
	t.Parallel()
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",")
	var mu sync.Mutex
	var probeAuth []string
	forward := func(_ int, _ http.ResponseWriter, r *http.Request) bool {
		r.Header.Del("Authorization") // the engine under test may run without security
		return false
	}
	first := newFront(t, engine, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == probePath {
			mu.Lock()
			probeAuth = append(probeAuth, r.Header.Get("Authorization"))
			mu.Unlock()
		}
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // out of the rotation
			return true
		}
		return forward(n, w, r)
	})
	second := newFront(t, engine, forward)
	client, err := NewElasticClient(ElasticOptions{URL: strings.Replace(first.URL, "http://", "http://elastic:s3cret@", 1) + "," + second.URL})
	require.NoError(t, err)
	harness.Eventually(t, 10*time.Second, "a probe of the first node", func() bool {
		_, err := Identify(context.Background(), client)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		return len(probeAuth) > 0
	})
	mu.Lock()
	require.Equal(t, "Basic "+base64.StdEncoding.EncodeToString([]byte("elastic:s3cret")), probeAuth[0])
	mu.Unlock()
}

// TestNewElasticClientResendsOnlyWhatIsSafe: a request that changes the
// cluster (here an index's creation) is sent again to another node only
// when its node never got it (refused); one that may have reached a silent
// node fails at its deadline instead, as with a single node.
func TestNewElasticClientResendsOnlyWhatIsSafe(t *testing.T) {
	t.Parallel()
	engine, _, _ := strings.Cut(harness.ElasticURL(t), ",")
	create := func(client *elastic.Client) error {
		index := harness.NewIndexName(t)
		t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), engine, index) })
		_, err := client.PerformRequest(context.Background(), elastic.PerformRequestOptions{Method: http.MethodPut, Path: "/" + index})
		return err
	}

	refused := faultproxy.Start(t, engine)
	refused.Set(faultproxy.Fault{Refuse: true})
	live := faultproxy.Start(t, engine)
	client, err := NewElasticClient(ElasticOptions{URL: refused.URL() + "," + live.URL()})
	require.NoError(t, err)
	require.NoError(t, create(client), "sent on to the live node")

	silent := faultproxy.Start(t, engine)
	silent.Set(faultproxy.Fault{Delay: time.Hour})
	live = faultproxy.Start(t, engine)
	client, err = NewElasticClient(ElasticOptions{URL: silent.URL() + "," + live.URL(), Timeout: 6 * time.Second})
	require.NoError(t, err)
	err = create(client)
	require.Error(t, err)
	require.Equal(t, classify.Timeout, classify.Classify(err).Reason)
	require.Zero(t, live.Requests(), "sent again after it may have reached the silent node")
}
