package faultproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type bundle struct {
	proxy  *faultproxy.Proxy
	client *http.Client
	engine string
}

func setup(t *testing.T) bundle {
	t.Helper()
	engine := harness.ElasticURL(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return bundle{
		proxy:  faultproxy.Start(t, engine),
		client: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		engine: engine,
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, c *http.Client, method, url, body string) (response, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp.StatusCode, resp.Header, b}, nil
}

func get(t *testing.T, c *http.Client, url string) response {
	t.Helper()
	r, err := do(t, c, http.MethodGet, url, "")
	require.NoError(t, err)
	return r
}

// requireEngine asserts that the real engine answered, with its version.
func requireEngine(t *testing.T, r response) {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var info struct {
		Version struct {
			Number string `json:"number"`
		} `json:"version"`
	}
	require.NoError(t, json.Unmarshal(r.body, &info))
	require.True(t, strings.HasPrefix(info.Version.Number, "7."), "engine version %q", info.Version.Number)
}

type engineError struct {
	Error struct {
		RootCause []struct {
			Type string `json:"type"`
		} `json:"root_cause"`
		Type   string `json:"type"`
		Reason string `json:"reason"`
	} `json:"error"`
	Status int `json:"status"`
}

func requireEngineError(t *testing.T, r response, status int, typ string) {
	t.Helper()
	require.Equal(t, status, r.status)
	require.Equal(t, "application/json; charset=UTF-8", r.header.Get("Content-Type"))
	require.Equal(t, "Elasticsearch", r.header.Get("X-Elastic-Product"))
	var e engineError
	require.NoError(t, json.Unmarshal(r.body, &e), "body: %s", r.body)
	require.Equal(t, status, e.Status)
	require.Equal(t, typ, e.Error.Type)
	require.NotEmpty(t, e.Error.Reason)
	require.Len(t, e.Error.RootCause, 1)
	require.Equal(t, typ, e.Error.RootCause[0].Type)
}

func TestForwardsToEngine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	require.EqualValues(t, 1, b.proxy.Requests())
}

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		typ        string
	}{
		{"429 with Retry-After", 429, "2", "es_rejected_execution_exception"},
		{"429 without Retry-After", 429, "", "es_rejected_execution_exception"},
		{"503", 503, "", "cluster_block_exception"},
		{"other status", 502, "", "exception"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			index := harness.NewIndexName(t)
			b.proxy.Set(faultproxy.Fault{Status: tc.status, RetryAfter: tc.retryAfter})

			// A write, so that we can check it never reached the engine.
			r, err := do(t, b.client, http.MethodPut, b.proxy.URL()+"/"+index+"/_doc/1?refresh=true", `{"a":1}`)
			require.NoError(t, err)
			requireEngineError(t, r, tc.status, tc.typ)
			require.Equal(t, tc.retryAfter, r.header.Get("Retry-After"))
			_, hasRetryAfter := r.header["Retry-After"]
			require.Equal(t, tc.retryAfter != "", hasRetryAfter)

			direct := get(t, b.client, b.engine+"/"+index+"/_doc/1")
			require.Equal(t, http.StatusNotFound, direct.status, "the faulted write reached the engine: %s", direct.body)
		})
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const delay = 300 * time.Millisecond

	b.proxy.Set(faultproxy.Fault{Delay: delay})
	start := time.Now()
	r := get(t, b.client, b.proxy.URL()+"/")
	require.GreaterOrEqual(t, time.Since(start), delay)
	requireEngine(t, r)

	// With a status the delay comes first, then the error.
	b.proxy.Set(faultproxy.Fault{Delay: delay, Status: 503})
	start = time.Now()
	r = get(t, b.client, b.proxy.URL()+"/")
	require.GreaterOrEqual(t, time.Since(start), delay)
	requireEngineError(t, r, 503, "cluster_block_exception")
}

func TestDelayClientGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.Set(faultproxy.Fault{Delay: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.proxy.URL()+"/", nil)
	require.NoError(t, err)
	start := time.Now()
	_, err = b.client.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestReceived: the log names each request and when it ended, a request
// still held by a Delay included.
func TestReceived(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := do(t, b.client, http.MethodGet, b.proxy.URL()+"/_cluster/health", "")
	require.NoError(t, err)
	b.proxy.Set(faultproxy.Fault{Delay: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.proxy.URL()+"/i/_bulk", nil)
	require.NoError(t, err)
	go func() { _, _ = b.client.Do(req) }()
	harness.Eventually(t, 5*time.Second, "the held request", func() bool { return len(b.proxy.Received()) == 2 })
	got := b.proxy.Received()
	require.Equal(t, []string{"GET /_cluster/health", "POST /i/_bulk"}, []string{got[0].Method + " " + got[0].Path, got[1].Method + " " + got[1].Path})
	require.Equal(t, 1, b.proxy.RequestsTo("/_bulk"))
	require.False(t, got[0].End.IsZero(), "answered")
	require.True(t, got[1].End.IsZero(), "in flight")
	cancel()
	harness.Eventually(t, 5*time.Second, "the held request's end", func() bool { return !b.proxy.Received()[1].End.IsZero() })
}

func TestReset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A fresh connection per request: Go's transport silently retries an
	// idempotent request that failed on a reused keep-alive connection.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

	b.proxy.Set(faultproxy.Fault{Reset: true})
	_, err := do(t, c, http.MethodPost, b.proxy.URL()+"/_bulk", `{"index":{"_index":"x","_id":"1"}}`+"\n"+`{"a":1}`+"\n")
	require.Error(t, err)
	require.True(t,
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF),
		"want a connection reset or EOF, got %v", err)
	require.EqualValues(t, 1, b.proxy.Requests())
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := b.proxy.URL()
	// Leaves a pooled keep-alive connection that Refuse must drop too.
	requireEngine(t, get(t, b.client, url+"/"))

	b.proxy.Set(faultproxy.Fault{Refuse: true})
	for range 2 {
		_, err := do(t, b.client, http.MethodGet, url+"/", "")
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
	}
	require.EqualValues(t, 1, b.proxy.Requests())

	b.proxy.Clear()
	require.Equal(t, url, b.proxy.URL())
	requireEngine(t, get(t, b.client, url+"/"))
}

func TestTimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.Set(faultproxy.Fault{Status: 429, RetryAfter: "1", Times: 2})
	for range 2 {
		requireEngineError(t, get(t, b.client, b.proxy.URL()+"/"), 429, "es_rejected_execution_exception")
	}
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	require.EqualValues(t, 4, b.proxy.Requests())
}

func TestPathSuffix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.Set(faultproxy.Fault{Status: 429, Times: 1, PathSuffix: "/_cluster/health"})
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	requireEngineError(t, get(t, b.client, b.proxy.URL()+"/_cluster/health"), 429, "es_rejected_execution_exception")
	require.Equal(t, http.StatusOK, get(t, b.client, b.proxy.URL()+"/_cluster/health").status, "Times counts matching requests only")
	require.EqualValues(t, 3, b.proxy.Requests())
}

func TestClearRestoresForwarding(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.Set(faultproxy.Fault{Status: 503})
	requireEngineError(t, get(t, b.client, b.proxy.URL()+"/"), 503, "cluster_block_exception")
	requireEngineError(t, get(t, b.client, b.proxy.URL()+"/"), 503, "cluster_block_exception")
	b.proxy.Clear()
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	require.EqualValues(t, 3, b.proxy.Requests())
}

func TestNewAndClose(t *testing.T) {
	t.Parallel()
	_, err := faultproxy.New("127.0.0.1:9200")
	require.Error(t, err, "a target without a scheme must be rejected")

	p, err := faultproxy.New(harness.ElasticURL(t))
	require.NoError(t, err)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	requireEngine(t, get(t, c, p.URL()+"/"))
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, err = do(t, c, http.MethodGet, p.URL()+"/", "")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
}

// timedGet is one GET through c and how long it took.
func timedGet(t *testing.T, c *http.Client, url string) (response, time.Duration) {
	t.Helper()
	start := time.Now()
	r := get(t, c, url)
	return r, time.Since(start)
}

// latencySlack is what a request may take beyond the delay added: the
// engine's own answer and a busy shared machine (under the whole suite a
// bare request has taken 300 ms). The delays below are large enough that
// a delay applied twice still exceeds the bound.
const latencySlack = 500 * time.Millisecond

func TestLatencyBothWays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const fixed, jitter = 400 * time.Millisecond, 100 * time.Millisecond
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/")) // a pooled connection, so dialing is not timed

	b.proxy.SetDelay(fixed, jitter)
	for range 3 {
		r, took := timedGet(t, b.client, b.proxy.URL()+"/")
		requireEngine(t, r)
		require.GreaterOrEqual(t, took, 2*fixed, "the request and the response each wait at least fixed")
		require.LessOrEqual(t, took, 2*(fixed+jitter)+latencySlack)
	}
}

func TestLatencyOneWay(t *testing.T) {
	t.Parallel()
	const fixed = 600 * time.Millisecond
	for _, dir := range []faultproxy.Direction{faultproxy.Requests, faultproxy.Responses} {
		b := setup(t)
		requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
		b.proxy.SetDelayOn(dir, fixed, 0)
		r, took := timedGet(t, b.client, b.proxy.URL()+"/")
		requireEngine(t, r)
		require.GreaterOrEqual(t, took, fixed, "direction %d", dir)
		require.Less(t, took, fixed+latencySlack, "direction %d: one way only", dir)
	}
}

func TestLatencyJitterVaries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jitter = 200 * time.Millisecond
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	b.proxy.SetDelay(0, jitter)
	var lo, hi time.Duration
	for i := range 10 {
		_, took := timedGet(t, b.client, b.proxy.URL()+"/")
		require.LessOrEqual(t, took, 2*jitter+latencySlack)
		if i == 0 || took < lo {
			lo = took
		}
		hi = max(hi, took)
	}
	// Ten sums of two uniform draws over [0, 200 ms] all within 20 ms of
	// each other: about one chance in 10^12.
	require.Greater(t, hi-lo, 20*time.Millisecond, "jitter is drawn per request")
}

func TestLatencyOutlivesFaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const fixed = 500 * time.Millisecond
	requireEngine(t, get(t, b.client, b.proxy.URL()+"/"))
	b.proxy.SetDelay(fixed, 0)

	b.proxy.Set(faultproxy.Fault{Status: 503})
	r, took := timedGet(t, b.client, b.proxy.URL()+"/")
	requireEngineError(t, r, 503, "cluster_block_exception")
	require.GreaterOrEqual(t, took, 2*fixed, "a faulted request crosses the slow network too")

	b.proxy.Clear()
	r, took = timedGet(t, b.client, b.proxy.URL()+"/")
	requireEngine(t, r)
	require.GreaterOrEqual(t, took, 2*fixed, "Clear leaves the latency")

	b.proxy.SetDelay(0, 0)
	r, took = timedGet(t, b.client, b.proxy.URL()+"/")
	requireEngine(t, r)
	require.Less(t, took, fixed, "SetDelay(0, 0) removes it")
}

// TestRefuseRightAfterStart: a proxy refused before its server goroutine
// has run refuses at once, as a stopped engine does; it used to accept the
// connection into the kernel's backlog and reset it a moment later, which a
// client reads as a request that may have been sent.
func TestRefuseRightAfterStart(t *testing.T) {
	t.Parallel()
	for range 200 {
		p, err := faultproxy.New("http://127.0.0.1:9")
		require.NoError(t, err)
		p.Set(faultproxy.Fault{Refuse: true})
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(p.URL(), "http://"), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.NoError(t, p.Close())
	}
}
