package console

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replay"
)

// Everything the browser gets is in the binary: templates, the stylesheet
// and the icon. Nothing is fetched from elsewhere at run time.
//
//go:embed assets
var assets embed.FS

// pages are the templates by page name, each with the layout.
type pages map[string]*template.Template

var pageNames = []string{"signin", "continue", "message", "overview", "failed", "archived", "event", "confirm", "audit", "audit_entry"}

// pageFiles are the pages served by another page's template: the archived
// rows are listed as the failed ones are.
var pageFiles = map[string]string{"archived": "failed"}

var funcs = template.FuncMap{
	"time":    formatTime,
	"timep":   func(t *time.Time) string { return formatTimeP(t) },
	"ago":     ago,
	"age":     formatAge,
	"snippet": replay.Snippet,
	"ids":     replay.FormatIDs,
	"json":    prettyJSON,
	"deref": func(p *int64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	},
	"slice1": func(f field) []field { return []field{f} },
	// build is the running binary's version, in every signed-in page's
	// footer: which build an operator is looking at.
	"build": buildinfo.Get,
	"int64": func(n int) int64 { return int64(n) },
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
}

func loadPages() (pages, error) {
	p := pages{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+cmp.Or(pageFiles[name], name)+".html")
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", name, err)
		}
		p[name] = t
	}
	return p, nil
}

// view is what every page's template gets: the layout's parts, and the
// page's own Data.
type view struct {
	Title string
	Page  string
	// Section is the menu entry the page belongs to: the page's name, or
	// what its data says (a restore's confirmation belongs to Archived).
	Section string
	User    *user
	CSRF    string
	Replica *replicaView
	Error   string
	Notice  string
	Data    any
}

// sectioned is page data that belongs to a menu entry other than its page's.
type sectioned interface{ section() string }

// replicaView is the banner of every page: which replica this is, its role,
// and who leads.
type replicaView struct {
	leader.State
	Leader *outbox.LeaderInfo
	Err    string
}

// IsLeader says whether this replica leads right now.
func (v *replicaView) IsLeader() bool { return v.Role == leader.RoleLeader }

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, title string, data any) {
	c.renderError(w, r, status, page, title, data, "")
}

// renderError renders page with msg as its error line. The page is written
// only once it rendered whole, so a template error is a clean 500.
func (c *Console) renderError(w http.ResponseWriter, r *http.Request, status int, page, title string, data any, msg string) {
	rq := requestOf(r)
	v := view{Title: title, Page: page, Section: page, User: rq.user, CSRF: rq.csrf, Error: msg, Data: data}
	if s, ok := data.(sectioned); ok {
		v.Section = s.section()
	}
	if n := r.URL.Query().Get("notice"); n != "" && msg == "" {
		v.Notice = notices[n]
	}
	if rq.user != nil {
		v.Replica = c.replica(r.Context())
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		c.deps.Log.Error().Err(err).Str("page", page).Msg("console render")
		http.Error(w, "the page failed to render; the replica's log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// notices are the messages a redirect may ask the next page to show; by
// key, so that no text comes from the URL.
var notices = map[string]string{
	"paused":    "Paused. The leader stops claiming the projection's events within a poll interval.",
	"resumed":   "Resumed.",
	"replayed":  "Replayed: the rows are pending again, and the leader takes them at once. This audit row records it.",
	"discarded": "Discarded: the rows are closed for good. This audit row records it.",
	"archived":  "Archived: the rows moved to the dead letter with every column, under the same ids; Archived lists them. This audit row records it.",
	"archived-batches": "Archived: the rows moved to the dead letter in batches, each with its own audit row; this is the first, " +
		"the audit log lists the others. A row someone changed after the selection was checked is left where it is.",
	"replayed-batches": "Replayed in batches, each with its own audit row; this is the first, the audit log lists the others. " +
		"A row someone changed after the selection was checked is left where it is.",
	"discarded-batches": "Discarded in batches, each with its own audit row; this is the first, the audit log lists the others. " +
		"A row someone changed after the selection was checked is left where it is.",
	"restored": "Restored: the rows are pending again under the same ids, and the leader takes them at once. This audit row records it.",
}

// fail is a 500 page for an error the person cannot fix by changing the
// request; the text is shown (escaped) and logged.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	c.logOf(r).Error().Err(err).Str("path", r.URL.Path).Msg("console request failed")
	c.renderError(w, r, status, "message", "Error", nil, "Something failed: "+err.Error())
}

// replica reads the banner; an error is shown in it, not a failed page.
func (c *Console) replica(ctx context.Context) *replicaView {
	v := &replicaView{State: c.deps.State()}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l, err := outbox.LeaderOf(ctx, c.deps.Pool, c.deps.LeaderName)
	if err != nil {
		v.Err = err.Error()
	}
	v.Leader = l
	return v
}

// securityHeaders go on every answer of the console, pages, errors and
// assets alike. The CSP allows no script at all, styles and images only
// from the console itself, forms only to it, and no framing.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; "+
			"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
		if !strings.HasPrefix(r.URL.Path, Prefix+"static/") {
			h.Set("Cache-Control", "no-store")
		}
		if r.TLS != nil {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

func (c *Console) routes() http.Handler {
	static, _ := fs.Sub(assets, "assets/static")
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", staticFiles(static)))
	mux.HandleFunc("GET "+Prefix+"signin", c.signInPage)
	mux.HandleFunc("POST "+Prefix+"signin", c.signIn)
	mux.HandleFunc("POST "+Prefix+"signout", c.signed(c.signOut))
	mux.HandleFunc("POST "+Prefix+"oidc/start", c.oidcStart)
	mux.HandleFunc("GET "+OIDCCallbackPath, c.oidcCallback)
	mux.HandleFunc("GET "+Prefix+"{$}", c.signed(c.overview))
	mux.HandleFunc("GET "+Prefix+"failed", c.signed(c.failed))
	mux.HandleFunc("GET "+Prefix+"archived", c.signed(c.archived))
	mux.HandleFunc("GET "+Prefix+"events/{id}", c.signed(c.event))
	mux.HandleFunc("POST "+Prefix+"events/{id}/unmasked", c.signed(c.unmasked))
	mux.HandleFunc("GET "+Prefix+"audit", c.signed(c.audit))
	mux.HandleFunc("GET "+Prefix+"audit/{id}", c.signed(c.auditEntry))
	mux.HandleFunc("POST "+Prefix+"actions/dry-run", c.operator(c.dryRun))
	mux.HandleFunc("POST "+Prefix+"actions/apply", c.operator(c.apply))
	mux.HandleFunc("POST "+Prefix+"projections/pause", c.operator(c.pause))
	mux.HandleFunc(Prefix, c.signed(func(w http.ResponseWriter, r *http.Request) {
		c.renderError(w, r, http.StatusNotFound, "message", "Not found", nil, "There is no such page.")
	}))

	// The browser's own word on where a POST comes from (Sec-Fetch-Site,
	// Origin), before the form token is even read.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.deps.Log.Warn().Str("path", r.URL.Path).Str("origin", r.Header.Get("Origin")).Msg("console cross-origin POST refused")
		c.renderError(w, r, http.StatusForbidden, "message", "Refused", nil, "Refused: a form of another site may not post here.")
	}))
	timeout := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), requestTimeoutDefault)
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	return securityHeaders(timeout(cop.Handler(c.withSession(mux))))
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func formatTimeP(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t)
}

func formatAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return formatAge(time.Since(t)) + " ago"
}

func prettyJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		return string(raw)
	}
	return buf.String()
}
