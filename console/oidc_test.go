package console

// Single sign-on against a real OpenID provider: Dex, started by each test
// on loopback (internal/testkit/dex), its password database holding grace,
// the console on a database of the test's own. The client is the test's
// cookie-jar browser; Dex's login form is posted as a person would.

import (
	"html"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/oauth2"

	"github.com/wlproj/wlproj/internal/testkit/dex"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

const (
	graceEmail    = "grace@example.com"
	gracePassword = "grace-secret-3"
)

var graceGroups = []string{"wlproj-operators", "sre"}

// ssoPolicy is the policy of the single sign-on tests, unless one gives
// its own.
const ssoPolicy = `
roles:
  operator:
    actions: [view, replay, discard, archive, restore, pause, unmask]
    projections: ["*"]
    scopes: ["*"]
  viewer:
    actions: [view]
    projections: ["*"]
    scopes: ["*"]
users:
  ada: [operator]
  viv: [viewer]
groups:
  sre: [viewer]
`

// oidcBundle is a console with single sign-on at dex, and the users file.
type oidcBundle struct {
	*bundle
	dex *dex.Provider
}

// setupOIDC starts Dex, with the console's callback as the client's
// redirect URI, then the console, on a listener bound first so that the
// redirect URL is known before either starts. dexPort, when not 0, is
// where Dex is to be started later, by the test.
func setupOIDC(t *testing.T, dexPort int, opts ...setupOption) *oidcBundle {
	t.Helper()
	return setupOIDCAt(t, "127.0.0.1", dexPort, opts...)
}

// setupOIDCAt is setupOIDC with Dex's issuer on dexHost.
func setupOIDCAt(t *testing.T, dexHost string, dexPort int, opts ...setupOption) *oidcBundle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	base := "http://" + ln.Addr().String()
	p := &dex.Provider{Issuer: "http://" + dexHost + ":" + itoa(int64(dexPort)) + "/dex", ClientID: "wlproj-console", ClientSecret: "unused"}
	if dexPort == 0 {
		p = startDex(t, base, dexHost, 0)
	}
	secret := filepath.Join(t.TempDir(), "oidc-secret")
	require.NoError(t, os.WriteFile(secret, []byte(p.ClientSecret+"\n"), 0o600))
	b := &bundle{db: harness.NewDatabase(t), ctx: t.Context()}
	b.state = leader.State{Role: leader.RoleLeader, WorkerID: "replica-a", Epoch: 3, Since: time.Now()}
	cfg := Config{UsersFile: usersFile(t), ReadOnlyUsers: []string{"viv"}, OIDCIssuer: p.Issuer, OIDCClientID: p.ClientID,
		OIDCClientSecretFile: secret, OIDCRedirectURL: base + OIDCCallbackPath, OIDCProviderName: "Dex"}
	// Single sign-on needs a policy: as without one, ada operates and viv
	// looks; grace's group sre looks.
	withPolicy(t, ssoPolicy)(&cfg, nil)
	deps := Deps{Pool: b.db.Pool, State: func() leader.State { return b.state }, LeaderName: "wlproj",
		Projections: []string{"search", "chronicle"}, Log: zerolog.Nop()}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	b.con, err = New(cfg, deps)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(Prefix, b.con.Handler())
	b.srv = httptest.NewUnstartedServer(mux)
	require.NoError(t, b.srv.Listener.Close())
	b.srv.Listener = ln
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	t.Cleanup(b.con.Stop)
	return &oidcBundle{bundle: b, dex: p}
}

func startDex(t *testing.T, consoleBase, host string, port int) *dex.Provider {
	t.Helper()
	return dex.Start(t, dex.Config{RedirectURIs: []string{consoleBase + OIDCCallbackPath}, Port: port, Host: host,
		Users: []dex.User{{Email: graceEmail, Password: gracePassword, Username: "grace", Groups: graceGroups}}})
}

var reRefresh = regexp.MustCompile(`<meta http-equiv="refresh" content="0;url=([^"]+)">`)

// continued is where r's page sends the browser on by itself.
func continued(t *testing.T, r response) string {
	t.Helper()
	require.Equal(t, http.StatusOK, r.code, r.body)
	m := reRefresh.FindStringSubmatch(r.body)
	require.NotNil(t, m, "no refresh in %s", r.body)
	return html.UnescapeString(m[1])
}

// ssoStart presses "Sign in with Dex" and returns the provider's URL the
// console sends the browser to.
func (c *client) ssoStart(next string) string {
	c.t.Helper()
	page := c.get(Prefix + "signin")
	require.Contains(c.t, page.body, "Sign in with Dex")
	return continued(c.t, c.post(Prefix+"oidc/start", url.Values{"next": {next}}))
}

var reForm = regexp.MustCompile(`<form method="post" action="([^"]*)"`)

// dexLogin signs in at Dex's login form as a person would and returns the
// callback URL Dex sends the browser back to, not yet followed.
func (c *client) dexLogin(authURL, email, password string) string {
	c.t.Helper()
	hc := &http.Client{Jar: c.http.Jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if req.URL.Path == OIDCCallbackPath {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := hc.Get(authURL)
	require.NoError(c.t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	_ = resp.Body.Close()
	m := reForm.FindSubmatch(body)
	require.NotNil(c.t, m, "no login form at %s: %s", resp.Request.URL, body)
	action, err := resp.Request.URL.Parse(html.UnescapeString(string(m[1])))
	require.NoError(c.t, err)
	resp, err = hc.PostForm(action.String(), url.Values{"login": {email}, "password": {password}})
	require.NoError(c.t, err)
	_ = resp.Body.Close()
	require.Contains(c.t, []int{http.StatusFound, http.StatusSeeOther}, resp.StatusCode, "dex did not send the browser back")
	cb, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	require.NoError(c.t, err)
	require.Equal(c.t, OIDCCallbackPath, cb.Path)
	return cb.String()
}

// callback follows the provider's redirect to the console.
func (c *client) callback(cb string) response {
	c.t.Helper()
	require.True(c.t, strings.HasPrefix(cb, c.base), "%s is not the console's", cb)
	return c.get(strings.TrimPrefix(cb, c.base))
}

// ssoSignIn signs grace in through Dex and returns the page she lands on.
func (c *client) ssoSignIn(next string) response {
	c.t.Helper()
	landing := continued(c.t, c.callback(c.dexLogin(c.ssoStart(next), graceEmail, gracePassword)))
	return c.get(landing)
}

// TestSingleSignOn: grace signs in through Dex's login form, lands on the
// page she asked for as herself, read-only, with her groups in the session
// row; a password user still signs in beside her; sign-out ends her session
// everywhere a copy of the cookie is.
func TestSingleSignOn(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0)
	grace := b.client(t)
	r := grace.ssoSignIn(Prefix + "audit")
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Contains(t, r.body, `<span class="who">`+graceEmail+` <span class="tag">read-only</span>`)
	require.Contains(t, r.body, "Audit log")

	var auth string
	var groups []string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT auth, groups FROM outbox_console_sessions
		WHERE username = $1 AND revoked_at IS NULL`, graceEmail).Scan(&auth, &groups))
	require.Equal(t, "oidc", auth)
	require.Equal(t, graceGroups, groups)

	ada := b.operator(t)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT auth, groups FROM outbox_console_sessions
		WHERE username = 'ada'`).Scan(&auth, &groups))
	require.Equal(t, "password", auth, "a password sign-in beside single sign-on")
	require.Empty(t, groups)
	require.Equal(t, http.StatusOK, ada.get(Prefix).code)

	stolen := b.replayed(t, grace)
	require.Equal(t, http.StatusOK, stolen.get(Prefix).code, "a copy works while the session lives")
	require.Equal(t, http.StatusSeeOther, grace.post(Prefix+"signout", url.Values{}).code)
	require.Equal(t, http.StatusSeeOther, stolen.get(Prefix).code, "the copy is signed out")
	require.Equal(t, http.StatusSeeOther, grace.get(Prefix).code)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE username = $1 AND revoked_at IS NOT NULL`, graceEmail))
}

// sessions counts grace's session rows.
func (b *oidcBundle) sessions(t *testing.T) int {
	t.Helper()
	return b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE username = $1`, graceEmail)
}

// flowCookie is the browser's flow cookie, to put back later.
func (c *client) flowCookie() *http.Cookie {
	c.t.Helper()
	for _, ck := range c.http.Jar.Cookies(mustURL(c.t, c.base+OIDCCallbackPath)) {
		if ck.Name == oidcFlowCookie {
			return ck
		}
	}
	require.FailNow(c.t, "no flow cookie")
	return nil
}

func (c *client) setFlowCookie(ck *http.Cookie) {
	c.http.Jar.SetCookies(mustURL(c.t, c.base+OIDCCallbackPath), []*http.Cookie{{Name: ck.Name, Value: ck.Value, Path: Prefix + "oidc/"}})
}

// TestCallbackRefusesWhatThisBrowserDidNotBegin: a state changed on the
// way, a callback replayed (with or without its flow cookie), another
// flow's cookie and a flow cookie with another nonce open no session.
func TestCallbackRefusesWhatThisBrowserDidNotBegin(t *testing.T) {
	t.Parallel()
	// More callbacks from one address than the default budget allows.
	b := setupOIDC(t, 0, func(c *Config, _ *Deps) { c.SignInBurst = 100 })

	t.Run("tampered state", func(t *testing.T) {
		c := b.client(t)
		cb := mustURL(t, c.dexLogin(c.ssoStart(Prefix), graceEmail, gracePassword))
		q := cb.Query()
		q.Set("state", q.Get("state")+"x")
		cb.RawQuery = q.Encode()
		r := c.callback(cb.String())
		require.Equal(t, http.StatusBadRequest, r.code, r.body)
		require.Contains(t, r.body, "does not match the one this browser began")
		require.Equal(t, http.StatusSeeOther, c.get(Prefix).code)
	})
	require.Zero(t, b.sessions(t))

	t.Run("replayed callback", func(t *testing.T) {
		c := b.client(t)
		cb := c.dexLogin(c.ssoStart(Prefix), graceEmail, gracePassword)
		flow := c.flowCookie()
		continued(t, c.callback(cb))
		require.Equal(t, 1, b.sessions(t))
		r := c.callback(cb)
		require.Equal(t, http.StatusBadRequest, r.code, "the flow cookie is gone after one callback: %s", r.body)
		thief := b.client(t)
		thief.setFlowCookie(flow)
		r = thief.callback(cb)
		require.Equal(t, http.StatusUnauthorized, r.code, "the provider takes a code once: %s", r.body)
		require.Contains(t, r.body, "did not accept the sign-in&#39;s code")
		require.Equal(t, 1, b.sessions(t), "no second session")
	})

	t.Run("another flow's cookie", func(t *testing.T) {
		mine, theirs := b.client(t), b.client(t)
		mine.ssoStart(Prefix)
		cb := theirs.dexLogin(theirs.ssoStart(Prefix), graceEmail, gracePassword)
		r := mine.callback(cb)
		require.Equal(t, http.StatusBadRequest, r.code, r.body)
		require.Equal(t, 1, b.sessions(t))
	})

	// A flow cookie as this console makes them, with the state of the
	// callback but another nonce or PKCE verifier: what a copy of an ID
	// token or a code intercepted from another sign-in would come with.
	for name, change := range map[string]func(*oidcFlow){
		"another nonce":    func(f *oidcFlow) { f.Nonce = "not-the-one-sent" },
		"another verifier": func(f *oidcFlow) { f.Verifier = oauth2.GenerateVerifier() },
	} {
		t.Run(name, func(t *testing.T) {
			c := b.client(t)
			cb := c.dexLogin(c.ssoStart(Prefix), graceEmail, gracePassword)
			var flow oidcFlow
			require.NoError(t, b.con.sessions.flows.Decode(oidcFlowCookie, c.flowCookie().Value, &flow))
			change(&flow)
			v, err := b.con.sessions.flows.Encode(oidcFlowCookie, flow)
			require.NoError(t, err)
			c.setFlowCookie(&http.Cookie{Name: oidcFlowCookie, Value: v})
			r := c.callback(cb)
			require.Equal(t, http.StatusUnauthorized, r.code, r.body)
			require.Equal(t, 1, b.sessions(t))
		})
	}
}

// TestSingleSignOnNextStaysInTheConsole: a next of another site lands on
// the overview, a console page on that page.
func TestSingleSignOnNextStaysInTheConsole(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0)
	c := b.client(t)
	start := c.ssoStart("//evil.example/x")
	landing := continued(t, c.callback(c.dexLogin(start, graceEmail, gracePassword)))
	require.Equal(t, Prefix, landing)
	c = b.client(t)
	landing = continued(t, c.callback(c.dexLogin(c.ssoStart(Prefix+"failed?class=transient"), graceEmail, gracePassword)))
	require.Equal(t, Prefix+"failed?class=transient", landing)
	require.Equal(t, http.StatusOK, c.get(landing).code)
}

// TestCallbackIsRateLimited: callbacks from one address beyond the budget
// are refused before any request to the provider, the right one included.
func TestCallbackIsRateLimited(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0, func(c *Config, _ *Deps) { c.SignInBurst, c.SignInPerMinute = 2, 1 })
	c := b.client(t)
	for range 2 {
		require.Equal(t, http.StatusBadRequest, c.get(OIDCCallbackPath+"?code=guess&state=guess").code)
	}
	cb := c.dexLogin(c.ssoStart(Prefix), graceEmail, gracePassword)
	r := c.callback(cb)
	require.Equal(t, http.StatusTooManyRequests, r.code, r.body)
	require.Equal(t, "60", r.header.Get("Retry-After"))
	require.Zero(t, b.sessions(t))
}

// TestProviderErrorIsShownByCodeOnly: the provider's error code is shown,
// its description (text anyone can put in a link) only logged.
func TestProviderErrorIsShownByCodeOnly(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0)
	c := b.client(t)
	c.ssoStart(Prefix)
	r := c.get(OIDCCallbackPath + "?error=access_denied&error_description=" + url.QueryEscape("Call 555-0100 to unlock"))
	require.Equal(t, http.StatusUnauthorized, r.code)
	require.Contains(t, r.body, "refused the sign-in (access_denied)")
	require.NotContains(t, r.body, "555-0100")
	r = c.get(OIDCCallbackPath + "?error=" + url.QueryEscape("Call 555-0100"))
	require.Contains(t, r.body, "refused the sign-in (an error)")
	require.Zero(t, b.sessions(t))
}

// TestProviderDownAtStart: a console whose provider does not answer starts
// and offers the button; pressing it says the provider does not answer;
// once the provider is up, the same console signs in through it.
func TestProviderDownAtStart(t *testing.T) {
	t.Parallel()
	port, err := harness.FreePort()
	require.NoError(t, err)
	b := setupOIDC(t, port)
	c := b.client(t)
	c.get(Prefix + "signin")
	r := c.post(Prefix+"oidc/start", url.Values{"next": {Prefix}})
	require.Equal(t, http.StatusBadGateway, r.code, r.body)
	require.Contains(t, r.body, "The sign-in provider does not answer")

	p := startDex(t, b.srv.URL, "", port)
	secret := b.con.cfg.OIDCClientSecretFile
	require.NoError(t, os.WriteFile(secret, []byte(p.ClientSecret), 0o600))
	b.con.oidc.secret = p.ClientSecret // the test's Dex makes its secret at start; a real one is configured first
	r = c.ssoSignIn(Prefix)
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Contains(t, r.body, graceEmail)
}

func TestSingleSignOnConfig(t *testing.T) {
	t.Parallel()
	sso := func(issuer, redirect string) Config {
		return Config{SessionTTL: time.Hour, OIDCIssuer: issuer, OIDCClientID: "wlproj", OIDCClientSecretFile: "s",
			OIDCRedirectURL: redirect, PolicyFile: "policy.yaml"}
	}
	const redirect = "https://wlproj.example/console/oidc/callback"
	for _, ok := range []Config{sso("https://sso.example/realms/ops", redirect), sso("http://127.0.0.1:5556/dex", redirect),
		sso("http://localhost:5556/dex", "http://127.0.0.1:8080/console/oidc/callback")} {
		require.NoError(t, ok.Validate(), ok.OIDCIssuer)
		require.True(t, ok.On())
	}
	for want, c := range map[string]Config{
		"OIDCIssuer \"http://sso.example\" is not an https:// URL": sso("http://sso.example", redirect),
		"OIDCIssuer \"https://u:p@sso.example\"":                   sso("https://u:p@sso.example", redirect),
		"OIDCIssuer \"sso.example\"":                               sso("sso.example", redirect),
		"OIDCIssuer \"http://127.example.com/\"":                   sso("http://127.example.com/", redirect),
		"OIDCRedirectURL \"https://wlproj.example/\" is not":       sso("https://sso.example", "https://wlproj.example/"),
		"OIDCRedirectURL \"/console/oidc/callback\" is not":        sso("https://sso.example", OIDCCallbackPath),
		"OIDCClientID is required":                                 {SessionTTL: time.Hour, OIDCIssuer: "https://sso.example"},
		"OIDCClientSecretFile is set, but single sign-on is off":   {UsersFile: "u", SessionTTL: time.Hour, OIDCClientSecretFile: "s"},
		"PolicyFile is required for single sign-on": {SessionTTL: time.Hour, OIDCIssuer: "https://sso.example", OIDCClientID: "wlproj",
			OIDCClientSecretFile: "s", OIDCRedirectURL: redirect},
	} {
		require.ErrorContains(t, c.Validate(), want)
	}
	readOnly := sso("https://sso.example", redirect)
	readOnly.ReadOnlyUsers = []string{"viv"}
	for want, c := range map[string]Config{"ReadOnlyUsers is set without a users file": readOnly} {
		require.ErrorContains(t, c.Validate(), want)
	}
	require.False(t, Config{}.On())

	// The secret file is read at New: missing or empty names it, and
	// shows nothing of what it holds.
	for want, content := range map[string]string{"is empty": " \n", "no such file": ""} {
		path := filepath.Join(t.TempDir(), "secret")
		if content != "" {
			require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		}
		c := sso("https://sso.example", redirect).withDefaults()
		c.OIDCClientSecretFile = path
		s, err := newSessions("", time.Hour)
		require.NoError(t, err)
		_, err = newOIDCProvider(c, s)
		require.ErrorContains(t, err, "OIDCClientSecretFile")
		require.ErrorContains(t, err, want)
	}
}

// TestIdentityOfClaims: the user name from the configured claim, an
// unverified email refused as a name, groups as a list or a single string.
func TestIdentityOfClaims(t *testing.T) {
	t.Parallel()
	name, groups, err := identityOf(map[string]any{"email": "grace@example.com", "email_verified": true,
		"groups": []any{"ops", 7, "sre", ""}}, "email", "groups")
	require.NoError(t, err)
	require.Equal(t, "grace@example.com", name)
	require.Equal(t, []string{"ops", "sre"}, groups)

	name, groups, err = identityOf(map[string]any{"preferred_username": "grace", "roles": "ops"}, "preferred_username", "roles")
	require.NoError(t, err)
	require.Equal(t, "grace", name)
	require.Equal(t, []string{"ops"}, groups)

	_, _, err = identityOf(map[string]any{"email": "grace@example.com", "email_verified": false}, "email", "groups")
	require.ErrorContains(t, err, "has not verified")
	for _, claims := range []map[string]any{{}, {"email": ""}, {"email": 42}, {"email": "a\nb"}} {
		_, _, err = identityOf(claims, "email", "groups")
		require.ErrorContains(t, err, `no usable "email" claim`, "%v", claims)
	}
}

// TestSingleSignOnAlone: without a users file the sign-in page offers the
// provider only, and a password sign-in is refused.
func TestSingleSignOnAlone(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0, func(c *Config, _ *Deps) { c.UsersFile, c.ReadOnlyUsers = "", nil })
	c := b.client(t)
	page := c.get(Prefix + "signin")
	require.NotContains(t, page.body, `name="password"`)
	r := c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword}})
	require.Equal(t, http.StatusNotFound, r.code)
	require.Contains(t, r.body, "Sign-in with a password is not configured here.")
	require.Equal(t, http.StatusOK, c.ssoSignIn(Prefix).code)
}

// TestPasswordSignInAlone: without an issuer, the sign-in page has no
// single sign-on button and its routes answer 404.
func TestPasswordSignInAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	require.NotContains(t, c.get(Prefix+"signin").body, "oidc/start")
	require.Equal(t, http.StatusNotFound, c.post(Prefix+"oidc/start", url.Values{}).code)
	require.Equal(t, http.StatusNotFound, c.get(OIDCCallbackPath+"?code=x&state=y").code)
}

// TestSingleSignOnGroupsMapToRoles: the policy file grants grace's group a
// role, so grace, read-only without it, replays; the audit row names her
// sign-in and groups.
func TestSingleSignOnGroupsMapToRoles(t *testing.T) {
	t.Parallel()
	b := setupOIDC(t, 0, withPolicy(t, `
roles:
  ops:
    actions: [replay, discard]
    projections: ["*"]
    scopes: ["*"]
groups:
  wlproj-operators: [ops]
`))
	ids := b.failed(t, 2, "mapping_error", time.Hour)
	grace := b.client(t)
	page := grace.ssoSignIn(Prefix)
	require.Equal(t, http.StatusOK, page.code, page.body)
	require.NotContains(t, page.body, `<span class="tag">read-only</span>`)

	r := grace.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0])}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	form := confirmForm(t, r.body)
	form.Set("why", "fixed the mapping")
	r = grace.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Equal(t, 1, b.count(t, `status = 'pending'`))
	var by, auth string
	var groups []string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, actor->>'auth',
		ARRAY(SELECT jsonb_array_elements_text(actor->'groups')) FROM outbox_replay_audit WHERE action = 'replay'`).
		Scan(&by, &auth, &groups))
	require.Equal(t, graceEmail, by)
	require.Equal(t, "oidc", auth)
	require.Equal(t, graceGroups, groups)
}

// syncLog is a log the console's handlers and the test may use at once.
type syncLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestSingleSignOnSessionsFollowTheProviderConfig: a replica sharing the
// session key takes grace's session while it names the same issuer and
// client, and refuses it once the client changed; no code, token or
// client secret is ever in the log, a refused replay included.
func TestSingleSignOnSessionsFollowTheProviderConfig(t *testing.T) {
	t.Parallel()
	key := writeFile(t, strings.Repeat("k", 40)+"\n")
	log := &syncLog{}
	b := setupOIDC(t, 0, func(c *Config, d *Deps) { c.SessionKeyFile, d.Log = key, zerolog.New(log) })
	grace := b.client(t)
	cb := grace.dexLogin(grace.ssoStart(Prefix), graceEmail, gracePassword)
	flow := grace.flowCookie()
	landing := continued(t, grace.callback(cb))
	require.Equal(t, http.StatusOK, grace.get(landing).code)
	thief := b.client(t)
	thief.setFlowCookie(flow)
	require.Equal(t, http.StatusUnauthorized, thief.callback(cb).code, "the replayed code is refused")

	same := b.con.cfg
	require.Equal(t, http.StatusOK, b.replica(t, same).replayed(t, grace).get(Prefix).code, "same provider and client")
	moved := b.con.cfg
	moved.OIDCClientID = "another-client"
	require.Equal(t, http.StatusSeeOther, b.replica(t, moved).replayed(t, grace).get(Prefix).code,
		"a session of another client is over")

	code := mustURL(t, cb).Query().Get("code")
	require.NotEmpty(t, code)
	logged := log.String()
	require.Contains(t, logged, `"message":"console sign-in"`, "the log is the console's")
	for _, secret := range []string{code, b.dex.ClientSecret, "eyJ"} {
		require.NotContains(t, logged, secret)
	}
}

// A provider's user named as a user of the users file is refused: the
// policy names users by name, so they would get that user's roles.
func TestSingleSignOnRefusesANameOfTheUsersFile(t *testing.T) {
	t.Parallel()
	h, err := bcrypt.GenerateFromPassword([]byte("another-secret"), bcrypt.MinCost)
	require.NoError(t, err)
	users := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(users, []byte(graceEmail+":"+string(h)+"\nada:"+string(h)+"\n"), 0o600))
	b := setupOIDC(t, 0, func(c *Config, _ *Deps) { c.UsersFile, c.ReadOnlyUsers = users, nil })
	grace := b.client(t)
	cb := grace.callback(grace.dexLogin(grace.ssoStart(Prefix), graceEmail, gracePassword))
	require.Equal(t, http.StatusForbidden, cb.code, cb.body)
	require.Contains(t, cb.body, "has the name of a user of the console&#39;s users file")
	require.Zero(t, b.sessions(t), "no session was opened")
}
