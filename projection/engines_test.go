package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TestEngineIsRealAndTested makes sure the tests in this package talk to a
// real engine of a tested line, at the tested version, and that the daemon's
// Identify and the harness agree on what it is.
func TestEngineIsRealAndTested(t *testing.T) {
	t.Parallel()
	want := harness.Engine(t)
	client, err := NewElasticClient(ElasticOptions{URL: harness.ElasticURL(t)})
	require.NoError(t, err)
	got, err := Identify(context.Background(), client)
	require.NoError(t, err)
	require.Equal(t, want.Name, got.Line())
	require.Equal(t, want.Version, got.Version)
	tested, ok := got.Tested()
	require.True(t, ok, "%s is of no tested line", got)
	require.Equal(t, tested.Version, got.Version, "the stack runs another version than TestedEngines says")

	resp, err := http.Get(harness.ElasticURL(t) + "/_cluster/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	switch got.Distribution {
	case "elasticsearch":
		require.Equal(t, "Elasticsearch", resp.Header.Get("X-Elastic-Product"))
	case "opensearch":
		require.Empty(t, resp.Header.Get("X-Elastic-Product"))
	default:
		t.Fatalf("distribution %q", got.Distribution)
	}

	probe := NewEngineProbe(client, harness.ElasticURL(t))
	require.NoError(t, probe.Ping(context.Background()))
}

// The tested engines live in code here, in scripts/stack.sh (what the tests
// start), in testdata (their captured responses) and in README.md's table.
func TestTestedEnginesAgreeWithStackAndReadme(t *testing.T) {
	t.Parallel()
	root := harness.Root(t)
	stack := func(engine string, args ...string) string {
		cmd := exec.Command(filepath.Join(root, "scripts", "stack.sh"), args...)
		cmd.Env = append(os.Environ(), "ENGINE="+engine, "WLPROJ_STACK_ENV=")
		out, err := cmd.Output()
		require.NoError(t, err, "stack.sh %v", args)
		return strings.TrimSpace(string(out))
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	var lines []string
	for _, e := range TestedEngines {
		lines = append(lines, e.Line)
		require.Equal(t, e.Version, stack(e.Line, "version"), "stack.sh runs another %s", e.Line)
		require.DirExists(t, filepath.Join(root, "testdata", e.Line), "captured responses of %s", e.Line)
		require.Contains(t, string(readme), "| `"+e.Line+"` | "+e.Version+" |", "README.md's engine table")
	}
	require.Equal(t, strings.Join(lines, " "), stack("", "engines"))
}

func TestEngineLineAndTested(t *testing.T) {
	t.Parallel()
	e := Engine{Distribution: "opensearch", Version: "2.11.1"}
	require.Equal(t, "opensearch-2", e.Line())
	require.Equal(t, "opensearch 2.11.1", e.String())
	tested, ok := e.Tested()
	require.True(t, ok)
	require.Equal(t, "opensearch-2", tested.Line)
	_, ok = Engine{Distribution: "elasticsearch", Version: "6.8.23"}.Tested()
	require.False(t, ok)
	_, ok = Engine{Distribution: "opensearch", Version: "1.3.20"}.Tested()
	require.False(t, ok)
}

// fakeEngine answers GET / (unless root is "") and the cluster health.
func fakeEngine(t *testing.T, root string, answer func(w http.ResponseWriter, r *http.Request) bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answer != nil && answer(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/" && root != "":
			_, _ = w.Write([]byte(root))
		case r.URL.Path == "/":
			w.Header().Set("X-Elastic-Product", "Elasticsearch")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(`{"error":"Incorrect HTTP method for uri [/] and method [GET], allowed: [DELETE]","status":405}`))
		case r.URL.Path == "/_nodes/_local":
			w.Header().Set("X-Elastic-Product", "Elasticsearch")
			_, _ = w.Write([]byte(`{"nodes":{"x":{"version":"8.19.21"}}}`))
		case r.URL.Path == "/_cluster/health":
			_, _ = w.Write([]byte(`{"cluster_name":"c","status":"green"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestIdentify(t *testing.T) {
	t.Parallel()
	identify := func(url string) (Engine, error) {
		client, err := NewElasticClient(ElasticOptions{URL: url})
		require.NoError(t, err)
		return Identify(context.Background(), client)
	}

	e, err := identify(fakeEngine(t, `{"version":{"distribution":"opensearch","number":"2.19.6"}}`, nil).URL)
	require.NoError(t, err)
	require.Equal(t, Engine{"opensearch", "2.19.6"}, e)

	e, err = identify(fakeEngine(t, `{"version":{"number":"7.17.29","build_flavor":"oss"}}`, nil).URL)
	require.NoError(t, err)
	require.Equal(t, Engine{"elasticsearch", "7.17.29"}, e)

	// Elasticsearch 8's integ-test zip has no GET /.
	e, err = identify(fakeEngine(t, "", nil).URL)
	require.NoError(t, err)
	require.Equal(t, Engine{"elasticsearch", "8.19.21"}, e)

	_, err = identify(fakeEngine(t, "", func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("WWW-Authenticate", `Basic realm="OpenSearch Security"`)
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return true
	}).URL)
	require.Equal(t, classify.AuthError, classify.Classify(err).Reason, "%v", err)
}

// lockedBuffer is a log sink the announcing goroutine writes while the test
// reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

func TestEngineProbeAnnounce(t *testing.T) {
	t.Parallel()

	t.Run("once the engine answers, and warns on an untested one", func(t *testing.T) {
		t.Parallel()
		var refuse atomic.Int32
		refuse.Store(2)
		srv := fakeEngine(t, `{"version":{"distribution":"opensearch","number":"1.3.20"}}`, func(w http.ResponseWriter, r *http.Request) bool {
			if refuse.Add(-1) >= 0 {
				http.Error(w, "503 Service Unavailable", http.StatusServiceUnavailable)
				return true
			}
			return false
		})
		client, err := NewElasticClient(ElasticOptions{URL: srv.URL})
		require.NoError(t, err)
		var logs lockedBuffer
		p := NewEngineProbe(client, srv.URL)
		_, known := p.Engine()
		require.False(t, known)

		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		p.Announce(ctx, zerolog.New(&logs))
		require.NoError(t, ctx.Err(), "Announce returned once it had logged")
		e, known := p.Engine()
		require.True(t, known)
		require.Equal(t, "opensearch 1.3.20", e.String())

		lines := logs.lines(t)
		require.Len(t, lines, 2, "one line for the 503s, one for the engine: %v", lines)
		require.Equal(t, "warn", lines[0]["level"])
		require.Equal(t, classify.ServerError, lines[0]["reason"])
		require.Equal(t, "warn", lines[1]["level"])
		require.Equal(t, "opensearch", lines[1]["engine"])
		require.Equal(t, "1.3.20", lines[1]["version"])
		require.Contains(t, lines[1]["message"], "untested engine")
	})

	t.Run("refused credentials: an error without the password, and a ping naming the engine's URL", func(t *testing.T) {
		t.Parallel()
		srv := fakeEngine(t, "", func(w http.ResponseWriter, r *http.Request) bool {
			if _, pw, _ := r.BasicAuth(); pw != "right" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error":{"type":"security_exception","reason":"unable to authenticate user [wlproj] for REST request [/]"},"status":401}`))
				return true
			}
			return false
		})
		url := strings.Replace(srv.URL, "http://", "http://wlproj:s3cr3t-wrong@", 1)
		client, err := NewElasticClient(ElasticOptions{URL: url})
		require.NoError(t, err)
		var logs lockedBuffer
		p := NewEngineProbe(client, url)
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		p.Announce(ctx, zerolog.New(&logs))

		lines := logs.lines(t)
		require.Len(t, lines, 1, "logged once, not at every retry: %v", lines)
		require.Equal(t, "error", lines[0]["level"])
		require.Equal(t, classify.AuthError, lines[0]["reason"])
		require.Equal(t, srv.URL, lines[0]["url"])

		err = p.Ping(context.Background())
		require.Error(t, err)
		ce := classify.Classify(err)
		require.Equal(t, classify.AuthError, ce.Reason)
		require.Equal(t, http.StatusUnauthorized, ce.Status)
		require.Contains(t, err.Error(), srv.URL)
		require.Contains(t, err.Error(), "security_exception")
		for _, out := range []string{err.Error(), logs.String()} {
			require.NotContains(t, out, "s3cr3t")
		}
	})
}
