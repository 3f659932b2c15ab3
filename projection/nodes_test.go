package projection

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
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

func TestNodePickerSpreadsFailsOverAndRevives(t *testing.T) {
	t.Parallel()
	a, aN := countingNode(t)
	b, bN := countingNode(t)
	c, _ := countingNode(t)
	cURL := c.URL
	c.Close() // a node that is down: connections refused

	nodes, _, _, err := ParseNodes(a.URL + "," + b.URL + "," + cURL)
	require.NoError(t, err)
	clock := time.Now()
	p := newNodePicker(nodes, http.DefaultTransport)
	p.now = func() time.Time { return clock }
	hc := &http.Client{Transport: p}
	get := func() error {
		resp, err := hc.Get(a.URL + "/_cluster/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	var refused []error
	for range 30 {
		if err := get(); err != nil {
			refused = append(refused, err)
		}
	}
	require.Len(t, refused, 1, "the down node is tried once, then left out")
	require.Contains(t, refused[0].Error(), "node "+cURL)
	require.Equal(t, classify.Transient, classify.Classify(refused[0]).Class)
	require.InDelta(t, 15, aN.Load(), 1, "the live nodes share the requests")
	require.InDelta(t, 15, bN.Load(), 1)

	// Past reviveMin the down node gets one real request again, and is out
	// for twice as long after it fails again.
	clock = clock.Add(reviveMin)
	failures := 0
	for range 4 {
		if get() != nil {
			failures++
		}
	}
	require.Equal(t, 1, failures)
	clock = clock.Add(reviveMin)
	for range 4 {
		require.NoError(t, get(), "still out: 2s since the second failure")
	}

	// All nodes down: the one due back first is tried, not refused unsent.
	a.Close()
	b.Close()
	for range 6 {
		require.Error(t, get())
	}
	p.mu.Lock()
	for i := range nodes {
		require.Positive(t, p.fails[i], "node %d was tried", i)
	}
	p.mu.Unlock()
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

// TestNodePickerProbesADeadNodeOnce: when a node is due back, one request
// tries it; the requests picked meanwhile go to the live nodes, so a node
// still down fails one bulk per revival, not every bulk in flight.
func TestNodePickerProbesADeadNodeOnce(t *testing.T) {
	t.Parallel()
	nodes, _, _, err := ParseNodes("http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3")
	require.NoError(t, err)
	clock := time.Now()
	p := newNodePicker(nodes, http.DefaultTransport)
	p.now = func() time.Time { return clock }
	p.failed(1)
	clock = clock.Add(reviveMin)
	var picked []int
	for range 6 {
		picked = append(picked, p.pick())
	}
	n := 0
	for _, i := range picked {
		if i == 1 {
			n++
		}
	}
	require.Equal(t, 1, n, "picked %v", picked)
}
