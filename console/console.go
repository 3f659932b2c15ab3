package console

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/httpserve"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
)

// Defaults of Config. The CLI's flags take theirs from here.
const (
	AddrDefault       = "127.0.0.1"
	SessionTTLDefault = 8 * time.Hour
	// OIDCUsernameClaimDefault and OIDCGroupsClaimDefault are the ID
	// token's claims a single sign-on user's name and groups are read from.
	OIDCUsernameClaimDefault = "email"
	OIDCGroupsClaimDefault   = "groups"
)

// OIDCScopesDefault are the scopes single sign-on asks for: the ID token,
// and the claims the user name and groups default to.
var OIDCScopesDefault = []string{"openid", "email", "profile", "groups"}

// Prefix is the path every page of the console is under, on its own
// listener or mounted on the replica's HTTP listener.
const Prefix = "/console/"

const (
	signInPerMinuteDefault = 10
	signInBurstDefault     = 5
	requestTimeoutDefault  = 15 * time.Second
	// activityTTL is how long the overview's chart is reused: an hour of
	// acks is a count over many index entries, and a person reloading the
	// page needs no fresher bars.
	activityTTL = 10 * time.Second
	// maxFormBytes bounds a POST body: a selection of a whole page of ids
	// and a why fit many times over.
	maxFormBytes = 1 << 20
)

// Accepted ranges of Config.
var (
	// PortRange is what Port accepts; 0 is no listener of its own.
	PortRange       = bounds.Range[int]{Min: 0, Max: 65535}
	SessionTTLRange = bounds.Range[time.Duration]{Min: 5 * time.Minute, Max: 7 * 24 * time.Hour}
)

// Config configures the console.
type Config struct {
	// UsersFile is the htpasswd file of the users, bcrypt hashes only
	// (htpasswd -B). It or OIDCIssuer is required; both may be set.
	UsersFile string
	// ReadOnlyUsers are users of UsersFile who may look but not act; each
	// must be in the file. Defaults to none.
	ReadOnlyUsers []string
	// SessionKeyFile holds the secret, at least 32 bytes, that sessions are
	// signed and encrypted with; replicas sharing it share sessions.
	// Defaults to a random key of this process: its sessions end with it.
	SessionKeyFile string
	// SessionTTL is how long a sign-in lasts. Defaults to 8h.
	SessionTTL time.Duration
	// Addr is the bind address of the console's own listener. Defaults to
	// 127.0.0.1.
	Addr string
	// Port is the console's own listener; 0 serves it only through Handler,
	// which the caller mounts under Prefix. Defaults to 0.
	Port int
	// TLSCertFile and TLSKeyFile, both or neither, serve the own listener
	// over TLS, with Secure cookies. Default to plain HTTP.
	TLSCertFile, TLSKeyFile string
	// MaxProcessing is the stuck cap the overview counts with. Defaults to
	// 300s.
	MaxProcessing time.Duration
	// PolicyFile maps users and groups to roles: which projections and
	// scope keys each may see and which actions take (package policy).
	// Defaults to none: operators may do everything, read-only users look.
	PolicyFile string
	// SignInPerMinute and SignInBurst rate-limit sign-in attempts: per
	// browser for a browser that signed in as the name before, else per
	// client address and per user name; single sign-on callbacks per
	// client address. Default to 10 and 5.
	SignInPerMinute, SignInBurst int

	// OIDCIssuer is the issuer URL of an OpenID provider to sign in with
	// (single sign-on, the authorization code flow with PKCE): HTTPS, or
	// HTTP on a loopback address. Defaults to none: no single sign-on.
	OIDCIssuer string
	// OIDCClientID is the console's client id at the provider. Required
	// with OIDCIssuer.
	OIDCClientID string
	// OIDCClientSecretFile holds the client's secret. Required with
	// OIDCIssuer.
	OIDCClientSecretFile string
	// OIDCRedirectURL is the console's public URL of OIDCCallbackPath, as
	// registered at the provider. Required with OIDCIssuer.
	OIDCRedirectURL string
	// OIDCUsernameClaim is the ID token claim that names the user.
	// Defaults to email.
	OIDCUsernameClaim string
	// OIDCGroupsClaim is the ID token claim that lists the user's groups.
	// Defaults to groups.
	OIDCGroupsClaim string
	// OIDCScopes are the scopes asked for; openid is always among them.
	// Defaults to openid, email, profile, groups.
	OIDCScopes []string
	// OIDCProviderName names the provider on the sign-in button. Defaults
	// to the issuer's host.
	OIDCProviderName string
}

// Deps is what the console reads and acts on.
type Deps struct {
	// Pool is the outbox database. Required.
	Pool *pgxpool.Pool
	// State is this replica's role, as its elector sees it. Required.
	State func() leader.State
	// LeaderName is the name the replicas compete under. Required.
	LeaderName string
	// Projections are the projections the binary knows: the overview shows
	// each one's lag and pause, and only these can be paused.
	Projections []string
	// ProjectionSpecs say how each projection is built, in the projections
	// file's order, for the overview to list. Defaults to none.
	ProjectionSpecs []ProjectionInfo
	// ProjectionsHash identifies this replica's projections (the replica's
	// Specs.Hash); the overview sets it beside the hash the leader recorded.
	// Defaults to none: the overview makes no comparison.
	ProjectionsHash string
	Log             zerolog.Logger
	// Horizon reads the database's vacuum horizon for the overview and
	// remembers since when it has seen each holder; the replica shares the
	// one its metrics poller reads, so an age Postgres does not show counts
	// from the poller's first sight. Defaults to a watch of the console's own.
	Horizon *outbox.HorizonWatch
	// Waiting says, for each projection whose events wait on this replica
	// (a search index not set up while its engine is away), why. Defaults
	// to none.
	Waiting func() map[string]string
	// Masks hide each projection's masked payload fields on the event
	// page (package mask), by projection name; the unmasked read shows
	// them to a user mayUnmask allows, audited. Defaults to none.
	Masks map[string]*mask.Mask
}

// ProjectionInfo is how one projection is built, as the overview lists it.
// It holds no secret: the replica fills it from its projections file, whose
// secrets are only named there, and leaves their names out too.
type ProjectionInfo struct {
	Name string
	// Kind is "search" or "chronicle".
	Kind string
	// Alias is the index alias a search projection writes.
	Alias string
	// Nodes are a search projection's engine URLs; New drops any user info
	// from them.
	Nodes []string
	// SourceTable is what a scheduled verify compares a search projection
	// with ("" for the ledger alone), or the table a chronicle appends to.
	SourceTable string
	// Waiting is why the projection's events wait, "" when they do not;
	// the overview fills it in from Deps.Waiting at each view.
	Waiting string
}

func (c Config) withDefaults() Config {
	c.SessionTTL = cmp.Or(c.SessionTTL, SessionTTLDefault)
	c.Addr = cmp.Or(c.Addr, AddrDefault)
	c.MaxProcessing = cmp.Or(c.MaxProcessing, outbox.MaxProcessingDefault)
	c.SignInPerMinute = cmp.Or(c.SignInPerMinute, signInPerMinuteDefault)
	c.SignInBurst = cmp.Or(c.SignInBurst, signInBurstDefault)
	if c.OIDCIssuer != "" {
		c.OIDCUsernameClaim = cmp.Or(c.OIDCUsernameClaim, OIDCUsernameClaimDefault)
		c.OIDCGroupsClaim = cmp.Or(c.OIDCGroupsClaim, OIDCGroupsClaimDefault)
		if len(c.OIDCScopes) == 0 {
			c.OIDCScopes = OIDCScopesDefault
		}
		if !slices.Contains(c.OIDCScopes, "openid") {
			c.OIDCScopes = append([]string{"openid"}, c.OIDCScopes...)
		}
		if u, err := url.Parse(c.OIDCIssuer); err == nil && c.OIDCProviderName == "" {
			c.OIDCProviderName = u.Host
		}
	}
	return c
}

// On says whether the console has a way to sign in, a users file or an
// OpenID provider: without one it has no page to serve, and is off.
func (c Config) On() bool { return c.UsersFile != "" || c.OIDCIssuer != "" }

// Validate checks the settings that need no file read; a range error is a
// *bounds.FieldError. It applies no defaults: a zero SessionTTL or Port is
// checked as given (the sign-in limits, which have no flag, take theirs).
func (c Config) Validate() error {
	switch {
	case c.UsersFile == "" && c.OIDCIssuer == "":
		return bounds.Invalid("UsersFile", "is required unless single sign-on is set up (an OpenID issuer): the console has no page without sign-in")
	case c.UsersFile == "" && len(c.ReadOnlyUsers) > 0:
		return bounds.Invalid("ReadOnlyUsers", "is set without a users file, whose users it names")
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		return bounds.Invalid("TLSKeyFile", "is required with a TLS certificate")
	case c.TLSKeyFile != "" && c.TLSCertFile == "":
		return bounds.Invalid("TLSCertFile", "is required with a TLS key")
	case c.TLSCertFile != "" && c.Port == 0:
		return bounds.Invalid("Port", "must be the console's own port to serve TLS: the HTTP listener serves health checks in plain HTTP")
	}
	if err := c.validateOIDC(); err != nil {
		return err
	}
	return bounds.First(
		bounds.Check("Port", c.Port, PortRange),
		bounds.Check("SessionTTL", c.SessionTTL, SessionTTLRange),
		bounds.Check("SignInPerMinute", c.SignInPerMinute, bounds.Range[int]{Min: 0, Max: 10_000}),
		bounds.Check("SignInBurst", c.SignInBurst, bounds.Range[int]{Min: 0, Max: 10_000}),
	)
}

// validateOIDC checks the single sign-on settings: all of them with an
// issuer, none without.
func (c Config) validateOIDC() error {
	if c.OIDCIssuer == "" {
		for _, s := range []struct {
			field string
			set   bool
		}{{"OIDCClientID", c.OIDCClientID != ""}, {"OIDCClientSecretFile", c.OIDCClientSecretFile != ""},
			{"OIDCRedirectURL", c.OIDCRedirectURL != ""}} {
			if s.set {
				return bounds.Invalid(s.field, "is set, but single sign-on is off: the OpenID issuer is empty")
			}
		}
		return nil
	}
	switch {
	case !oidcURLOK(c.OIDCIssuer):
		return bounds.Invalid("OIDCIssuer", "%q is not an https:// URL (http:// only on a loopback address), without user, query or fragment", c.OIDCIssuer)
	case c.OIDCClientID == "":
		return bounds.Invalid("OIDCClientID", "is required for single sign-on")
	case c.OIDCClientSecretFile == "":
		return bounds.Invalid("OIDCClientSecretFile", "is required for single sign-on")
	case c.OIDCRedirectURL == "":
		return bounds.Invalid("OIDCRedirectURL", "is required for single sign-on: the console's public URL followed by %s", OIDCCallbackPath)
	}
	u, err := url.Parse(c.OIDCRedirectURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Path != OIDCCallbackPath ||
		u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return bounds.Invalid("OIDCRedirectURL", "%q is not the console's public URL followed by %s", c.OIDCRedirectURL, OIDCCallbackPath)
	}
	if c.PolicyFile == "" {
		// The provider says who someone is, the policy what they may see:
		// without one, everyone the provider knows would read every
		// projection and scope.
		return bounds.Invalid("PolicyFile", "is required for single sign-on: it gives the provider's users and groups their roles")
	}
	return nil
}

// Console is the operator's web UI of one replica.
type Console struct {
	cfg  Config
	deps Deps
	// users is nil without a users file: single sign-on only.
	users    *users
	policy   *policy.Policy
	sessions *sessions
	// oidc is nil without single sign-on.
	oidc    *oidcProvider
	limiter *signInLimiter
	pages   pages
	handler http.Handler

	// srv is the console's own listener; nil without one.
	srv *httpserve.Server

	activity struct {
		sync.Mutex
		at      time.Time
		buckets []outbox.Bucket
	}
}

// New reads the users and the session key, and binds the console's own
// listener if it has one, so that a bad file or a taken port fails at start.
func New(cfg Config, deps Deps) (*Console, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Pool == nil || deps.State == nil || deps.LeaderName == "" {
		return nil, errors.New("console: Pool, State and LeaderName are required")
	}
	var u *users
	if cfg.UsersFile != "" {
		var err error
		if u, err = loadUsers(cfg.UsersFile, cfg.ReadOnlyUsers); err != nil {
			return nil, err
		}
	}
	sess, err := newSessions(cfg.SessionKeyFile, cfg.SessionTTL)
	if err != nil {
		return nil, err
	}
	op, err := newOIDCProvider(cfg, sess)
	if err != nil {
		return nil, err
	}
	pol, err := loadPolicy(cfg.PolicyFile, deps.Projections)
	if err != nil {
		return nil, err
	}
	p, err := loadPages()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, deps: deps, users: u, policy: pol, sessions: sess, oidc: op, pages: p,
		limiter: newSignInLimiter(cfg.SignInPerMinute, cfg.SignInBurst)}
	if c.deps.Horizon == nil {
		c.deps.Horizon = &outbox.HorizonWatch{}
	}
	c.deps.ProjectionSpecs = withoutUserInfo(deps.ProjectionSpecs)
	c.deps.Log = deps.Log.With().Str("service", "console").Logger()
	c.handler = c.routes()
	if cfg.Port != 0 {
		if err := c.listen(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Handler serves the pages under Prefix; mount it there.
func (c *Console) Handler() http.Handler { return c.handler }

func (c *Console) listen() error {
	var tlsConfig *tls.Config
	if c.cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.cfg.TLSCertFile, c.cfg.TLSKeyFile)
		if err != nil {
			return bounds.Invalid("TLSCertFile", "%v", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	mux := http.NewServeMux()
	mux.Handle(Prefix, c.handler)
	mux.Handle("GET /{$}", http.RedirectHandler(Prefix, http.StatusFound))
	var err error
	c.srv, err = httpserve.Listen(c.cfg.Addr, c.cfg.Port, &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: requestTimeoutDefault + 15*time.Second, MaxHeaderBytes: 64 << 10}, tlsConfig)
	return err
}

// Addr is the address of the console's own listener; empty without one.
func (c *Console) Addr() string {
	if c.srv == nil {
		return ""
	}
	return c.srv.Addr()
}

// Start serves the own listener, if any, until Stop or ctx ends (a
// startstop.Service).
func (c *Console) Start(ctx context.Context) error {
	go c.warmUp(ctx)
	if c.srv == nil {
		return nil
	}
	return c.srv.Start(ctx)
}

// Stop stops the own listener, letting requests in flight finish for a
// second.
func (c *Console) Stop() {
	if c.srv != nil {
		c.srv.Stop()
	}
}

// staticFiles serves the files of fsys and answers 404 for a directory:
// http.FileServer would list it, telling anyone what the console ships.
func staticFiles(fsys fs.FS) http.Handler {
	files := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(path.Clean("/"+r.URL.Path), "/")
		if info, err := fs.Stat(fsys, cmp.Or(name, ".")); err != nil || info.IsDir() {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// withoutUserInfo copies specs with each node URL stripped to what a page
// may show. A file's URLs carry no credentials (the replica refuses them),
// but without a file the nodes are ELASTIC_URL's, which may; a query string
// could hold a key. A URL that does not parse is not shown at all: its text
// could be anything.
func withoutUserInfo(specs []ProjectionInfo) []ProjectionInfo {
	out := slices.Clone(specs)
	for i := range out {
		nodes := make([]string, 0, len(out[i].Nodes))
		for _, raw := range out[i].Nodes {
			u, err := url.Parse(strings.TrimSpace(raw))
			if err != nil || u.Host == "" {
				nodes = append(nodes, "(not a URL)")
				continue
			}
			u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
			nodes = append(nodes, u.String())
		}
		out[i].Nodes = nodes
	}
	return out
}
