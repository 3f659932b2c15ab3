package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/leader"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func TestUsersFile(t *testing.T) {
	t.Parallel()
	h, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	require.NoError(t, err)
	hash := strings.Replace(string(h), "$2a$", "$2y$", 1)

	u, err := loadUsers(writeFile(t, "# comment\n\nada:"+hash+"\nviv:"+string(h)+"\n"), []string{" viv "})
	require.NoError(t, err)
	require.NotNil(t, u.check("ada", "pw"), "htpasswd -B's $2y$ is bcrypt")
	require.Nil(t, u.check("ada", "nope"))
	require.Nil(t, u.check("eve", "pw"))
	require.False(t, u.byName["ada"].ReadOnly)
	require.True(t, u.byName["viv"].ReadOnly)

	for name, c := range map[string]struct {
		file     string
		readOnly []string
		want     string
	}{
		"md5 htpasswd":             {"ada:$apr1$abc$def\n", nil, "only bcrypt"},
		"sha htpasswd":             {"ada:{SHA}abc=\n", nil, "only bcrypt"},
		"plain text":               {"ada:secret\n", nil, "only bcrypt"},
		"no colon":                 {"ada\n", nil, "line 1: not name:hash"},
		"twice":                    {"ada:" + hash + "\nada:" + hash + "\n", nil, "line 2: ada is there twice"},
		"empty":                    {"# nobody\n", nil, "has no users"},
		"broken bcrypt":            {"ada:$2y$10$short\n", nil, "line 1: ada"},
		"read-only name not in it": {"ada:" + hash + "\n", []string{"vvi"}, "names vvi, who is not in"},
	} {
		_, err := loadUsers(writeFile(t, c.file), c.readOnly)
		require.ErrorContains(t, err, c.want, name)
		var fe *bounds.FieldError
		require.ErrorAs(t, err, &fe, name)
	}
	_, err = loadUsers(filepath.Join(t.TempDir(), "missing"), nil)
	require.ErrorContains(t, err, "UsersFile")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{UsersFile: "u", SessionTTL: time.Hour}
	require.NoError(t, ok.Validate())
	for want, c := range map[string]Config{
		"UsersFile is required": {SessionTTL: time.Hour},
		"TLSKeyFile":            {UsersFile: "u", SessionTTL: time.Hour, Port: 1, TLSCertFile: "c"},
		"TLSCertFile":           {UsersFile: "u", SessionTTL: time.Hour, Port: 1, TLSKeyFile: "k"},
		"Port must be":          {UsersFile: "u", SessionTTL: time.Hour, TLSCertFile: "c", TLSKeyFile: "k"},
		"SessionTTL=":           {UsersFile: "u", SessionTTL: time.Minute},
		"Port=":                 {UsersFile: "u", SessionTTL: time.Hour, Port: 70000},
	} {
		require.ErrorContains(t, c.Validate(), want)
	}
}

func TestSessionKeyFile(t *testing.T) {
	t.Parallel()
	_, err := newSessions(writeFile(t, "short\n"), time.Hour)
	require.ErrorContains(t, err, "fewer than 32")

	// Two replicas with one key file read each other's cookies; a third
	// with another key does not.
	key := writeFile(t, strings.Repeat("k", 40)+"\n")
	a, err := newSessions(key, time.Hour)
	require.NoError(t, err)
	b, err := newSessions(key, time.Hour)
	require.NoError(t, err)
	other, err := newSessions("", time.Hour)
	require.NoError(t, err)
	rec := &recorder{header: http.Header{}}
	sess, err := a.start(rec, &http.Request{}, "ada")
	require.NoError(t, err)
	req := &http.Request{Header: http.Header{"Cookie": {rec.header.Get("Set-Cookie")}}}
	require.Equal(t, sess, b.read(req))
	require.Equal(t, a.token(sess), b.token(sess))
	require.Nil(t, other.read(req))
}

// recorder keeps the headers a session writes.
type recorder struct{ header http.Header }

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) WriteHeader(int)             {}

func TestSignIn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)

	r := c.get(Prefix + "failed?reason=timeout")
	require.Equal(t, http.StatusSeeOther, r.code, "every page needs a sign-in")
	require.Equal(t, Prefix+"signin?next="+url.QueryEscape(Prefix+"failed?reason=timeout"), r.location)
	require.Equal(t, http.StatusSeeOther, c.get(Prefix+"audit").code)

	c.get(Prefix + "signin")
	r = c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {"wrong"}})
	require.Equal(t, http.StatusUnauthorized, r.code)
	require.Contains(t, r.body, "Wrong user name or password.")
	r = c.post(Prefix+"signin", url.Values{"user": {"nobody"}, "password": {adaPassword}})
	require.Equal(t, http.StatusUnauthorized, r.code, "an unknown name says the same")
	require.Contains(t, r.body, "Wrong user name or password.")

	before := c.http.Jar.Cookies(mustURL(t, b.srv.URL+Prefix))
	r = c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword},
		"next": {Prefix + "failed?reason=timeout"}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, Prefix+"failed?reason=timeout", r.location)
	cookie := setCookie(t, r)
	require.True(t, cookie.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	require.False(t, cookie.Secure, "plain HTTP")
	require.Equal(t, Prefix, cookie.Path)
	require.Equal(t, int(SessionTTLDefault.Seconds()), cookie.MaxAge)
	require.NotEqual(t, before[0].Value, cookie.Value, "a new session on sign-in")

	r = c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "ada")

	// A tampered cookie is no session at all.
	jar, _ := cookiejar.New(nil)
	jar.SetCookies(mustURL(t, b.srv.URL+Prefix), []*http.Cookie{{Name: cookieName, Value: cookie.Value[:len(cookie.Value)-2] + "xx", Path: Prefix}})
	forged := b.client(t)
	forged.http.Jar = jar
	require.Equal(t, http.StatusSeeOther, forged.get(Prefix).code)

	// Sign-out ends it; the old page's form is useless after.
	r = c.post(Prefix+"signout", url.Values{})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, http.StatusSeeOther, c.get(Prefix).code)
}

func TestNextNeverLeavesTheConsole(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		Prefix + "failed?x=1":  Prefix + "failed?x=1",
		"//evil.example/":      Prefix,
		"https://evil.example": Prefix,
		Prefix + "/\\evil":     Prefix,
		"/elsewhere":           Prefix,
		"":                     Prefix,
	} {
		require.Equal(t, want, safeNext(next), next)
	}
}

// setCookie is the session cookie r sets.
func setCookie(t *testing.T, r response) *http.Cookie {
	t.Helper()
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == cookieName {
			return c
		}
	}
	require.FailNow(t, "no session cookie", "%v", r.header)
	return nil
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}

func TestSignInIsRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config, _ *Deps) { c.SignInBurst, c.SignInPerMinute = 3, 1 })
	c := b.client(t)
	c.get(Prefix + "signin")
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {"guess"}}).code)
	}
	r := c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword}})
	require.Equal(t, http.StatusTooManyRequests, r.code, "even the right password waits")
	require.Equal(t, "60", r.header.Get("Retry-After"))
	require.Contains(t, r.body, "Too many sign-in attempts")
	// Another name from the same address is limited too.
	require.Equal(t, http.StatusTooManyRequests, c.post(Prefix+"signin", url.Values{"user": {"viv"}, "password": {vivPassword}}).code)

	// One name from many addresses runs out as well.
	l := newSignInLimiter(1, 2)
	now := time.Now()
	require.True(t, l.allow(now, "addr:1", "user:ada"))
	require.True(t, l.allow(now, "addr:2", "user:ada"))
	require.False(t, l.allow(now, "addr:3", "user:ada"))
	require.True(t, l.allow(now, "addr:3", "user:viv"))
	require.True(t, l.allow(now.Add(time.Minute), "addr:4", "user:ada"), "the budget refills")
}

// TestUnknownNameCostsAsMuchAsAKnownOne: the hash an unknown name is
// compared with has the cost of the file's costliest hash, so that the
// answer's delay does not tell a user name from an unknown one (it took 79
// ms against 351 with a dummy at bcrypt's default cost and users at the
// runbook's 12). Compared by the work bcrypt does, not by a clock.
func TestUnknownNameCostsAsMuchAsAKnownOne(t *testing.T) {
	t.Parallel()
	const highest = bcrypt.DefaultCost + 1
	var lines []string
	for name, cost := range map[string]int{"ada": bcrypt.MinCost, "viv": highest, "max": bcrypt.MinCost + 1} {
		h, err := bcrypt.GenerateFromPassword([]byte(name+"-pw"), cost)
		require.NoError(t, err)
		lines = append(lines, name+":"+string(h))
	}
	u, err := loadUsers(writeFile(t, strings.Join(lines, "\n")+"\n"), nil)
	require.NoError(t, err)
	for _, name := range []string{"nobody", "Viv", ""} {
		usr, hash := u.compared(name)
		require.Nil(t, usr, name)
		cost, err := bcrypt.Cost(hash)
		require.NoError(t, err)
		require.Equal(t, highest, cost, "an unknown name %q costs what viv costs", name)
		require.Nil(t, u.check(name, "viv-pw"))
	}
	_, hash := u.compared("viv")
	require.NoError(t, bcrypt.CompareHashAndPassword(hash, []byte("viv-pw")))
}

// TestGuessesDoNotLockOutAKnownBrowser: someone guessing at ada's password
// spends the budgets of her name and of the address (every client of a TLS
// proxy or an SSH tunnel has the same one), so a browser new to ada is
// refused even with the right password; ada's own browser, which signed in
// before, has a budget of its own and gets in. Before, the right password
// got 429 from every browser. Its budget bounds a stolen device cookie too,
// and it is worth nothing for another name or after a password change.
func TestGuessesDoNotLockOutAKnownBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config, _ *Deps) { c.SignInBurst, c.SignInPerMinute = 3, 1 })
	ada := b.client(t)
	require.Equal(t, http.StatusSeeOther, ada.signIn("ada", adaPassword).code)
	ada.get(Prefix)
	require.Equal(t, http.StatusSeeOther, ada.post(Prefix+"signout", url.Values{}).code)

	attacker := b.client(t)
	attacker.get(Prefix + "signin")
	for range 2 { // ada's sign-in took one of the address's three
		require.Equal(t, http.StatusUnauthorized, attacker.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {"guess"}}).code)
	}
	require.Equal(t, http.StatusTooManyRequests, attacker.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword}}).code,
		"the guesses are limited, the right password included")
	require.Equal(t, http.StatusTooManyRequests, b.client(t).signIn("ada", adaPassword).code, "so is a browser new to ada")

	r := ada.signIn("ada", adaPassword)
	require.Equal(t, http.StatusSeeOther, r.code, "ada's own browser is not locked out: %s", r.body)
	require.Equal(t, http.StatusOK, ada.get(Prefix).code)
	require.Equal(t, http.StatusSeeOther, ada.post(Prefix+"signout", url.Values{}).code)

	require.Equal(t, http.StatusTooManyRequests, ada.signIn("viv", vivPassword).code,
		"ada's browser is known for ada only: viv pays the address's spent budget")
	for range 2 { // its sign-in took one of its three
		require.Equal(t, http.StatusUnauthorized, ada.signIn("ada", "typo").code)
	}
	require.Equal(t, http.StatusTooManyRequests, ada.signIn("ada", adaPassword).code,
		"the browser's own budget is spent: a stolen device cookie guesses no faster")

	// Another replica with the same key knows the browser, until a new
	// password for ada in the users file makes it unknown.
	key := writeFile(t, strings.Repeat("k", 40)+"\n")
	limits := func(c *Config) { c.SessionKeyFile, c.SignInBurst, c.SignInPerMinute = key, 2, 1 }
	first := setup(t, func(c *Config, _ *Deps) { limits(c) })
	browser := first.client(t)
	require.Equal(t, http.StatusSeeOther, browser.signIn("ada", adaPassword).code)
	guessedAt := func(b *bundle) {
		attacker := b.client(t)
		for range 2 {
			require.Equal(t, http.StatusUnauthorized, attacker.signIn("ada", "guess").code)
		}
		require.Equal(t, http.StatusTooManyRequests, attacker.signIn("ada", "guess").code)
	}
	cfg := Config{UsersFile: first.con.cfg.UsersFile}
	limits(&cfg)
	same := first.replica(t, cfg)
	guessedAt(same)
	require.Equal(t, http.StatusSeeOther, same.withDeviceOf(t, browser).signIn("ada", adaPassword).code)

	h, err := bcrypt.GenerateFromPassword([]byte("new-pw"), bcrypt.MinCost)
	require.NoError(t, err)
	cfg.UsersFile = writeFile(t, "ada:"+string(h)+"\n")
	changed := first.replica(t, cfg)
	guessedAt(changed)
	require.Equal(t, http.StatusTooManyRequests, changed.withDeviceOf(t, browser).signIn("ada", "new-pw").code,
		"the browser of the old password is unknown")
}

// withDeviceOf is a new client of b's server holding only c's device cookie.
func (b *bundle) withDeviceOf(t *testing.T, c *client) *client {
	t.Helper()
	out := b.client(t)
	for _, ck := range c.http.Jar.Cookies(mustURL(t, c.base+Prefix+"signin")) {
		if ck.Name == deviceCookieName {
			ck.Path = Prefix + "signin"
			out.http.Jar.SetCookies(mustURL(t, out.base+Prefix+"signin"), []*http.Cookie{ck})
		}
	}
	return out
}

// TestStaticHasNoDirectoryListing: the stylesheet is served, the folder
// holding it is not listed.
func TestStaticHasNoDirectoryListing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t)
	require.Equal(t, http.StatusOK, c.get(Prefix+"static/style.css").code)
	for _, path := range []string{Prefix + "static/", Prefix + "static/nope.css"} {
		r := c.get(path)
		require.Equal(t, http.StatusNotFound, r.code, path)
		require.NotContains(t, r.body, "style.css", path)
		require.NotContains(t, r.body, "icon.svg", path)
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.operator(t)
	for _, path := range []string{Prefix + "signin", Prefix, Prefix + "failed", Prefix + "nope", Prefix + "static/style.css",
		Prefix + "events/x"} {
		r := c.get(path)
		csp := r.header.Get("Content-Security-Policy")
		require.Contains(t, csp, "default-src 'none'", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.NotContains(t, csp, "script-src", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Equal(t, "DENY", r.header.Get("X-Frame-Options"), path)
		require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"), path)
		if !strings.Contains(path, "static") {
			require.Equal(t, "no-store", r.header.Get("Cache-Control"), path)
			require.NotContains(t, r.body, "<script", path)
			require.NotContains(t, r.body, "style=", path)
		}
	}
}

func TestPostsNeedTheFormToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "timeout", time.Hour)
	form := func() url.Values {
		return url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0])}}
	}
	ada := b.operator(t)
	other := b.operator(t)

	noToken := form()
	noToken.Set("csrf", "")
	r := ada.post(Prefix+"actions/dry-run", noToken)
	require.Equal(t, http.StatusForbidden, r.code)
	require.Contains(t, r.body, "security token is missing or stale")

	// A token is worth nothing with another session's cookie.
	stolen := form()
	stolen.Set("csrf", other.csrf)
	require.Equal(t, http.StatusForbidden, ada.post(Prefix+"actions/dry-run", stolen).code)

	// A browser's cross-site POST is refused before the token is read.
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+Prefix+"actions/dry-run", strings.NewReader(form().Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	r = ada.do(req)
	require.Equal(t, http.StatusForbidden, r.code)
	require.Contains(t, r.body, "another site")

	// Sign-in needs it too: no login CSRF.
	fresh := b.client(t)
	require.Equal(t, http.StatusForbidden, fresh.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword}}).code)

	require.Equal(t, http.StatusOK, ada.post(Prefix+"actions/dry-run", form()).code, "with the token it goes")
	require.Zero(t, b.audits(t))
	require.Equal(t, 2, b.count(t, `status = 'failed'`))
}

func TestReadOnlyUserCannotAct(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "mapping_error", time.Hour)
	viv := b.viewer(t)
	for path, page := range map[string]string{Prefix + "failed": "failed", Prefix + "events/" + itoa(ids[0]): "event", Prefix: "overview"} {
		r := viv.get(path)
		require.Equal(t, http.StatusOK, r.code)
		require.Contains(t, r.body, "read-only", page)
		for _, action := range []string{"actions/dry-run", "actions/apply", "projections/pause", `name="id"`} {
			require.NotContains(t, r.body, action, "%s shows %s to a read-only user", page, action)
		}
	}
	for _, path := range []string{"actions/dry-run", "actions/apply"} {
		r := viv.post(Prefix+path, url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0])},
			"why": {"x"}, "token": {"1-x"}})
		require.Equal(t, http.StatusForbidden, r.code, path)
		require.Contains(t, r.body, "viv is a read-only user")
	}
	r := viv.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}, "why": {"x"}})
	require.Equal(t, http.StatusForbidden, r.code)
	require.Equal(t, 2, b.count(t, `status = 'failed'`))
	require.Equal(t, 3, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'refused' AND replayed_by = 'viv'`),
		"each refusal is audited")
	require.Equal(t, 3, b.audits(t), "and nothing else is")
}

// selfSigned writes a certificate and key for 127.0.0.1.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

func TestOwnPortOverTLS(t *testing.T) {
	t.Parallel()
	cert, key := selfSigned(t)
	b := setup(t, func(c *Config, _ *Deps) {
		c.Port, c.TLSCertFile, c.TLSKeyFile = freePort(t), cert, key
	})
	require.NoError(t, b.con.Start(context.Background()))
	t.Cleanup(b.con.Stop)
	base := "https://" + b.con.Addr()
	require.True(t, strings.HasPrefix(b.con.Addr(), "127.0.0.1:"), "loopback by default")
	jar, _ := cookiejar.New(nil)
	c := &client{t: t, base: base, http: &http.Client{Jar: jar,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // our own test certificate
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}

	r := c.get("/")
	require.Equal(t, http.StatusFound, r.code)
	require.Equal(t, Prefix, r.location)
	r = c.get(Prefix + "signin")
	require.True(t, setCookie(t, r).Secure, "Secure over TLS")
	require.Equal(t, "max-age=31536000", r.header.Get("Strict-Transport-Security"))
	r = c.post(Prefix+"signin", url.Values{"user": {"ada"}, "password": {adaPassword}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.True(t, setCookie(t, r).Secure)
	require.Equal(t, http.StatusOK, c.get(Prefix).code)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// replayed is a client of b's server holding a copy of c's cookie and form
// token: what someone who captured them would send.
func (b *bundle) replayed(t *testing.T, c *client) *client {
	t.Helper()
	thief := b.client(t)
	thief.http.Jar.SetCookies(mustURL(t, thief.base+Prefix), c.http.Jar.Cookies(mustURL(t, c.base+Prefix)))
	thief.csrf = c.csrf
	return thief
}

// TestSignOutEndsTheSession: a cookie captured before sign-out is refused
// after it, for pages and for actions, on this replica and on another one
// sharing the key file; a fresh sign-in works.
func TestSignOutEndsTheSession(t *testing.T) {
	t.Parallel()
	key := writeFile(t, strings.Repeat("k", 40)+"\n")
	b := setup(t, func(c *Config, _ *Deps) { c.SessionKeyFile = key })
	other := b.replica(t, Config{UsersFile: b.con.cfg.UsersFile, SessionKeyFile: key})
	ids := b.failed(t, 1, "timeout", time.Hour)
	ada := b.operator(t)
	stolen := b.replayed(t, ada)
	require.Equal(t, http.StatusOK, stolen.get(Prefix).code, "a copy works while the session lives")

	r := ada.post(Prefix+"signout", url.Values{})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, Prefix+"signin", r.location)

	r = stolen.get(Prefix + "failed")
	require.Equal(t, http.StatusSeeOther, r.code, "the replayed cookie is signed out")
	require.Equal(t, Prefix+"signin?next="+url.QueryEscape(Prefix+"failed"), r.location)
	r = stolen.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0])}})
	require.Equal(t, http.StatusUnauthorized, r.code, r.body)
	elsewhere := other.replayed(t, ada)
	require.Equal(t, http.StatusSeeOther, elsewhere.get(Prefix).code, "signed out on every replica")
	require.Zero(t, b.audits(t))
	require.Equal(t, 1, b.count(t, `status = 'failed'`))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE username = 'ada' AND revoked_at IS NOT NULL`))

	require.Equal(t, http.StatusSeeOther, ada.signIn("ada", adaPassword).code)
	require.Equal(t, http.StatusOK, ada.get(Prefix).code, "a fresh sign-in works")
	require.Equal(t, http.StatusSeeOther, stolen.get(Prefix).code, "and does not revive the old session")
}

// TestPasswordChangeEndsTheUsersSessions: after a new hash for ada in the
// users file and a restart (the file is read at start), every session ada
// opened with the old password is refused; viv's is not, and ada signs in
// with the new password.
func TestPasswordChangeEndsTheUsersSessions(t *testing.T) {
	t.Parallel()
	key := writeFile(t, strings.Repeat("k", 40)+"\n")
	b := setup(t, func(c *Config, _ *Deps) { c.SessionKeyFile = key })
	ada1, ada2, viv := b.operator(t), b.operator(t), b.viewer(t)

	const newPassword = "ada-secret-new"
	h, err := bcrypt.GenerateFromPassword([]byte(newPassword), bcrypt.MinCost)
	require.NoError(t, err)
	old, err := os.ReadFile(b.con.cfg.UsersFile)
	require.NoError(t, err)
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(string(old)), "\n") {
		if strings.HasPrefix(line, "ada:") {
			line = "ada:" + string(h)
		}
		lines = append(lines, line)
	}
	require.NoError(t, os.WriteFile(b.con.cfg.UsersFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	restarted := b.replica(t, Config{UsersFile: b.con.cfg.UsersFile, ReadOnlyUsers: []string{"viv"}, SessionKeyFile: key})

	for i, c := range []*client{ada1, ada2} {
		r := restarted.replayed(t, c).get(Prefix)
		require.Equal(t, http.StatusSeeOther, r.code, "ada's session %d", i)
		require.True(t, strings.HasPrefix(r.location, Prefix+"signin"), r.location)
	}
	require.Equal(t, http.StatusOK, restarted.replayed(t, viv).get(Prefix).code, "viv's password did not change")

	fresh := restarted.client(t)
	require.Equal(t, http.StatusUnauthorized, fresh.signIn("ada", adaPassword).code, "the old password is refused")
	require.Equal(t, http.StatusSeeOther, fresh.signIn("ada", newPassword).code)
	require.Equal(t, http.StatusOK, fresh.get(Prefix).code)
}

// TestSignInPrunesEndedSessions: expired rows go at the next sign-in, a
// bounded batch at a time; live ones stay.
func TestSignInPrunesEndedSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.operator(t)
	b.db.Exec(t, `INSERT INTO outbox_console_sessions (id, username, password_mark, created_at, expires_at, revoked_at)
		SELECT 'old-' || g, 'ada', 'm', now() - interval '2 days', now() - interval '1 day',
		       CASE WHEN g % 2 = 0 THEN now() - interval '1 day' END
		  FROM generate_series(1, $1) g`, sessionPruneBatch+5)
	b.operator(t)
	require.Equal(t, 5, b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE expires_at < now()`))
	require.Equal(t, 2, b.db.Int(t, `SELECT count(*) FROM outbox_console_sessions WHERE expires_at > now()`))
}

// replica is a second console on b's database, as another replica or the
// same one restarted, served by a server of its own.
func (b *bundle) replica(t *testing.T, cfg Config) *bundle {
	t.Helper()
	con, err := New(cfg, Deps{Pool: b.db.Pool, State: func() leader.State { return b.state }, LeaderName: "wlproj",
		Projections: []string{"search", "chronicle"}, Log: zerolog.Nop()})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle(Prefix, con.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &bundle{db: b.db, ctx: b.ctx, con: con, srv: srv, state: b.state}
}
