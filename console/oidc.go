package console

// Single sign-on with OpenID Connect: the authorization code flow with PKCE.
//
//	sign-in page ──POST oidc/start (form token)──▶ flow cookie (state, nonce,
//	PKCE verifier, next), then the provider's login ──▶ GET oidc/callback
//	?code&state ──▶ state checked against the cookie, code exchanged with the
//	verifier, ID token verified (signature, issuer, audience, expiry) and its
//	nonce checked, session row recorded ──▶ next
//
// The provider is discovered at the first sign-in, not at start, and again
// after a failure, so that a replica started before its provider (or while
// it is away) serves the console, password sign-in included, and offers
// single sign-on as soon as the provider answers; Start logs a warning if
// it does not answer then, so a wrong issuer shows in the log at once.

import (
	"context"
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

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/gorilla/securecookie"
	"golang.org/x/oauth2"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/policy"
)

// OIDCCallbackPath is the path of the redirect URL the provider sends the
// browser back to; OIDCRedirectURL must end with it.
const OIDCCallbackPath = Prefix + "oidc/callback"

const (
	oidcFlowCookie = "wlproj_console_oidc"
	// oidcFlowTTL bounds a sign-in at the provider: long enough to type a
	// password and a second factor, short enough that a flow cookie left
	// behind is soon worth nothing.
	oidcFlowTTL = 10 * time.Minute
	// oidcTimeout bounds each request to the provider: discovery, keys,
	// the code exchange.
	oidcTimeout = 10 * time.Second
	// oidcMaxGroups bounds what a session row keeps of a groups claim.
	oidcMaxGroups = 1000
)

// oidcFlow is what the flow cookie holds, signed and encrypted, between
// the start of a sign-in and the provider's callback.
type oidcFlow struct {
	State    string `json:"state"`
	Nonce    string `json:"nonce"`
	Verifier string `json:"verifier"`
	Next     string `json:"next"`
}

// newFlowCodec signs and encrypts flow cookies with keys of their own,
// derived from the session secret, so that a callback may land on any
// replica sharing the key file.
func newFlowCodec(derive func(label string, n int) []byte) *securecookie.SecureCookie {
	return securecookie.New(derive("oidc flow hash", 32), derive("oidc flow block", 32)).
		SetSerializer(securecookie.JSONEncoder{}).MaxAge(int(oidcFlowTTL.Seconds()))
}

// oidcProvider is the configured provider, discovered on first use.
type oidcProvider struct {
	cfg    Config
	secret string
	// mark is what a session row of this provider's users holds for
	// password_mark: a keyed digest of the issuer and client, so that
	// pointing the console at another provider or client ends the sessions
	// the old one opened, as a new password ends a password user's.
	mark   string
	client *http.Client

	mu    sync.Mutex
	ready *oidcReady
}

type oidcReady struct {
	oauth    *oauth2.Config
	verifier *oidc.IDTokenVerifier
}

// newOIDCProvider reads the client secret; nil when no issuer is set.
func newOIDCProvider(cfg Config, s *sessions) (*oidcProvider, error) {
	if cfg.OIDCIssuer == "" {
		return nil, nil
	}
	b, err := os.ReadFile(cfg.OIDCClientSecretFile)
	if err != nil {
		return nil, bounds.Invalid("OIDCClientSecretFile", "%v", err)
	}
	secret := strings.TrimSpace(string(b))
	if secret == "" {
		return nil, bounds.Invalid("OIDCClientSecretFile", "%s is empty: write the client secret the provider gave", cfg.OIDCClientSecretFile)
	}
	m := hmac.New(sha256.New, s.markKey)
	m.Write([]byte("oidc\x00" + cfg.OIDCIssuer + "\x00" + cfg.OIDCClientID))
	return &oidcProvider{cfg: cfg, secret: secret, mark: base64.RawURLEncoding.EncodeToString(m.Sum(nil)),
		client: &http.Client{Timeout: oidcTimeout}}, nil
}

// discover reads the provider's discovery document once it answers; until
// then every call tries again.
func (p *oidcProvider) discover(ctx context.Context) (*oidcReady, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ready != nil {
		return p.ready, nil
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, p.client), oidcTimeout)
	defer cancel()
	prov, err := oidc.NewProvider(ctx, p.cfg.OIDCIssuer)
	if err != nil {
		return nil, fmt.Errorf("discover the OpenID provider %s: %w", p.cfg.OIDCIssuer, err)
	}
	p.ready = &oidcReady{
		oauth: &oauth2.Config{ClientID: p.cfg.OIDCClientID, ClientSecret: p.secret, Endpoint: prov.Endpoint(),
			RedirectURL: p.cfg.OIDCRedirectURL, Scopes: p.cfg.OIDCScopes},
		verifier: prov.Verifier(&oidc.Config{ClientID: p.cfg.OIDCClientID}),
	}
	return p.ready, nil
}

// warmUp discovers the provider at start, only to log early that it does
// not answer: sign-in tries again.
func (c *Console) warmUp(ctx context.Context) {
	if c.oidc == nil {
		return
	}
	if _, err := c.oidc.discover(ctx); err != nil && ctx.Err() == nil {
		c.deps.Log.Warn().Err(err).Msg("console single sign-on: the provider does not answer yet; sign-in will try again")
	}
}

// user is the signed-in OpenID user name, in groups.
func (p *oidcProvider) user(name string, groups []string) *user {
	// Read-only unless the policy file (OUTBOX_POLICY_FILE) grants the
	// user's name or groups a role: an OpenID user is in no users file, so
	// without a policy nothing says who may act.
	return &user{Name: name, ReadOnly: true, Auth: policy.AuthOIDC, Groups: groups}
}

// oidcStart begins a sign-in at the provider. It is a POST with the form
// token, so a page of another site cannot send a browser through a sign-in
// it did not ask for.
func (c *Console) oidcStart(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	if c.oidc == nil {
		c.renderError(w, r, http.StatusNotFound, "message", "Not found", nil, "Single sign-on is not configured.")
		return
	}
	ready, err := c.oidc.discover(r.Context())
	if err != nil {
		c.deps.Log.Warn().Err(err).Str("remote", clientIP(r)).Msg("console single sign-on: provider unavailable")
		c.renderError(w, r, http.StatusBadGateway, "signin", "Sign in", c.signInView(next, ""),
			"The sign-in provider does not answer. Try again in a minute; the replica's log says why.")
		return
	}
	flow := oidcFlow{State: rand.Text(), Nonce: rand.Text(), Verifier: oauth2.GenerateVerifier(), Next: next}
	v, err := c.sessions.flows.Encode(oidcFlowCookie, flow)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	// Lax, not Strict: the browser comes back from the provider's site,
	// and a Strict cookie would stay behind.
	http.SetCookie(w, &http.Cookie{Name: oidcFlowCookie, Value: v, Path: Prefix + "oidc/", MaxAge: int(oidcFlowTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	c.continueTo(w, r, ready.oauth.AuthCodeURL(flow.State, oidc.Nonce(flow.Nonce), oauth2.S256ChallengeOption(flow.Verifier)))
}

// continueView is the page that sends the browser on by itself.
type continueView struct{ URL string }

// continueTo answers with a page that moves the browser to u, where a
// redirect would not do: the CSP's form-action 'self' stops a form whose
// answer redirects to another site (the provider), and a browser back from
// the provider's site keeps the console's SameSite=Strict session cookie
// to itself for the rest of that navigation, redirects included, so the
// first page after sign-in would look signed out. A navigation the
// console's own page starts is neither.
func (c *Console) continueTo(w http.ResponseWriter, r *http.Request, u string) {
	c.render(w, r, http.StatusOK, "continue", "Signing in", continueView{URL: u})
}

// oidcCallback ends a sign-in at the provider: checks it belongs to this
// browser's flow, exchanges the code and verifies the ID token, then
// records the session as a password sign-in does.
func (c *Console) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if c.oidc == nil {
		c.renderError(w, r, http.StatusNotFound, "message", "Not found", nil, "Single sign-on is not configured.")
		return
	}
	// Every callback costs a request to the provider: bounded as sign-in
	// attempts are, by client address.
	if !c.limiter.allow(time.Now(), "oidc-addr:"+clientIP(r)) {
		c.deps.Log.Warn().Str("remote", clientIP(r)).Msg("console single sign-on callback rate limited")
		w.Header().Set("Retry-After", "60")
		c.signInRefused(w, r, http.StatusTooManyRequests, Prefix, "Too many sign-in attempts. Wait a minute, then try again.")
		return
	}
	flow, ok := c.takeFlow(w, r)
	q := r.URL.Query()
	switch {
	case q.Get("error") != "":
		c.providerRefused(w, r, flow.Next, q.Get("error"), q.Get("error_description"))
		return
	case !ok:
		c.deps.Log.Warn().Str("remote", clientIP(r)).Msg("console single sign-on callback without a flow cookie")
		c.signInRefused(w, r, http.StatusBadRequest, Prefix, "This sign-in expired or began in another browser. Sign in again.")
		return
	case !hmac.Equal([]byte(q.Get("state")), []byte(flow.State)):
		c.deps.Log.Warn().Str("remote", clientIP(r)).Msg("console single sign-on callback with a state of another flow")
		c.signInRefused(w, r, http.StatusBadRequest, flow.Next, "This sign-in does not match the one this browser began. Sign in again.")
		return
	}
	name, groups, err := c.oidcIdentity(r.Context(), flow, q.Get("code"))
	if err != nil {
		c.deps.Log.Warn().Err(err).Str("remote", clientIP(r)).Msg("console single sign-on refused")
		c.signInRefused(w, r, http.StatusUnauthorized, flow.Next, "The sign-in could not be completed: "+publicReason(err)+" Sign in again.")
		return
	}
	if c.users != nil && c.users.byName[name] != nil {
		// The policy names users by name, however they signed in: a
		// provider's user named as one of the users file would get that
		// user's roles.
		c.deps.Log.Warn().Str("user", name).Str("remote", clientIP(r)).Msg("console single sign-on refused: a name of the users file")
		c.signInRefused(w, r, http.StatusForbidden, flow.Next, "The provider's user "+name+
			" has the name of a user of the console's users file: sign in with that user's password, or remove the name from the file.")
		return
	}
	c.openOIDCSession(w, r, name, groups, flow.Next)
}

// takeFlow reads the flow cookie and deletes it: a flow is good for one
// callback.
func (c *Console) takeFlow(w http.ResponseWriter, r *http.Request) (oidcFlow, bool) {
	var flow oidcFlow
	ck, err := r.Cookie(oidcFlowCookie)
	if err != nil {
		return oidcFlow{Next: Prefix}, false
	}
	http.SetCookie(w, &http.Cookie{Name: oidcFlowCookie, Path: Prefix + "oidc/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	if c.sessions.flows.Decode(oidcFlowCookie, ck.Value, &flow) != nil || flow.State == "" {
		return oidcFlow{Next: Prefix}, false
	}
	flow.Next = safeNext(flow.Next)
	return flow, true
}

// providerRefused shows the provider's error code (access_denied when the
// user declined) and logs its description; the page shows only a code of
// the form the standard defines, never text from the URL.
func (c *Console) providerRefused(w http.ResponseWriter, r *http.Request, next, code, description string) {
	c.deps.Log.Warn().Str("error", code).Str("description", description).Str("remote", clientIP(r)).
		Msg("console single sign-on: the provider refused")
	shown := "an error"
	if len(code) <= 64 && strings.Trim(code, "abcdefghijklmnopqrstuvwxyz_") == "" {
		shown = code
	}
	c.signInRefused(w, r, http.StatusUnauthorized, next, "The sign-in provider refused the sign-in ("+shown+"). Nothing changed.")
}

// signInRefused shows the sign-in page with msg, keeping next for the next try.
func (c *Console) signInRefused(w http.ResponseWriter, r *http.Request, status int, next, msg string) {
	c.renderError(w, r, status, "signin", "Sign in", c.signInView(next, ""), msg)
}

// errIdentity is an error whose text a person may see.
type errIdentity struct{ public, detail string }

func (e *errIdentity) Error() string { return e.public + " " + e.detail }

// publicReason is the part of err the sign-in page shows: the provider's
// and the library's own words go to the log only.
func publicReason(err error) string {
	if e, ok := errors.AsType[*errIdentity](err); ok {
		return e.public
	}
	return "the provider's answer did not check out."
}

// oidcIdentity exchanges code, with the flow's PKCE verifier, for tokens,
// verifies the ID token (signature by the provider's keys, issuer,
// audience, expiry) and its nonce, and reads the user name and groups.
func (c *Console) oidcIdentity(ctx context.Context, flow oidcFlow, code string) (string, []string, error) {
	ready, err := c.oidc.discover(ctx)
	if err != nil {
		return "", nil, &errIdentity{"the sign-in provider does not answer.", err.Error()}
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, c.oidc.client), oidcTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, oauth2.HTTPClient, c.oidc.client)
	tok, err := ready.oauth.Exchange(ctx, code, oauth2.VerifierOption(flow.Verifier))
	if err != nil {
		return "", nil, &errIdentity{"the provider did not accept the sign-in's code (used already, or expired).", err.Error()}
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", nil, &errIdentity{"the provider sent no ID token.", "no id_token in the token response"}
	}
	idt, err := ready.verifier.Verify(ctx, raw)
	if err != nil {
		return "", nil, fmt.Errorf("verify the ID token: %w", err)
	}
	if !hmac.Equal([]byte(idt.Nonce), []byte(flow.Nonce)) {
		return "", nil, errors.New("the ID token's nonce is not the flow's")
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return "", nil, fmt.Errorf("read the ID token's claims: %w", err)
	}
	return identityOf(claims, c.cfg.OIDCUsernameClaim, c.cfg.OIDCGroupsClaim)
}

// identityOf reads the user name and groups of claims. An email as the
// user name must be one the provider verified, when it says: anyone may
// type any address into an account at many providers.
func identityOf(claims map[string]any, nameClaim, groupsClaim string) (string, []string, error) {
	name, _ := claims[nameClaim].(string)
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 256 || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return "", nil, &errIdentity{fmt.Sprintf("the ID token has no usable %q claim for the user name.", nameClaim), ""}
	}
	if verified, ok := claims["email_verified"].(bool); nameClaim == "email" && ok && !verified {
		return "", nil, &errIdentity{"the provider has not verified the user's email address.", name}
	}
	var groups []string
	switch g := claims[groupsClaim].(type) {
	case string:
		groups = []string{g}
	case []any:
		for _, v := range g {
			if s, ok := v.(string); ok && s != "" && len(groups) < oidcMaxGroups {
				groups = append(groups, s)
			}
		}
	}
	return name, groups, nil
}

// openOIDCSession records the session of an OpenID user and sends the
// browser on to next.
func (c *Console) openOIDCSession(w http.ResponseWriter, r *http.Request, name string, groups []string, next string) {
	sess, err := newSession(name)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if _, err := c.deps.Pool.Exec(r.Context(), signInSQL, signInArgs(sess, name, c.oidc.mark, policy.AuthOIDC, groups,
		c.sessions.ttl)); err != nil {
		c.fail(w, r, fmt.Errorf("record the session: %w", err))
		return
	}
	if err := c.sessions.write(w, r, sess); err != nil {
		c.fail(w, r, err)
		return
	}
	c.deps.Log.Info().Str("user", name).Str("auth", policy.AuthOIDC).Strs("groups", groups).Str("remote", clientIP(r)).
		Msg("console sign-in")
	c.continueTo(w, r, next)
}

// oidcURLOK says whether raw may be an OpenID provider's issuer: HTTPS, or
// plain HTTP on a loopback address only, since the client secret and the
// tokens cross it.
func oidcURLOK(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	ip := net.ParseIP(u.Hostname())
	return u.Scheme == "https" || u.Scheme == "http" && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback())
}
