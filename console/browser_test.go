package console

// The console in a real browser: Debian's chromium, driven by chromedp,
// against two real replicas (the built binary) on the real stack. One
// scenario, in the order an operator lives it: sign in, look, filter, fix
// the cause, dry-run, replay, audit; archive old failures and restore one;
// then what a read-only user and a forger may not do, a payload that tries
// to run, a standby's page, and a kill -9 of the leader with the console
// still at work.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

// chromiumPath is Debian's chromium, which scripts/tools.sh installs; the
// tests never fetch a browser of their own.
const chromiumPath = "/usr/bin/chromium"

// browser is one chromium tab (and its own cookie jar) under test.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

// needChromium skips without chromium, unless under CI, where a missing
// browser must fail rather than pass silently.
func needChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("%s is missing: run scripts/tools.sh (make test does); under CI this test fails instead", chromiumPath)
		}
		t.Fatalf("%s is missing under CI: scripts/tools.sh should have installed it", chromiumPath)
	}
}

// newBrowser starts chromium headless with a fresh profile; every browser
// has its own cookies. Screenshots go to $WLPROJ_SCREENSHOTS when set.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	// Chromium puts its singleton socket in TMPDIR, where it would outlive
	// the test; t.TempDir's path is too long for a socket.
	tmp, err := os.MkdirTemp("", "wlproj-chromium-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Env("TMPDIR="+tmp),
		chromedp.WindowSize(1400, 1000),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium") // no timeout: it would end the browser
	return &browser{t: t, ctx: ctx, shots: os.Getenv("WLPROJ_SCREENSHOTS")}
}

// timeout bounds one step; the browser outlives it.
func (b *browser) timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.ctx, 30*time.Second)
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	run(b, "steps", func(ctx context.Context) (chromedp.Void, error) { return chromedp.Void{}, chromedp.Do(ctx, steps...) })
}

// run runs one step within the timeout and fails the test on an error;
// what names the step in the failure.
func run[T any](b *browser, what string, step func(context.Context) (T, error)) T {
	b.t.Helper()
	ctx, cancel := b.timeout()
	defer cancel()
	v, err := step(ctx)
	require.NoError(b.t, err, what)
	return v
}

// action runs one chromedp action; see run.
func action[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	return run(b, what, func(ctx context.Context) (T, error) { return chromedp.Run(ctx, a) })
}

// open navigates and returns the HTTP status of the page.
func (b *browser) open(u string) int {
	b.t.Helper()
	return int(action(b, u, chromedp.NavigateResponse(u)).Status)
}

// submit clicks a form's button and waits for the page it leads to.
func (b *browser) submit(sel chromedp.ID) int {
	b.t.Helper()
	resp := run(b, fmt.Sprintf("submit %s", sel), func(ctx context.Context) (*network.Response, error) {
		return chromedp.RunResponse(ctx, chromedp.Click(sel))
	})
	return int(resp.Status)
}

func (b *browser) text(sel chromedp.ID) string {
	b.t.Helper()
	return strings.TrimSpace(action(b, fmt.Sprintf("text of %s", sel), chromedp.Text(sel)))
}

func (b *browser) eval(expr string) bool {
	b.t.Helper()
	return action(b, expr, chromedp.Evaluate[bool](expr))
}

func (b *browser) count(css string) int {
	b.t.Helper()
	return action(b, css, chromedp.Evaluate[int]("document.querySelectorAll("+strconv.Quote(css)+").length"))
}

// shot saves a screenshot of the whole page as name.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	if b.shots == "" {
		return
	}
	png := action(b, "screenshot "+name, chromedp.FullScreenshot(100))
	require.NoError(b.t, os.MkdirAll(b.shots, 0o755))
	require.NoError(b.t, os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644))
}

// cookie is the browser's console session cookie for u.
func (b *browser) cookie(u string) *http.Cookie {
	b.t.Helper()
	res := run(b, "cookies of "+u, func(ctx context.Context) (network.GetCookiesResult, error) {
		return chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{u + Prefix}})
	})
	for _, c := range res.Cookies {
		if c.Name == cookieName {
			require.True(b.t, c.HTTPOnly, "the session cookie is HttpOnly")
			require.Equal(b.t, network.CookieSameSiteStrict, c.SameSite)
			return &http.Cookie{Name: c.Name, Value: c.Value}
		}
	}
	b.t.Fatalf("no %s cookie for %s", cookieName, u)
	return nil
}

func (b *browser) signIn(base, user, password string) {
	b.t.Helper()
	require.Equal(b.t, http.StatusOK, b.open(base+Prefix), "an unsigned visitor lands on the sign-in page")
	b.do(chromedp.SendKeys(chromedp.ID("user"), user), chromedp.SendKeys(chromedp.ID("password"), password))
	require.Equal(b.t, http.StatusOK, b.submit("signin"))
	require.Contains(b.t, b.text("replica"), "This replica")
}

// forge posts form to u with cookie, as a script outside the browser would.
func forge(t *testing.T, u string, cookie *http.Cookie, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(cookie)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestBrowserConsole(t *testing.T) {
	needChromium(t)
	t.Parallel()
	ctx := context.Background()
	db, index := harness.NewDatabase(t), harness.NewIndex(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "session.key")
	require.NoError(t, os.WriteFile(key, []byte(harness.UniqueName("k")+harness.UniqueName("e")+harness.UniqueName("y")), 0o600))
	env := harness.ReplicaEnv(db.URL, harness.ElasticURL(t), index, slices.Concat(harness.Quick, []string{
		"OUTBOX_CONSOLE_USERS_FILE=" + usersFile(t),
		"OUTBOX_CONSOLE_READONLY_USERS=viv",
		"OUTBOX_CONSOLE_SESSION_KEY_FILE=" + key,
	})...)

	// a leads and serves the console on its HTTP port; b, a standby, on a
	// port of its own. They share the session key, so one sign-in serves
	// both (cookies do not tell ports apart).
	a := harness.StartReplica(t, "console-a", env)
	harness.Healthy(t, a)
	harness.Leader(t, a)
	bPort := harness.Port(t)
	b := harness.StartReplica(t, "console-b", append(slices.Clone(env), "OUTBOX_CONSOLE_PORT="+strconv.Itoa(bPort)))
	harness.Healthy(t, b)
	require.NoError(t, harness.WaitStandby(ctx, 20*time.Second, db.Pool, b, leader.LockSessionName(b.Name)))
	aURL, bURL := "http://127.0.0.1:"+strconv.Itoa(a.HTTPPort), "http://127.0.0.1:"+strconv.Itoa(bPort)

	// Five books the strict mapping refuses (no isbn): mapping_error. Two
	// rows that failed on the engine, and one whose payload and error try
	// to run a script.
	db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, scope_key)
		SELECT 'book', 'isbn-' || g, 'upsert', 1,
		       jsonb_build_object('kind', 'book', 'title', 'Book ' || g, 'isbn', '978-0-00-00000' || g), 'lib-1'
		  FROM generate_series(1, 5) g`)
	harness.Eventually(t, 30*time.Second, "five mapping errors", func() bool {
		return db.Count(t, `status = 'failed' AND error_reason = 'mapping_error'`) == 5
	})
	db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload, scope_key, status, attempts,
		                           error_class, error_reason, last_error, updated_at)
		SELECT 'book', 'engine-' || g, 'upsert', '{"kind": "book", "title": "t"}', 'lib-2', 'failed', 10,
		       'transient', 'server_error', 'bulk: 503 Service Unavailable', now() - interval '5 minutes'
		  FROM generate_series(1, 2) g`)
	var scriptID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload, status, attempts, error_class, error_reason, last_error)
		VALUES ('book', 'xss', 'upsert', '{"title": "<script>window.__pwned = 1</script>"}', 'failed', 1,
		        'deterministic', 'client_error', 'bad field <img src=x onerror="window.__pwned = 2">')
		RETURNING id`).Scan(&scriptID))

	ada := newBrowser(t)
	t.Run("sign in and see the leader", func(t *testing.T) {
		ada.t = t
		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix))
		ada.shot("01-sign-in")
		ada.signIn(aURL, "ada", adaPassword)
		require.Contains(t, ada.text("replica"), "console-a")
		require.Contains(t, ada.text("replica"), "the leader")
		require.Contains(t, ada.text("replicas"), "console-a")
		require.Contains(t, ada.text("replicas"), "console-b")
		require.Equal(t, "8", ada.text("failed-total"))
		ada.shot("02-overview")
	})

	t.Run("filter by reason, fix the mapping, dry-run, replay", func(t *testing.T) {
		ada.t = t
		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"failed"))
		ada.do(chromedp.SetValue(chromedp.ID("f-reason"), "mapping_error"))
		require.Equal(t, http.StatusOK, ada.submit("apply-filter"))
		require.Equal(t, "5", ada.text("count"))
		require.Equal(t, 5, ada.count("#events tbody input[name=id]"))
		ada.shot("03-failed-filtered")

		require.NoError(t, harness.ES(ctx, harness.ElasticURL(t), http.MethodPut, "/"+index+"/_mapping",
			[]byte(`{"properties": {"isbn": {"type": "keyword"}}}`), nil))

		require.Equal(t, http.StatusOK, ada.submit("replay-all"))
		require.Equal(t, "5", ada.text("confirm-count"))
		require.Contains(t, ada.text("confirm-what"), "reason = mapping_error")
		require.Equal(t, 5, db.Count(t, `status = 'failed' AND error_reason = 'mapping_error'`), "a dry run changes nothing")
		ada.shot("04-dry-run")

		ada.do(chromedp.SendKeys(chromedp.ID("why"), "isbn added to the mapping (CHG-42)"))
		require.Equal(t, http.StatusOK, ada.submit("confirm"))
		require.Equal(t, "ada", ada.text("audit-by"))
		require.Equal(t, "isbn added to the mapping (CHG-42)", ada.text("audit-why"))
		require.Equal(t, "5", ada.text("audit-count"))
		ada.shot("05-audit-entry")
		harness.Eventually(t, 30*time.Second, "the replayed rows end done", func() bool {
			return db.Count(t, `entity_id LIKE 'isbn-%' AND status = 'done' AND replay_count = 1`) == 5
		})

		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"audit?by=ada"))
		require.Contains(t, ada.text("audit"), "isbn added to the mapping (CHG-42)")
		ada.shot("06-audit-log")
	})

	t.Run("a script in a payload, an error or a URL is text", func(t *testing.T) {
		ada.t = t
		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"events/"+strconv.FormatInt(scriptID, 10)))
		require.Contains(t, ada.text("payload"), "<script>window.__pwned = 1</script>")
		require.Contains(t, ada.text("last-error"), `<img src=x onerror="window.__pwned = 2">`)
		require.True(t, ada.eval(`window.__pwned === undefined`), "nothing ran")
		require.Zero(t, ada.count("main script, main img"), "no element came from the row")
		ada.shot("07-event-escaped")

		require.Equal(t, http.StatusBadRequest, ada.open(aURL+Prefix+"events/"+url.PathEscape(`<script>window.__pwned=3</script>`)))
		require.Contains(t, ada.text("error"), "<script>")
		require.True(t, ada.eval(`window.__pwned === undefined`))

		require.Equal(t, http.StatusBadRequest, ada.open(aURL+Prefix+"failed?colour=red&since=yesterday"))
		require.Contains(t, ada.text("error"), `unknown filter "colour"`)
		ada.shot("08-bad-filter")
	})

	t.Run("a POST without the form token is refused", func(t *testing.T) {
		ada.t = t
		audits := db.Int(t, `SELECT count(*) FROM outbox_replay_audit`)
		code, body := forge(t, aURL+Prefix+"actions/dry-run", ada.cookie(aURL), url.Values{
			"action": {"discard"}, "scope": {"filter"}, "reason": {"server_error"}})
		require.Equal(t, http.StatusForbidden, code)
		require.Contains(t, body, "security token")
		require.Equal(t, audits, db.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
	})

	var restored int64
	t.Run("archive a filtered set, see it under Archived, restore one row", func(t *testing.T) {
		ada.t = t
		// Three books that failed on a bad payload forty days ago.
		db.Exec(t, `
			INSERT INTO outbox_events (entity_type, entity_id, op, payload, scope_key, status, attempts,
			                           error_class, error_reason, last_error, updated_at)
			SELECT 'book', 'old-' || g, 'upsert', '{"kind": "book", "title": "t"}', 'lib-3', 'failed', 1,
			       'deterministic', 'payload_invalid', 'title missing', now() - interval '40 days'
			  FROM generate_series(1, 3) g`)
		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"failed?reason=payload_invalid"))
		require.Equal(t, "3", ada.text("count"))
		ada.do(chromedp.SendKeys(chromedp.ID("archive-older-than"), "30d"))
		require.Equal(t, http.StatusOK, ada.submit("archive-all"))
		require.Equal(t, "3", ada.text("confirm-count"))
		require.Contains(t, ada.text("confirm-what"), "reason = payload_invalid, failed more than 30d ago")
		require.Equal(t, 3, db.Count(t, `entity_id LIKE 'old-%' AND status = 'failed'`), "a dry run changes nothing")
		ada.shot("12-archive-dry-run")

		ada.do(chromedp.SendKeys(chromedp.ID("why"), "payloads of the retired importer (CHG-44)"))
		require.Equal(t, http.StatusOK, ada.submit("confirm"))
		require.Equal(t, "archive", ada.text("audit-action"))
		require.Equal(t, "ada", ada.text("audit-by"))
		require.Equal(t, "3", ada.text("audit-count"))
		require.Zero(t, db.Count(t, `entity_id LIKE 'old-%'`))
		require.Equal(t, 3, db.Int(t, `SELECT count(*) FROM outbox_dead_letter WHERE entity_id LIKE 'old-%'`))

		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"archived"))
		require.Equal(t, "3", ada.text("count"))
		ada.shot("13-archived")
		ctx, cancel := ada.timeout()
		id, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`#events tbody tr:nth-child(1) input[name=id]`)))
		cancel()
		require.NoError(t, err)
		restored, err = strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		ada.do(chromedp.Click(chromedp.CSS(`#events tbody tr:nth-child(1) input[name=id]`)))
		require.Equal(t, http.StatusOK, ada.submit("restore-selected"))
		require.Equal(t, "1", ada.text("confirm-count"))
		ada.shot("14-restore-dry-run")
		ada.do(chromedp.SendKeys(chromedp.ID("why"), "this one is still wanted (CHG-45)"))
		require.Equal(t, http.StatusOK, ada.submit("confirm"))
		require.Equal(t, "restore", ada.text("audit-action"))
		require.Equal(t, "ada", ada.text("audit-by"))

		require.Equal(t, http.StatusOK, ada.open(aURL+Prefix+"audit?event="+id))
		log := ada.text("audit")
		require.Contains(t, log, "payloads of the retired importer (CHG-44)")
		require.Contains(t, log, "this one is still wanted (CHG-45)")
		require.Equal(t, 2, ada.count("#audit tbody td.by"))
		ada.shot("15-audit-archive-restore")

		harness.Eventually(t, 30*time.Second, "the restored row ends done", func() bool {
			return db.Count(t, `id = $1 AND status = 'done' AND replay_count = 1`, restored) == 1
		})
		require.Equal(t, 2, db.Int(t, `SELECT count(*) FROM outbox_dead_letter WHERE entity_id LIKE 'old-%' AND id <> $1`, restored))
		require.Equal(t, 1, db.Count(t, `entity_id LIKE 'old-%'`))
	})

	t.Run("a read-only user sees no action and cannot forge one", func(t *testing.T) {
		viv := newBrowser(t)
		viv.signIn(aURL, "viv", vivPassword)
		require.Equal(t, http.StatusOK, viv.open(aURL+Prefix+"failed"))
		require.Equal(t, "3", viv.text("count"))
		require.Zero(t, viv.count("#replay-all, #discard-all, #replay-selected, #discard-selected, input[name=id], form[action$='pause']"))
		viv.shot("09-failed-read-only")
		require.Equal(t, http.StatusOK, viv.open(aURL+Prefix+"events/"+strconv.FormatInt(scriptID, 10)))
		require.Zero(t, viv.count("#row-actions"))
		require.Equal(t, http.StatusOK, viv.open(aURL+Prefix+"archived"))
		require.Equal(t, "2", viv.text("count"))
		require.Zero(t, viv.count("#restore-selected, input[name=id]"))

		// The sign-out form carries viv's valid token: the forged POST is
		// refused for the role, not for a missing token.
		ctx, cancel := viv.timeout()
		token, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(`form.signout input[name=csrf]`)))
		cancel()
		require.NoError(t, err)
		for _, path := range []string{"actions/dry-run", "actions/apply"} {
			code, body := forge(t, aURL+Prefix+path, viv.cookie(aURL), url.Values{"csrf": {token},
				"action": {"discard"}, "scope": {"ids"}, "id": {strconv.FormatInt(scriptID, 10)}, "why": {"x"}, "token": {"1-x"}})
			require.Equal(t, http.StatusForbidden, code, path)
			require.Contains(t, body, "read-only")
		}
		code, body := forge(t, aURL+Prefix+"actions/dry-run", viv.cookie(aURL), url.Values{"csrf": {token},
			"action": {"restore"}, "scope": {"ids"}, "id": {strconv.FormatInt(restored, 10)}})
		require.Equal(t, http.StatusForbidden, code)
		require.Contains(t, body, "read-only")
		require.Equal(t, 1, db.Count(t, `id = $1 AND status = 'failed'`, scriptID))
		require.Equal(t, 2, db.Int(t, `SELECT count(*) FROM outbox_dead_letter`))
	})

	t.Run("a standby's page names the leader", func(t *testing.T) {
		ada.t = t
		require.Equal(t, http.StatusOK, ada.open(bURL+Prefix))
		require.Contains(t, ada.text("replica"), "console-b")
		require.Contains(t, ada.text("replica"), "standby")
		require.Equal(t, "console-a", ada.text("leader-name"))
		ada.shot("10-standby")
	})

	t.Run("the console works across a kill -9 of the leader", func(t *testing.T) {
		ada.t = t
		a.Kill()
		// b's role and the lock sessions are read at two moments of one page:
		// a's session may still show in the one while b leads in the other.
		harness.Eventually(t, 30*time.Second, "b's console says it leads and a's session is gone", func() bool {
			return ada.open(bURL+Prefix) == http.StatusOK && strings.Contains(ada.text("replica"), "the leader") &&
				!strings.Contains(ada.text("replicas"), "console-a")
		})
		require.Contains(t, ada.text("replicas"), "console-b")

		// Discard the two engine failures by selection, on b.
		require.Equal(t, http.StatusOK, ada.open(bURL+Prefix+"failed?reason=server_error"))
		require.Equal(t, "2", ada.text("count"))
		ada.do(chromedp.Click(chromedp.CSS(`#events tbody tr:nth-child(1) input[name=id]`)),
			chromedp.Click(chromedp.CSS(`#events tbody tr:nth-child(2) input[name=id]`)))
		require.Equal(t, http.StatusOK, ada.submit("discard-selected"))
		require.Equal(t, "2", ada.text("confirm-count"))
		ada.do(chromedp.SendKeys(chromedp.ID("why"), "engine outage events superseded (CHG-43)"))
		require.Equal(t, http.StatusOK, ada.submit("confirm"))
		require.Equal(t, "discard", ada.text("audit-action"))
		require.Equal(t, "ada", ada.text("audit-by"))
		require.Equal(t, 2, db.Count(t, `error_reason = 'server_error' AND status = 'discarded'`))
		ada.shot("11-after-failover")
	})
}
