package e2e

// TLS with credentials, end to end through the real binary: the engine
// behind HTTPS with a certificate from a throwaway CA and basic auth, as
// ELASTIC_CA_FILE, ELASTIC_USERNAME and ELASTIC_PASSWORD configure it.

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// securedEngine is the engine as wlproj sees it in this test: an https URL
// that wants basic auth.
type securedEngine struct {
	url    string
	kind   string
	client *http.Client
	user   string
	pass   string
}

// startSecuredEngine is the engine's own security on Elasticsearch 8 and
// later, where it is on by default (the shared node of TestTLS, with x-pack
// security; the integ-test zip carries it), else a TLS-terminating proxy
// with basic auth in front of the engine under test, answering wrong
// credentials as OpenSearch's security plugin does (OpenSearch's integ-test
// zip has none). Elasticsearch 7, whose security is off by default, gets the
// proxy too: its leg runs the whole suite, where this test need not wait
// for the node the API key test starts.
func startSecuredEngine(t *testing.T, ca *harness.CA, shared *sharedSecuredNode) securedEngine {
	t.Helper()
	user, password := shared.user, shared.password
	e := securedEngine{user: user, pass: password,
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}}
	if engine := harness.Engine(t); engine.Distribution == "elasticsearch" && engine.Name != "elasticsearch-7" {
		if node := shared.get(t); node != nil {
			e.url, e.kind = node.URL, node.Engine.Name+"'s own security"
			return e
		}
	}

	target, err := url.Parse(harness.ElasticURL(t))
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u+"\x00"+p), []byte(user+"\x00"+password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="OpenSearch Security"`)
			w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, "Unauthorized")
			return
		}
		r.Header.Del("Authorization")
		proxy.ServeHTTP(w, r)
	}))
	srv.TLS, err = ca.TLSConfig()
	require.NoError(t, err)
	// The refused handshakes are the test's point, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	e.url, e.kind = srv.URL, "a TLS proxy with basic auth in front of "+harness.Engine(t).Name
	return e
}

// do sends one request with the credentials; any status but 2xx fails.
func (e securedEngine) do(t *testing.T, method, path, body string, out any) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth(e.user, e.pass)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	require.Less(t, resp.StatusCode, 300, "%s %s: %s", method, path, data)
	if out != nil {
		require.NoError(t, json.Unmarshal(data, out))
	}
}

// testTLSWithCredentials is TestTLS/WithCredentials: the engine behind TLS
// with a certificate of ca and basic auth.
func testTLSWithCredentials(t *testing.T, ca *harness.CA, shared *sharedSecuredNode) {
	otherCA, err := harness.NewCA("another CA")
	require.NoError(t, err)
	engine := startSecuredEngine(t, ca, shared)
	user, password := engine.user, engine.pass
	t.Logf("engine: %s at %s", engine.kind, engine.url)

	dir := t.TempDir()
	caFile, otherCAFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other-ca.pem")
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o644))
	require.NoError(t, os.WriteFile(otherCAFile, otherCA.PEM, 0o644))

	mapping, err := os.ReadFile(filepath.Join(harness.Root(t), "testdata", "mapping.json"))
	require.NoError(t, err)
	index := harness.UniqueName("wlproj-t-")
	engine.do(t, http.MethodPut, "/"+index, string(mapping), nil)
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, engine.url+"/"+index, nil)
		req.SetBasicAuth(user, password)
		if resp, err := engine.client.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	db := harness.NewDatabase(t)
	env := func(settings ...string) []string {
		return harness.ReplicaEnv(db.URL, engine.url, index, slices.Concat(harness.Quick, []string{
			"OUTBOX_REQUIRE_ES_READY=true", "OUTBOX_MAX_ATTEMPTS=1000",
			"ELASTIC_CA_FILE=" + caFile, "ELASTIC_USERNAME=" + user, "ELASTIC_PASSWORD=" + password,
		}, settings)...)
	}
	produce := func(from, to int) {
		db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
			SELECT 'book', g::text, 'upsert', 1, jsonb_build_object('kind', 'book', 'title', 'Book ' || g)
			  FROM generate_series($1::int, $2::int) g`, from, to)
	}
	docs := func() int {
		engine.do(t, http.MethodPost, "/"+index+"/_refresh", "", nil)
		var c struct {
			Count int `json:"count"`
		}
		engine.do(t, http.MethodGet, "/"+index+"/_count", "", &c)
		return c.Count
	}
	// Everything the operator could see: logs, /readyz, and below the CLI's
	// output. None of it may hold the password.
	var seen output
	readyz := func(r *harness.Replica, want int) string {
		t.Helper()
		var body string
		harness.Eventually(t, 20*time.Second, r.Name+" /readyz", func() bool {
			code, b, err := r.Get("/readyz")
			body = string(b)
			return err == nil && code == want
		})
		seen.add("/readyz of "+r.Name, body)
		return body
	}
	stop := func(r *harness.Replica) {
		r.Stop(10 * time.Second)
		seen.add("logs of "+r.Name, r.Logs())
	}
	// refused runs a replica with setting until the events from..to are
	// each pending for reason, as where also says, and it has logged reason
	// as an error; it returns the replica's /readyz body, a 503.
	refused := func(t *testing.T, name, setting string, from, to int, reason, where string) string {
		t.Helper()
		r := harness.StartReplica(t, name, env(setting))
		harness.Leader(t, r)
		produce(from, to)
		harness.Eventually(t, 20*time.Second, "events classified as "+reason, func() bool {
			return db.Count(t, `entity_id::int >= $1 AND status = 'pending' AND error_reason = $2 AND `+where, from, reason) == to-from+1
		})
		body := readyz(r, http.StatusServiceUnavailable)
		harness.Eventually(t, 10*time.Second, "an error logged for "+reason, func() bool {
			return hasLogLine(r.Logs(), "error", func(l logLine) bool { return l.Reason == reason })
		})
		stop(r)
		return body
	}

	t.Run("events drain through TLS and basic auth", func(t *testing.T) {
		r := harness.StartReplica(t, "tls-good", env())
		harness.Leader(t, r)
		produce(1, 50)
		harness.Drained(t, db.Pool, 30*time.Second)
		require.Equal(t, 50, db.Count(t, `status = 'done'`))
		require.Equal(t, 50, docs())
		require.Contains(t, readyz(r, http.StatusOK), `"elasticsearch":"ok"`)
		want := harness.Engine(t)
		harness.Eventually(t, 10*time.Second, "the engine's name and version logged", func() bool {
			return hasLogLine(r.Logs(), "info", func(l logLine) bool {
				return l.Engine == want.Distribution && l.Version == want.Version
			})
		})
		stop(r)
	})

	t.Run("a wrong password: auth_error, retried, /readyz names the engine", func(t *testing.T) {
		body := refused(t, "tls-wrong-password", "ELASTIC_PASSWORD=not-"+password, 51, 60, "auth_error",
			`error_class = 'transient' AND attempts >= 2`)
		require.Zero(t, db.Count(t, `status = 'failed'`), "an operator's mistake fails no event")
		require.Contains(t, body, `"elasticsearch":"answered 401: `+engine.url+`: auth_error: `)
		require.Contains(t, body, `"database":"ok"`)

		// Fixed: the same events drain, nothing was lost.
		r := harness.StartReplica(t, "tls-fixed", env())
		harness.Leader(t, r)
		harness.Drained(t, db.Pool, 30*time.Second)
		require.Equal(t, 60, db.Count(t, `status = 'done'`))
		require.Equal(t, 60, docs())
		stop(r)
	})

	t.Run("a certificate from another CA is refused", func(t *testing.T) {
		body := refused(t, "tls-other-ca", "ELASTIC_CA_FILE="+otherCAFile, 61, 65, "tls_error",
			`last_error LIKE '%certificate signed by unknown authority%'`)
		require.Contains(t, body, `"elasticsearch":"unreachable: `+engine.url+`: tls_error: `)
	})

	t.Run("the password is in no output", func(t *testing.T) {
		cli := func(args ...string) {
			cmd := exec.Command(harness.Binary(t), args...)
			cmd.Env = append(os.Environ(), env()...)
			out, _ := cmd.CombinedOutput()
			seen.add("wlproj "+strings.Join(args, " "), string(out))
		}
		cli("run", "--help")
		cli("status")
		cli("status", "--json")
		cli("failed", "list")
		cli("failed", "stats")
		// A run that cannot start: its error is printed.
		cli("run", "--http-port=0")
		var history string
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(string_agg(coalesce(last_error, '') || error_history::text, ' '), '') FROM outbox_events`).Scan(&history))
		seen.add("last_error and error_history", history)
		for _, s := range seen.all() {
			require.NotContains(t, s.text, password, "%s shows the password", s.what)
			require.NotContains(t, s.text, "not-"+password, "%s shows the wrong password", s.what)
		}
		require.GreaterOrEqual(t, len(seen.all()), 10)
	})
}

// logLine is the fields of a JSON log line that the test looks at, never
// its wording.
type logLine struct {
	Level   string `json:"level"`
	Reason  string `json:"reason"`
	Engine  string `json:"engine"`
	Version string `json:"version"`
}

// hasLogLine reports a JSON log line at level that match accepts.
func hasLogLine(logs, level string, match func(logLine) bool) bool {
	for _, line := range strings.Split(logs, "\n") {
		var l logLine
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == level && match(l) {
			return true
		}
	}
	return false
}

// output collects what the operator could see.
type output struct {
	mu    sync.Mutex
	texts []seenText
}

type seenText struct{ what, text string }

func (o *output) add(what, text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.texts = append(o.texts, seenText{what, text})
}

func (o *output) all() []seenText {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.texts)
}
