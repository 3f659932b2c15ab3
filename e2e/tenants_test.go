package e2e

// Issue 42's end to end: operators sign in through a real OpenID provider
// (Dex), the policy file gives each a role by group, and the real binary
// holds each to its scope: library-3's and library-4's operators see and
// change exactly their library's events through the console and get 403
// (audited) elsewhere; the viewer looks at everything and changes nothing;
// the privacy officer reads masked payloads whole, each read audited. A
// masked value, which the engine's refusal quotes, appears nowhere a
// person or a collector can search for it but the audited unmasked read.

import (
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/dex"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

const tenantsPolicy = `
roles:
  library-3:
    actions: [replay, discard]
    projections: [search]
    scopes: [library-3]
  library-4:
    actions: [replay, discard]
    projections: [search]
    scopes: [library-4]
  viewer:
    actions: [view]
    projections: ["*"]
    scopes: ["*"]
  privacy:
    actions: [view, unmask]
    projections: ["*"]
    scopes: ["*"]
groups:
  lib3-ops: [library-3]
  lib4-ops: [library-4]
  support: [viewer]
  privacy-office: [privacy]
`

// tenantUsers are the provider's people: email, group.
var tenantUsers = [][2]string{
	{"ines@example.com", "lib3-ops"}, {"omar@example.com", "lib4-ops"},
	{"vera@example.com", "support"}, {"pia@example.com", "privacy-office"},
}

const tenantPassword = "correct horse 42"

func TestTenantsThroughSingleSignOn(t *testing.T) {
	t.Parallel()
	const marker = "MARKER-tenant-51f7"
	recv, endpoint := startHTTPReceiver(t)
	port, err := harness.FreePort()
	require.NoError(t, err)
	base := "http://127.0.0.1:" + strconv.Itoa(port) + "/console/"
	var people []dex.User
	for _, u := range tenantUsers {
		people = append(people, dex.User{Email: u[0], Password: tenantPassword, Username: strings.Split(u[0], "@")[0], Groups: []string{u[1]}})
	}
	provider := dex.Start(t, dex.Config{RedirectURIs: []string{base + "oidc/callback"}, Users: people})
	dir := t.TempDir()
	secret, policyFile := filepath.Join(dir, "oidc-secret"), filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(secret, []byte(provider.ClientSecret), 0o600))
	require.NoError(t, os.WriteFile(policyFile, []byte(tenantsPolicy), 0o600))
	c := newCluster(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=100", "OUTBOX_CONSOLE_PORT="+strconv.Itoa(port), "OUTBOX_POLICY_FILE="+policyFile,
		"OUTBOX_CONSOLE_OIDC_ISSUER="+provider.Issuer, "OUTBOX_CONSOLE_OIDC_CLIENT_ID="+provider.ClientID,
		"OUTBOX_CONSOLE_OIDC_CLIENT_SECRET_FILE="+secret, "OUTBOX_CONSOLE_OIDC_REDIRECT_URL="+base+"oidc/callback")
	file, _ := maskedProjection(t, harness.ElasticURL(t), c.index)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	r := c.run("a")

	// Three refused events and one fine in each library; the refused
	// ones' masked phone holds the marker, which the engine quotes.
	c.db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'search', 'book', l || '-' || g, 'upsert', 1,
		       jsonb_build_object('title', 'b' || g, 'contact', jsonb_build_object('phone',
		           CASE WHEN g < 4 THEN to_jsonb($1::text) ELSE to_jsonb(5550100 + g) END)), 'library-' || l
		  FROM generate_series(3, 4) l, generate_series(1, 4) g`, marker)
	harness.Eventually(t, 30*time.Second, "six mapping errors, two done", func() bool {
		return c.count(`status = 'failed' AND error_reason = 'mapping_error'`) == 6 && c.count(`status = 'done'`) == 2
	})
	ids := func(scope string) []string {
		return harness.Column[string](t, c.db, `SELECT id::text FROM outbox_events WHERE status = 'failed' AND scope_key = $1 ORDER BY id`, scope)
	}
	lib3, lib4 := ids("library-3"), ids("library-4")

	var seen output
	ines := signInThroughDex(t, base, "ines@example.com", &seen)
	require.ElementsMatch(t, lib3, ines.listed("failed"))
	require.Empty(t, ines.listed("failed?scope_key=library-4"), "a filter on another library widens nothing")
	ines.refused("events/" + lib4[0])
	ines.refusedPost("actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {lib3[0], lib4[0]}})
	ines.refusedPost("projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}, "why": {"x"}})
	ines.confirmed(url.Values{"action": {"replay"}, "scope": {"filter"}, "reason": {"mapping_error"}}, 3, "mapping widened (CHG-42)")
	require.Equal(t, 3, c.count(`scope_key = 'library-3' AND replay_count = 1`))
	require.Equal(t, 0, c.count(`scope_key = 'library-4' AND replay_count <> 0`), "library-4's rows are untouched")

	omar := signInThroughDex(t, base, "omar@example.com", &seen)
	require.ElementsMatch(t, lib4, omar.listed("failed"))
	omar.refused("events/" + lib3[0])
	omar.confirmed(url.Values{"action": {"discard"}, "scope": {"ids"}, "id": {lib4[0]}}, 1, "duplicate (CHG-43)")
	require.Equal(t, 1, c.count(`scope_key = 'library-4' AND status = 'discarded'`))

	harness.Eventually(t, 30*time.Second, "ines's replays failed again", func() bool {
		return c.count(`scope_key = 'library-3' AND status = 'failed'`) == 3
	})
	vera := signInThroughDex(t, base, "vera@example.com", &seen)
	require.ElementsMatch(t, append(slices.Clone(lib3), lib4[1:]...), vera.listed("failed"))
	vera.refusedPost("actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {lib3[0]}})
	vera.refusedPost("events/"+lib3[0]+"/unmasked", url.Values{"why": {"curious"}})

	pia := signInThroughDex(t, base, "pia@example.com", &seen)
	page := pia.page("events/" + lib4[1])
	require.Contains(t, page, "***", "the event page masks the phone")
	code, _, _ := pia.post("events/"+lib4[1]+"/unmasked", url.Values{})
	require.Equal(t, http.StatusBadRequest, code, "no why, nothing shown")
	code, unmasked, _ := pia.postUnrecorded("events/"+lib4[1]+"/unmasked", url.Values{"why": {"subject access request SAR-7"}})
	require.Equal(t, http.StatusOK, code, unmasked)
	require.Contains(t, unmasked, marker, "the audited read shows the payload whole")

	// The audit trail: each refusal, each action and the one unmasked read,
	// by whom, with the request id the log lines and spans carry.
	audit := harness.Column[string](t, c.db, `SELECT action || ' ' || replayed_by || ' ' || (request_id IS NOT NULL)::text
		FROM outbox_replay_audit ORDER BY id`)
	require.Equal(t, []string{
		"refused ines@example.com true", "refused ines@example.com true", "refused ines@example.com true",
		"replay ines@example.com true",
		"refused omar@example.com true", "discard omar@example.com true",
		"refused vera@example.com true", "refused vera@example.com true",
		"unmask pia@example.com true",
	}, audit)
	unmaskRequest := c.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'unmask' AND reason = 'subject access request SAR-7'
		AND event_ids = ARRAY[$1::bigint] AND actor->>'auth' = 'oidc' AND actor->'groups' ? 'privacy-office'`, lib4[1])
	require.Equal(t, 1, unmaskRequest)

	// Nowhere else: the CLI's views, the rows' error texts, the spans, the logs.
	seen.add("wlproj failed list", c.cli("failed", "list"))
	seen.add("wlproj failed list --json", c.cli("failed", "list", "--json"))
	seen.add("wlproj event", c.cli("event", lib3[0], "--projections-file", file))
	seen.add("wlproj event --json", c.cli("event", lib3[0], "--json", "--projections-file", file))
	seen.add("the rows' errors", strings.Join(harness.Column[string](t, c.db,
		`SELECT coalesce(last_error, '') || error_history::text FROM outbox_events`), "\n"))
	harness.Eventually(t, 20*time.Second, "the console's spans exported", func() bool {
		return slices.ContainsFunc(recv.received(), func(s receivedSpan) bool {
			return strings.HasPrefix(s.span.GetName(), "wlproj.console ")
		})
	})
	var spans strings.Builder
	for _, s := range recv.received() {
		spans.WriteString(s.span.String() + "\n")
	}
	seen.add("exported spans", spans.String())
	r.Stop(10 * time.Second)
	seen.add("logs", r.Logs())
	for _, s := range seen.all() {
		require.NotContains(t, s.text, marker, s.what)
		require.NotContains(t, s.text, "51f7", s.what)
	}
	requestID := c.db.Int(t, `SELECT count(*) FROM outbox_replay_audit a WHERE action = 'replay'`)
	require.Equal(t, 1, requestID)
	var replayRequest string
	require.NoError(t, c.db.Pool.QueryRow(t.Context(), `SELECT request_id FROM outbox_replay_audit WHERE action = 'replay'`).Scan(&replayRequest))
	require.Contains(t, r.Logs(), `"request_id":"`+replayRequest+`"`, "the replay's log line carries the audit row's request id")
	require.Contains(t, spans.String(), replayRequest, "and its span")
}

// ssoBrowser is a person's browser on the console: a cookie jar, the form
// token of the last page, and every page it was shown, recorded.
type ssoBrowser struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string
	seen *output
	who  string
}

var (
	reMetaRefresh = regexp.MustCompile(`<meta http-equiv="refresh" content="0;url=([^"]+)">`)
	reDexForm     = regexp.MustCompile(`<form method="post" action="([^"]*)"`)
	reListedEvent = regexp.MustCompile(`<td><a href="/console/events/(\d+)">`)
	reCount       = regexp.MustCompile(`<strong id="confirm-count">(\d+)</strong>`)
	reHiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// signInThroughDex signs email in as a person would: the console's button,
// Dex's login form, back to the console.
func signInThroughDex(t *testing.T, base, email string, seen *output) *ssoBrowser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	b := &ssoBrowser{t: t, base: base, seen: seen, who: email, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.page("signin")
	_, started, _ := b.post("oidc/start", url.Values{"next": {"/console/"}})
	m := reMetaRefresh.FindStringSubmatch(started)
	require.NotNil(t, m, "the start sends the browser to the provider: %s", started)
	dexBrowser := &http.Client{Jar: jar, Timeout: 20 * time.Second, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasSuffix(req.URL.Path, "/oidc/callback") {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := dexBrowser.Get(html.UnescapeString(m[1]))
	require.NoError(t, err)
	form, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	fm := reDexForm.FindSubmatch(form)
	require.NotNil(t, fm, "Dex's login form: %s", form)
	action, err := resp.Request.URL.Parse(html.UnescapeString(string(fm[1])))
	require.NoError(t, err)
	resp, err = dexBrowser.PostForm(action.String(), url.Values{"login": {email}, "password": {tenantPassword}})
	require.NoError(t, err)
	_ = resp.Body.Close()
	callback, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	_, landed, _ := b.get(strings.TrimPrefix(callback.String(), base))
	if m := reMetaRefresh.FindStringSubmatch(landed); m != nil {
		landed = b.page(strings.TrimPrefix(html.UnescapeString(m[1]), "/console/"))
	}
	require.Contains(t, landed, html.EscapeString(email), "signed in as %s", email)
	return b
}

func (b *ssoBrowser) do(req *http.Request, record bool) (int, string, string) {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	if m := reConsoleCSRF.FindSubmatch(body); m != nil {
		b.csrf = string(m[1])
	}
	if record {
		b.seen.add(fmt.Sprintf("console %s %s as %s", req.Method, req.URL.Path, b.who), string(body))
	}
	return resp.StatusCode, string(body), resp.Header.Get("Location")
}

func (b *ssoBrowser) get(path string) (int, string, string) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	require.NoError(b.t, err)
	return b.do(req, true)
}

// page is a page that must be shown.
func (b *ssoBrowser) page(path string) string {
	b.t.Helper()
	code, body, _ := b.get(path)
	require.Equal(b.t, http.StatusOK, code, "%s: %s", path, body)
	return body
}

func (b *ssoBrowser) postForm(path string, form url.Values, record bool) (int, string, string) {
	b.t.Helper()
	form.Set("csrf", b.csrf)
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req, record)
}

func (b *ssoBrowser) post(path string, form url.Values) (int, string, string) {
	b.t.Helper()
	return b.postForm(path, form, true)
}

// postUnrecorded is the one response allowed to hold the masked value.
func (b *ssoBrowser) postUnrecorded(path string, form url.Values) (int, string, string) {
	b.t.Helper()
	return b.postForm(path, form, false)
}

// listed are the event ids a list page shows.
func (b *ssoBrowser) listed(path string) []string {
	b.t.Helper()
	var ids []string
	for _, m := range reListedEvent.FindAllStringSubmatch(b.page(path), -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func (b *ssoBrowser) refused(path string) {
	b.t.Helper()
	code, body, _ := b.get(path)
	require.Equal(b.t, http.StatusForbidden, code, "%s as %s: %s", path, b.who, body)
	require.Contains(b.t, body, "the refusal is audited")
}

func (b *ssoBrowser) refusedPost(path string, form url.Values) {
	b.t.Helper()
	code, body, _ := b.post(path, form)
	require.Equal(b.t, http.StatusForbidden, code, "%s as %s: %s", path, b.who, body)
}

// confirmed runs the dry run of form, checks its count, and confirms it
// with why.
func (b *ssoBrowser) confirmed(form url.Values, count int, why string) {
	b.t.Helper()
	code, body, _ := b.post("actions/dry-run", form)
	require.Equal(b.t, http.StatusOK, code, body)
	m := reCount.FindStringSubmatch(body)
	require.NotNil(b.t, m, body)
	require.Equal(b.t, strconv.Itoa(count), m[1])
	i := strings.Index(body, `id="confirm-form"`)
	require.GreaterOrEqual(b.t, i, 0)
	confirm := url.Values{}
	for _, h := range reHiddenField.FindAllStringSubmatch(body[i:], -1) {
		if h[1] != "csrf" {
			confirm.Add(h[1], html.UnescapeString(h[2]))
		}
	}
	confirm.Set("why", why)
	code, body, _ = b.post("actions/apply", confirm)
	require.Equal(b.t, http.StatusSeeOther, code, body)
}
