package console

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

// Passwords of the test users: ada operates, viv only looks.
const (
	adaPassword = "ada-secret-1"
	vivPassword = "viv-secret-2"
)

type bundle struct {
	db    harness.DB
	ctx   context.Context
	con   *Console
	srv   *httptest.Server
	state leader.State
}

type setupOption func(*Config, *Deps)

// setup is a console on a database of the test's own, served by an
// httptest server under /console/ as the HTTP listener mounts it.
func setup(t *testing.T, opts ...setupOption) *bundle {
	t.Helper()
	b := &bundle{db: harness.NewDatabase(t), ctx: context.Background()}
	b.state = leader.State{Role: leader.RoleLeader, WorkerID: "replica-a", Epoch: 3, Since: time.Now()}
	cfg := Config{UsersFile: usersFile(t), ReadOnlyUsers: []string{"viv"}}
	deps := Deps{Pool: b.db.Pool, State: func() leader.State { return b.state }, LeaderName: "wlproj",
		Projections: []string{"search", "chronicle"}, Log: zerolog.Nop()}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	var err error
	b.con, err = New(cfg, deps)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(Prefix, b.con.Handler())
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	t.Cleanup(b.con.Stop)
	return b
}

// usersFile writes ada and viv with htpasswd's $2y$ prefix.
func usersFile(t *testing.T) string {
	t.Helper()
	var lines []string
	for _, u := range [][2]string{{"ada", adaPassword}, {"viv", vivPassword}} {
		h, err := bcrypt.GenerateFromPassword([]byte(u[1]), bcrypt.MinCost)
		require.NoError(t, err)
		lines = append(lines, u[0]+":"+strings.Replace(string(h), "$2a$", "$2y$", 1))
	}
	path := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(path, []byte("# console users\n"+strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

// client is a browser without a browser: a cookie jar, and forms posted
// with the token of the page they came from.
type client struct {
	t    *testing.T
	base string
	http *http.Client
	csrf string
}

func (b *bundle) client(t *testing.T) *client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: b.srv.URL, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

var reCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

type response struct {
	code     int
	body     string
	location string
	header   http.Header
}

func (c *client) do(req *http.Request) response {
	c.t.Helper()
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if m := reCSRF.FindSubmatch(body); m != nil {
		c.csrf = string(m[1])
	}
	return response{code: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

func (c *client) get(path string) response {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	require.NoError(c.t, err)
	return c.do(req)
}

// post sends form with the client's current token, unless form has one.
func (c *client) post(path string, form url.Values) response {
	c.t.Helper()
	if !form.Has("csrf") {
		form.Set("csrf", c.csrf)
	}
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

func (c *client) signIn(user, password string) response {
	c.t.Helper()
	c.get(Prefix + "signin")
	return c.post(Prefix+"signin", url.Values{"user": {user}, "password": {password}})
}

// operator and viewer are signed-in clients.
func (b *bundle) operator(t *testing.T) *client {
	t.Helper()
	c := b.client(t)
	require.Equal(t, http.StatusSeeOther, c.signIn("ada", adaPassword).code)
	c.get(Prefix) // the signed-in session's token
	return c
}

func (b *bundle) viewer(t *testing.T) *client {
	t.Helper()
	c := b.client(t)
	require.Equal(t, http.StatusSeeOther, c.signIn("viv", vivPassword).code)
	c.get(Prefix)
	return c
}

// failed inserts n failed rows of reason, failed ago, and returns their ids.
func (b *bundle) failed(t *testing.T, n int, reason string, ago time.Duration) []int64 {
	t.Helper()
	return harness.Column[int64](t, b.db, `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload, scope_key, status, attempts,
		                           error_class, error_reason, last_error, error_history, updated_at)
		SELECT 'book', 'b' || g, 'upsert', jsonb_build_object('title', 'Book ' || g), 'lib-' || (g % 3), 'failed', 3,
		       CASE WHEN $2 IN ('mapping_error', 'parse_error', 'payload_invalid') THEN 'deterministic' ELSE 'transient' END,
		       $2, 'bulk item: ' || $2 || ' on field f' || g,
		       jsonb_build_array(jsonb_build_object('at', now(), 'attempt', 3, 'class', 'x', 'reason', $2, 'error', 'boom')),
		       now() - make_interval(secs => $3) - make_interval(secs => g)
		  FROM generate_series(1, $1) g
		RETURNING id`, n, reason, ago.Seconds())
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	return b.db.Count(t, where, args...)
}

func (b *bundle) audits(t *testing.T) int {
	t.Helper()
	return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit`)
}

func TestPagesRender(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 3, "mapping_error", time.Hour)
	c := b.operator(t)
	for _, path := range []string{Prefix, Prefix + "failed", Prefix + "archived", Prefix + "events/" + itoa(ids[0]), Prefix + "audit"} {
		r := c.get(path)
		require.Equal(t, http.StatusOK, r.code, "%s: %s", path, r.body)
	}
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }
