package console

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/securecookie"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/policy"
)

// user is someone who may sign in: from the users file, or from the
// OpenID provider (see oidc.go), who is in no file.
type user struct {
	Name string
	// ReadOnly is a user who may take no action: a read-only user of the
	// users file, or one the policy grants only views. Per request, the
	// console's copy says what that request's actor may do (withSession).
	ReadOnly bool
	// Groups are the groups the user's sign-in named (OpenID Connect);
	// the policy file maps them to roles.
	Groups []string
	// Auth is how the user signed in, policy.AuthPassword when empty.
	Auth string
	hash []byte
}

func (u *user) auth() string { return cmp.Or(u.Auth, policy.AuthPassword) }

// users are the entries of the users file.
type users struct {
	byName map[string]*user
	// dummy is the hash compared when a name is unknown: made at the
	// file's highest cost, so that an unknown name costs what a known one
	// does. bcrypt's work doubles with each step of cost, and the runbook's
	// cost 12 is four times the default: a dummy at the default answered an
	// unknown name in 79 ms, a known one in 351 ms.
	dummy []byte
}

// loadUsers reads an htpasswd file: "name:hash" per line, blank lines and
// # comments ignored. Only bcrypt hashes are accepted ($2y$ from htpasswd -B,
// or $2a$/$2b$): the other htpasswd formats are fast to guess. Every
// read-only name must be in the file, so that a typo never leaves the
// intended viewer an operator.
func loadUsers(path string, readOnly []string) (*users, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, bounds.Invalid("UsersFile", "%v", err)
	}
	u := map[string]*user{}
	maxCost := bcrypt.MinCost
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		switch {
		case !ok || name == "" || hash == "":
			return nil, bounds.Invalid("UsersFile", "%s line %d: not name:hash", path, n)
		case strings.ContainsAny(name, " \t"):
			return nil, bounds.Invalid("UsersFile", "%s line %d: the name %q has a space", path, n, name)
		case u[name] != nil:
			return nil, bounds.Invalid("UsersFile", "%s line %d: %s is there twice", path, n, name)
		}
		if !strings.HasPrefix(hash, "$2a$") && !strings.HasPrefix(hash, "$2b$") && !strings.HasPrefix(hash, "$2y$") {
			return nil, bounds.Invalid("UsersFile", "%s line %d: %s: only bcrypt hashes are accepted (htpasswd -B)", path, n, name)
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			return nil, bounds.Invalid("UsersFile", "%s line %d: %s: %v", path, n, name, err)
		}
		maxCost = max(maxCost, cost)
		u[name] = &user{Name: name, hash: []byte(hash)}
	}
	if err := sc.Err(); err != nil {
		return nil, bounds.Invalid("UsersFile", "%v", err)
	}
	if len(u) == 0 {
		return nil, bounds.Invalid("UsersFile", "%s has no users", path)
	}
	for _, name := range readOnly {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if u[name] == nil {
			return nil, bounds.Invalid("ReadOnlyUsers", "names %s, who is not in %s", name, path)
		}
		u[name].ReadOnly = true
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte(rand.Text()), maxCost)
	if err != nil {
		return nil, err
	}
	return &users{byName: u, dummy: dummy}, nil
}

// compared is the user named name, nil if there is none, and the hash a
// sign-in as name compares the password with: the user's, or the dummy.
// Without a users file (single sign-on alone) there is no one.
func (u *users) compared(name string) (*user, []byte) {
	if u == nil {
		return nil, nil
	}
	if usr := u.byName[name]; usr != nil {
		return usr, usr.hash
	}
	return nil, u.dummy
}

// check returns the user if name and password match.
func (u *users) check(name, password string) *user {
	usr, hash := u.compared(name)
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || usr == nil {
		return nil
	}
	return usr
}

// session is what the cookie holds. Every visitor gets one, so that even the
// sign-in form carries a token; signing in replaces it with a new SID, so a
// session planted before sign-in is worth nothing after. A signed-in
// session is also a row of outbox_console_sessions under its SID, which
// every request reads: the cookie alone proves only that this console
// issued it, the row that it has not ended since (see live).
type session struct {
	SID  string `json:"sid"`
	User string `json:"user,omitempty"`
}

const cookieName = "wlproj_console"

// sessions encode and decode session cookies and derive the form tokens
// and password marks.
type sessions struct {
	codec   *securecookie.SecureCookie
	devices *securecookie.SecureCookie
	flows   *securecookie.SecureCookie
	csrfKey []byte
	markKey []byte
	ttl     time.Duration
}

// keyMin is the least secret a session key file may hold.
const keyMin = 32

// newSessions derives the cookie's signing and encryption keys and the form
// token key from the key file's secret, or from a random one.
func newSessions(keyFile string, ttl time.Duration) (*sessions, error) {
	var secret []byte
	if keyFile == "" {
		secret = make([]byte, 64)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
	} else {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, bounds.Invalid("SessionKeyFile", "%v", err)
		}
		secret = bytes.TrimSpace(b)
		if len(secret) < keyMin {
			return nil, bounds.Invalid("SessionKeyFile", "%s holds %d bytes, fewer than %d: write e.g. `head -c 48 /dev/urandom | base64`",
				keyFile, len(secret), keyMin)
		}
	}
	derive := func(label string, n int) []byte {
		k, err := hkdf.Key(sha256.New, secret, nil, "wlproj console "+label, n)
		if err != nil {
			panic(err) // only for lengths sha256 cannot give
		}
		return k
	}
	codec := securecookie.New(derive("cookie hash", 32), derive("cookie block", 32)).
		SetSerializer(securecookie.JSONEncoder{}).MaxAge(int(ttl.Seconds()))
	return &sessions{codec: codec, devices: newDeviceCodec(derive), flows: newFlowCodec(derive), csrfKey: derive("form token", 32),
		markKey: derive("password mark", 32), ttl: ttl}, nil
}

// read returns the request's session, nil if it has none or it does not
// decode (forged, from another key, or expired).
func (s *sessions) read(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	var sess session
	if s.codec.Decode(cookieName, c.Value, &sess) != nil || sess.SID == "" {
		return nil
	}
	return &sess
}

// newSession is a session of user (empty: signed out) with a new random SID.
func newSession(user string) (*session, error) {
	sid := make([]byte, 18)
	if _, err := rand.Read(sid); err != nil {
		return nil, err
	}
	return &session{SID: base64.RawURLEncoding.EncodeToString(sid), User: user}, nil
}

// write sets the cookie of sess.
func (s *sessions) write(w http.ResponseWriter, r *http.Request, sess *session) error {
	v, err := s.codec.Encode(cookieName, sess)
	if err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: v, Path: Prefix, MaxAge: int(s.ttl.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return nil
}

// start writes a new session for user (empty: signed out) and returns it.
func (s *sessions) start(w http.ResponseWriter, r *http.Request, user string) (*session, error) {
	sess, err := newSession(user)
	if err != nil {
		return nil, err
	}
	return sess, s.write(w, r, sess)
}

// mark is what a session row keeps of its user's password: a keyed digest
// of the hash in the users file, so that a new hash there no longer matches
// and the database holds nothing to guess passwords from.
func (s *sessions) mark(u *user) string {
	m := hmac.New(sha256.New, s.markKey)
	m.Write(u.hash)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sessionPruneBatch is the most expired sessions one sign-in deletes: far
// more than the one it adds, so the table stays small, and never a large
// delete in the way of a sign-in.
const sessionPruneBatch = 100

// signInSQL records a signed-in session and deletes a batch of expired
// ones, revoked or not: an ended session's row is kept until it would have
// expired anyway, as a record of the sign-out.
const signInSQL = `
WITH expired AS (
  DELETE FROM outbox_console_sessions
   WHERE id IN (SELECT id FROM outbox_console_sessions WHERE expires_at < now()
                 ORDER BY expires_at LIMIT @prune)
)
INSERT INTO outbox_console_sessions (id, username, password_mark, expires_at, auth, groups)
VALUES (@id, @user, @mark, now() + make_interval(secs => @ttl_secs), @auth, @groups)`

// signInArgs are signInSQL's arguments for sess of user, signed in by auth.
func signInArgs(sess *session, user, mark, auth string, groups []string, ttl time.Duration) pgx.NamedArgs {
	return pgx.NamedArgs{"id": sess.SID, "user": user, "mark": mark, "ttl_secs": ttl.Seconds(),
		"prune": sessionPruneBatch, "auth": auth, "groups": append([]string{}, groups...)}
}

// liveSQL reads a session that has not ended, by its primary key.
const liveSQL = `
SELECT password_mark, auth, groups FROM outbox_console_sessions
 WHERE id = $1 AND username = $2 AND revoked_at IS NULL AND expires_at > now()`

// signOutSQL ends a session on every replica; a second sign-out of the
// same session changes nothing.
const signOutSQL = `UPDATE outbox_console_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`

// sessionUser is the user of the signed-in session sess if it has not
// ended, else nil: not signed out, not expired, and for a user of the
// users file opened with the password the file holds now, for an OpenID
// user opened through the provider and client configured now. Every
// replica reads the same row, so a sign-out on one ends the session on all.
func (c *Console) sessionUser(ctx context.Context, sess *session) (*user, error) {
	var mark, auth string
	var groups []string
	err := c.deps.Pool.QueryRow(ctx, liveSQL, sess.SID, sess.User).Scan(&mark, &auth, &groups)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the session: %w", err)
	}
	switch auth {
	case policy.AuthPassword:
		if u, _ := c.users.compared(sess.User); u != nil && hmac.Equal([]byte(mark), []byte(c.sessions.mark(u))) {
			return u, nil
		}
	case policy.AuthOIDC:
		if c.oidc != nil && hmac.Equal([]byte(mark), []byte(c.oidc.mark)) {
			return c.oidc.user(sess.User, groups), nil
		}
	}
	return nil, nil
}

// signInLimiter bounds sign-in attempts per key: per client address and
// per user name for a browser that has not signed in as that name before
// (the first stops one client trying many names, the second many clients
// trying one name; either alone would leave the other open), per browser
// for one that has (see device.go), so that the first two, which anyone
// can spend, never lock out an operator's own browser. Each replica keeps
// its own: a shared one would be a write to the outbox database for every
// attempt, driven by whoever can reach the sign-in form, to save a factor
// of the number of replicas (two) in the guesses a name can take.
type signInLimiter struct {
	perMinute, burst int
	mu               sync.Mutex
	byKey            map[string]*limiterEntry
}

type limiterEntry struct {
	lim  *rate.Limiter
	seen time.Time
}

// limiterKeep bounds the map: entries idle this long are full again anyway.
const limiterKeep = 10 * time.Minute

func newSignInLimiter(perMinute, burst int) *signInLimiter {
	return &signInLimiter{perMinute: perMinute, burst: burst, byKey: map[string]*limiterEntry{}}
}

// allow takes one attempt from every key's budget; false if any is spent.
func (l *signInLimiter) allow(now time.Time, keys ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.byKey) > 10_000 {
		for k, e := range l.byKey {
			if now.Sub(e.seen) > limiterKeep {
				delete(l.byKey, k)
			}
		}
	}
	ok := true
	for _, k := range keys {
		e := l.byKey[k]
		if e == nil {
			e = &limiterEntry{lim: rate.NewLimiter(rate.Every(time.Minute/time.Duration(l.perMinute)), l.burst)}
			l.byKey[k] = e
		}
		e.seen = now
		// Every key pays, so a client that is refused for one name does not
		// keep a fresh budget for the next.
		ok = e.lim.AllowN(now, 1) && ok
	}
	return ok
}

// clientIP is the address the connection comes from; the console trusts no
// forwarding header, since a client can write any.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

type signInView struct {
	Next string
	Name string
	// Password offers the users file's form; Provider, when set, the
	// single sign-on button "Sign in with Provider".
	Password bool
	Provider string
}

func (c *Console) signInView(next, name string) signInView {
	v := signInView{Next: next, Name: name, Password: c.users != nil}
	if c.oidc != nil {
		v.Provider = c.cfg.OIDCProviderName
	}
	return v
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	rq := requestOf(r)
	if rq.user != nil {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "signin", "Sign in", c.signInView(safeNext(r.URL.Query().Get("next")), ""))
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	name, password := strings.TrimSpace(r.PostFormValue("user")), r.PostFormValue("password")
	view := c.signInView(safeNext(r.PostFormValue("next")), name)
	if c.users == nil {
		c.renderError(w, r, http.StatusNotFound, "signin", "Sign in", view, "Sign-in with a password is not configured here.")
		return
	}
	named, _ := c.users.compared(name)
	keys, known := c.sessions.signInKeys(r, named, name)
	if !c.limiter.allow(time.Now(), keys...) {
		c.deps.Log.Warn().Str("user", name).Str("remote", clientIP(r)).Bool("known_browser", known != nil).
			Msg("console sign-in rate limited")
		w.Header().Set("Retry-After", "60")
		c.renderError(w, r, http.StatusTooManyRequests, "signin", "Sign in", view,
			"Too many sign-in attempts. Wait a minute, then try again; a browser you signed in with before is not held back.")
		return
	}
	u := c.users.check(name, password)
	if u == nil {
		c.deps.Log.Warn().Str("user", name).Str("remote", clientIP(r)).Msg("console sign-in failed")
		c.renderError(w, r, http.StatusUnauthorized, "signin", "Sign in", view, "Wrong user name or password.")
		return
	}
	sess, err := newSession(u.Name)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if _, err := c.deps.Pool.Exec(r.Context(), signInSQL, signInArgs(sess, u.Name, c.sessions.mark(u), policy.AuthPassword, nil,
		c.sessions.ttl)); err != nil {
		c.fail(w, r, fmt.Errorf("record the session: %w", err))
		return
	}
	if err := errors.Join(c.sessions.write(w, r, sess), c.sessions.rememberDevice(w, r, u, known)); err != nil {
		c.fail(w, r, err)
		return
	}
	c.deps.Log.Info().Str("user", u.Name).Bool("read_only", u.ReadOnly).Str("remote", clientIP(r)).Msg("console sign-in")
	http.Redirect(w, r, view.Next, http.StatusSeeOther)
}

// signOut ends the session in the database, so that a copy of its cookie
// is worth nothing anywhere, then gives the browser a signed-out one.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	rq := requestOf(r)
	if _, err := c.deps.Pool.Exec(r.Context(), signOutSQL, rq.sess.SID); err != nil {
		c.fail(w, r, fmt.Errorf("end the session: %w", err))
		return
	}
	c.deps.Log.Info().Str("user", rq.user.Name).Str("remote", clientIP(r)).Msg("console sign-out")
	if _, err := c.sessions.start(w, r, ""); err != nil {
		c.fail(w, r, err)
		return
	}
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

// safeNext is where to go after sign-in: a path of the console, never
// another site ("//evil", "/\evil" and absolute URLs are dropped).
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.ContainsAny(next, "\\\r\n") || strings.Contains(next, "//") {
		return Prefix
	}
	return next
}

// request is what the middleware learned about a request.
type request struct {
	sess *session
	user *user
	csrf string
	// id is the request's id: in its log lines, its audit row and the
	// X-Request-Id header.
	id string
}

// withActor makes u the request's user, as the policy sees them: the
// actor in r's context, and a copy of u that is read-only unless the
// actor may take some action.
func (c *Console) withActor(r *http.Request, rq *request, u *user) *http.Request {
	actor := c.actorOf(r, u, rq.id)
	cp := *u
	cp.ReadOnly = !mayActSomewhere(actor.Grants)
	rq.user = &cp
	return r.WithContext(policy.With(r.Context(), actor))
}

type requestKey struct{}

func requestOf(r *http.Request) *request {
	if rq, ok := r.Context().Value(requestKey{}).(*request); ok {
		return rq
	}
	return &request{}
}

// withSession reads the session, gives every visitor one, and refuses a
// POST whose form does not carry the session's token. A signed-in session
// that has ended (signed out, expired, the password changed, the user
// removed from the file) still carries its token but no user, so its pages
// ask for a sign-in and its actions are refused.
func (c *Console) withSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rq := &request{sess: c.sessions.read(r), id: policy.NewRequestID()}
		w.Header().Set("X-Request-Id", rq.id)
		if rq.sess != nil && rq.sess.User != "" {
			u, err := c.sessionUser(r.Context(), rq.sess)
			if err != nil {
				c.fail(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, rq)), err)
				return
			}
			if u != nil {
				r = c.withActor(r, rq, u)
			}
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if !c.sessions.tokenOK(rq.sess, r.PostFormValue("csrf")) {
				c.deps.Log.Warn().Str("path", r.URL.Path).Str("remote", clientIP(r)).Msg("console POST without a valid form token")
				r = r.WithContext(context.WithValue(r.Context(), requestKey{}, rq))
				c.renderError(w, r, http.StatusForbidden, "message", "Refused", nil,
					"Refused: the form's security token is missing or stale. Reload the page and try again.")
				return
			}
		}
		if rq.sess == nil {
			var err error
			if rq.sess, err = c.sessions.start(w, r, ""); err != nil {
				c.fail(w, r, err)
				return
			}
		}
		rq.csrf = c.sessions.token(rq.sess)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, rq)))
	})
}

// signed serves h to signed-in users and sends everyone else to sign in;
// a user the policy grants nothing is refused, audited.
func (c *Console) signed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if requestOf(r).user != nil {
			if grantsOf(r).None() && r.URL.Path != Prefix+"signout" {
				c.deny(w, r, policy.View, "use the console: no role of the policy file is theirs", nil)
				return
			}
			traced(h)(w, r)
			return
		}
		if r.Method != http.MethodGet {
			c.renderError(w, r, http.StatusUnauthorized, "message", "Sign in", nil, "Sign in first.")
			return
		}
		http.Redirect(w, r, Prefix+"signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	}
}

// operator serves h to signed-in users who may act.
func (c *Console) operator(h http.HandlerFunc) http.HandlerFunc {
	return c.signed(func(w http.ResponseWriter, r *http.Request) {
		if u := requestOf(r).user; u.ReadOnly {
			c.refuseAudited(w, r, policy.View, "take an action", nil,
				fmt.Sprintf("%s is a read-only user and may look but not act", u.Name))
			return
		}
		h(w, r)
	})
}
