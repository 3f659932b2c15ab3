package e2e

// API keys end to end through the real binary, against Elasticsearch's own
// security over TLS: a key with the privileges the runbook recommends,
// created by the node's superuser, as ELASTIC_API_KEY in both its forms.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// wlprojKeyRoles is the role descriptor the runbook's API-key how-to
// creates, for index: cluster health and the node's identity (monitor),
// and on the index, its alias and the indexes behind it, the documents
// (read for verify, write for the bulks) and the index itself (manage:
// created with its alias at first start, and its gc_deletes setting read).
func wlprojKeyRoles(index string) string {
	return fmt.Sprintf(`{"wlproj": {"cluster": ["monitor"],
		"indices": [{"names": [%q, %q], "privileges": ["read", "write", "manage"]}]}}`, index, index+"-*")
}

// testTLSWithAPIKey is TestTLS/WithAPIKey: keys of the shared node, whose
// certificate ca issued.
func testTLSWithAPIKey(t *testing.T, ca *harness.CA, shared *sharedSecuredNode) {
	node := shared.get(t)
	if node == nil {
		t.Skipf("%s: its integ-test zip has no security plugin, so no API keys", harness.Engine(t).Name)
	}
	ctx := context.Background()
	t.Logf("engine: %s's own security at %s", node.Engine.Name, node.URL)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o644))

	// The replicas create the index, behind its alias, with the key's
	// privileges alone.
	index := harness.UniqueName("wlproj-t-")
	key, err := node.CreateAPIKey(ctx, "wlproj", wlprojKeyRoles(index))
	require.NoError(t, err)
	require.NotContains(t, key.Encoded, key.Key, "the test looks for both in the outputs")

	db := harness.NewDatabase(t)
	sessionKey := filepath.Join(t.TempDir(), "session.key")
	require.NoError(t, os.WriteFile(sessionKey, []byte(harness.UniqueName("session-key-")+harness.UniqueName("-")), 0o600))
	const consoleUser, consolePassword = "ada", "console-pw"
	env := func(settings ...string) []string {
		return harness.ReplicaEnv(db.URL, node.URL, index, slices.Concat(harness.Quick, []string{
			"OUTBOX_REQUIRE_ES_READY=true", "OUTBOX_MAX_ATTEMPTS=1000", "ELASTIC_CA_FILE=" + caFile,
			"OUTBOX_CONSOLE_USERS_FILE=" + consoleUsers(t, consoleUser, consolePassword),
			"OUTBOX_CONSOLE_SESSION_KEY_FILE=" + sessionKey,
		}, settings)...)
	}
	produce := func(from, to int) {
		db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
			SELECT 'book', g::text, 'upsert', 1, jsonb_build_object('kind', 'book', 'title', 'Book ' || g)
			  FROM generate_series($1::int, $2::int) g`, from, to)
	}
	docs := func() int {
		require.NoError(t, node.Do(ctx, http.MethodPost, "/"+index+"/_refresh", nil, nil))
		var c struct {
			Count int `json:"count"`
		}
		require.NoError(t, node.Do(ctx, http.MethodGet, "/"+index+"/_count", nil, &c))
		return c.Count
	}
	// Everything the operator could see; none of it may hold a key.
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
		t.Helper()
		_, metrics, err := r.Get("/metrics")
		require.NoError(t, err)
		seen.add("/metrics of "+r.Name, string(metrics))
		for _, page := range consolePages(t, r, consoleUser, consolePassword) {
			seen.add("console of "+r.Name, page)
		}
		r.Stop(10 * time.Second)
		seen.add("logs of "+r.Name, r.Logs())
	}
	drains := func(t *testing.T, name, apiKey string, from, to int) {
		t.Helper()
		r := harness.StartReplica(t, name, env("ELASTIC_API_KEY="+apiKey))
		harness.Leader(t, r)
		produce(from, to)
		harness.Drained(t, db.Pool, 30*time.Second)
		require.Equal(t, to, db.Count(t, `status = 'done'`))
		require.Equal(t, to, docs())
		require.Contains(t, readyz(r, http.StatusOK), `"elasticsearch":"ok"`)
		stop(r)
	}

	t.Run("events drain with the id:key pair", func(t *testing.T) {
		drains(t, "apikey-pair", key.Pair(), 1, 40)
		var aliases map[string]any
		require.NoError(t, node.Do(ctx, http.MethodGet, "/_alias/"+index, nil, &aliases))
		require.Len(t, aliases, 1, "the replica created the index behind its alias with the key")
	})

	t.Run("and with its base64 form", func(t *testing.T) {
		drains(t, "apikey-encoded", key.Encoded, 41, 80)
	})

	t.Run("wlproj verify reads the index with the key", func(t *testing.T) {
		cmd := exec.Command(harness.Binary(t), "verify")
		cmd.Env = append(os.Environ(), env("ELASTIC_API_KEY="+key.Encoded)...)
		out, err := cmd.CombinedOutput()
		seen.add("wlproj verify", string(out))
		require.NoError(t, err, "%s", out)
	})

	// refused runs a replica with apiKey until the events from..to are each
	// pending as a transient auth_error, retried, none failed; it returns
	// the replica, still running.
	refused := func(t *testing.T, name, apiKey string, from, to int) *harness.Replica {
		t.Helper()
		r := harness.StartReplica(t, name, env("ELASTIC_API_KEY="+apiKey))
		harness.Leader(t, r)
		produce(from, to)
		harness.Eventually(t, 20*time.Second, "events pending as auth_error", func() bool {
			return db.Count(t, `entity_id::int BETWEEN $1 AND $2 AND status = 'pending' AND error_reason = 'auth_error'
				AND error_class = 'transient' AND attempts >= 2`, from, to) == to-from+1
		})
		require.Zero(t, db.Count(t, `status = 'failed'`), "wrong credentials fail no event")
		return r
	}

	t.Run("a key without the write privilege: auth_error (403), retried", func(t *testing.T) {
		readOnly, err := node.CreateAPIKey(ctx, "wlproj-read-only", fmt.Sprintf(`{"wlproj": {"cluster": ["monitor"],
			"indices": [{"names": [%q, %q], "privileges": ["read", "view_index_metadata"]}]}}`, index, index+"-*"))
		require.NoError(t, err)
		r := refused(t, "apikey-read-only", readOnly.Encoded, 81, 85)
		require.Equal(t, 5, db.Count(t, `entity_id::int BETWEEN 81 AND 85 AND last_error LIKE '%403 security_exception%'`))
		// The key may read the cluster's health: the replica looks ready
		// (the runbook says so) while its writes are refused.
		readyz(r, http.StatusOK)
		stop(r)
	})

	t.Run("an invalidated key: auth_error, retried, nothing failed", func(t *testing.T) {
		require.NoError(t, node.InvalidateAPIKey(ctx, key.ID))
		r := refused(t, "apikey-invalidated", key.Encoded, 86, 95)
		require.Contains(t, readyz(r, http.StatusServiceUnavailable), `"elasticsearch":"answered 401: `+node.URL+`: auth_error: `)
		harness.Eventually(t, 10*time.Second, "an error logged for auth_error", func() bool {
			return hasLogLine(r.Logs(), "error", func(l logLine) bool { return l.Reason == "auth_error" })
		})
		stop(r)

		// A new key: these events, and the read-only key's, drain; nothing
		// was lost.
		fresh, err := node.CreateAPIKey(ctx, "wlproj-2", wlprojKeyRoles(index))
		require.NoError(t, err)
		drains(t, "apikey-fresh", fresh.Pair(), 96, 100)
	})

	t.Run("the key is in no output", func(t *testing.T) {
		malformed := harness.UniqueName("not-a-key-")
		cli := func(wantCode int, setting string, args ...string) string {
			t.Helper()
			cmd := exec.Command(harness.Binary(t), args...)
			cmd.Env = append(os.Environ(), env("ELASTIC_API_KEY="+key.Encoded, setting)...)
			out, _ := cmd.CombinedOutput()
			seen.add("wlproj "+strings.Join(args, " ")+" with "+setting, string(out))
			require.Equal(t, wantCode, cmd.ProcessState.ExitCode(), "wlproj %s: %s", strings.Join(args, " "), out)
			return string(out)
		}
		for _, cmd := range []string{"run", "verify", "rebuild"} {
			out := cli(0, "", cmd, "--help")
			require.Contains(t, out, "$ELASTIC_API_KEY", "wlproj %s --help names the variable", cmd)
		}
		cli(0, "", "status")
		cli(0, "", "status", "--json")
		cli(0, "", "failed", "stats")
		out := cli(2, "ELASTIC_API_KEY="+malformed, "run")
		require.Contains(t, out, "ELASTIC_API_KEY must be the id:key pair or its base64 form")
		require.NotContains(t, out, malformed)
		out = cli(2, "ELASTIC_USERNAME=admin", "run")
		require.Contains(t, out, "ELASTIC_API_KEY cannot be used with ELASTIC_USERNAME or ELASTIC_PASSWORD")
		out = cli(2, "ELASTIC_API_KEY="+malformed, "verify")
		require.Contains(t, out, "ELASTIC_API_KEY must be")
		var history string
		require.NoError(t, db.Pool.QueryRow(ctx,
			`SELECT coalesce(string_agg(coalesce(last_error, '') || error_history::text, ' '), '') FROM outbox_events`).Scan(&history))
		require.Contains(t, history, "auth_error", "the refused attempts are recorded")
		seen.add("last_error and error_history", history)

		secrets := map[string]string{"the key's secret": key.Key, "the encoded key": key.Encoded, "a malformed key": malformed}
		for _, s := range seen.all() {
			for what, secret := range secrets {
				require.NotContains(t, s.text, secret, "%s shows %s", s.what, what)
			}
		}
		require.GreaterOrEqual(t, len(seen.all()), 25)
	})
}

// consoleUsers is a console users file with one operator.
func consoleUsers(t *testing.T, user, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(path, []byte(user+":"+string(h)+"\n"), 0o600))
	return path
}

var reConsoleCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// consolePages signs in to r's console and returns the pages an operator
// reads: the overview and the failed list.
func consolePages(t *testing.T, r *harness.Replica, user, password string) []string {
	t.Helper()
	get := consoleSession(t, r, user, password)
	return []string{get(""), get("failed")}
}

// consoleSession signs in to r's console and returns a reader of its pages
// (a path under /console/), each of which must answer 200.
func consoleSession(t *testing.T, r *harness.Replica, user, password string) func(path string) string {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	base := fmt.Sprintf("http://127.0.0.1:%d/console/", r.HTTPPort)
	get := func(path string) string {
		resp, err := c.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "console %s: %s", path, b)
		return string(b)
	}
	m := reConsoleCSRF.FindStringSubmatch(get("signin"))
	require.NotNil(t, m, "the sign-in form's token")
	resp, err := c.PostForm(base+"signin", url.Values{"user": {user}, "password": {password}, "csrf": {m[1]}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, get(""), "signout", "signed in")
	return get
}
