package console

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
)

var (
	reEventLink = regexp.MustCompile(`<td><a href="/console/events/(\d+)">`)
	reNext      = regexp.MustCompile(`href="([^"]+)" id="next-page"`)
	rePrev      = regexp.MustCompile(`href="([^"]+)" id="prev-page"`)
	reCount     = regexp.MustCompile(`<strong id="count">(\d+)</strong>`)
)

// listed are the event ids of a failed page, in order.
func listed(body string) []string {
	var ids []string
	for _, m := range reEventLink.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func link(t *testing.T, re *regexp.Regexp, body string) string {
	t.Helper()
	m := re.FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// The overview names who holds the database's vacuum horizon, for how long
// and how many transactions ago, with the dead rows of the outbox and the
// ledger; once the session ends, that nothing holds one.
func TestOverviewShowsTheHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.operator(t)
	holder := harness.HoldSnapshot(t, b.db.URL, "app-report")
	b.db.Exec(t, `SELECT txid_current()`)

	r := c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, fmt.Sprintf(`<strong id="horizon-holder">session &#34;app-report&#34; (pid %d, idle in transaction)</strong>`, holder.PID))
	require.Regexp(t, `</strong>,\nfor [0-9.]+m?s,\n[1-9][0-9]* transactions ago`, r.body)
	require.Contains(t, r.body, "Something holds the vacuum horizon", "another's session points to the SOP")
	for _, table := range []string{"outbox_events", "outbox_ledger"} {
		require.Regexp(t, `<tr id="vacuum-`+table+`"><td>`+table+`</td><td class="num">[0-9]+</td><td class="num">[0-9]+</td><td>`, r.body)
	}

	holder.Release()
	harness.Eventually(t, 10*time.Second, "nothing holds the horizon", func() bool {
		return strings.Contains(c.get(Prefix).body, `<p id="horizon">Nothing holds a snapshot`)
	})
}

func TestOverview(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.failed(t, 3, "mapping_error", time.Hour)
	b.failed(t, 2, "timeout", time.Minute)
	b.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'replica-a', 3)`)
	// A row claimed long ago by a leader that is gone: stuck.
	b.db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, status, locked_by, claim_token, lease_until, processing_started_at)
		VALUES ('book', 'stuck-1', 'upsert', 'processing', 'replica-z', 2, now() - interval '1 minute', now() - interval '2 minutes')`)
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, processed_at) VALUES ('book', 'd', 'upsert', 'done', now())`)
	c := b.operator(t)

	r := c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<strong>replica-a</strong>, is`)
	require.Contains(t, r.body, "the leader</strong> (epoch 3")
	require.Contains(t, r.body, `<p class="big" id="stuck">1</p>`)
	require.Contains(t, r.body, `href="/console/events/`, "the stuck row links to its page")
	require.Contains(t, r.body, "replica-z")
	require.Contains(t, r.body, `id="failed-total"><a href="/console/failed">5</a>`)
	require.Contains(t, r.body, "acked done per minute: <strong>1</strong>")
	require.Contains(t, r.body, "failed per minute: <strong>2</strong>", "the timeouts of the last minutes; the mapping errors are older")
	require.Contains(t, r.body, "<rect ", "the chart is SVG from the server")
	for _, p := range []string{"search", "chronicle"} {
		require.Contains(t, r.body, `id="projection-`+p+`"`)
	}
	bi := buildinfo.Get()
	require.Contains(t, r.body, `<footer class="build" id="build">wlproj `+bi.Version+` · commit `+bi.ShortRevision(),
		"the footer says which build this is")
	require.Contains(t, r.body, bi.GoVersion)
	signin := b.client(t).get(Prefix + "signin")
	require.Equal(t, http.StatusOK, signin.code)
	require.NotContains(t, signin.body, `id="build"`, "the build is not shown before sign-in")

	// A standby says so and names the leader.
	b.state = leader.State{Role: leader.RoleStandby, WorkerID: "replica-b"}
	r = c.get(Prefix)
	require.Contains(t, r.body, "<strong>replica-b</strong>, is")
	require.Contains(t, r.body, "a <strong>standby</strong>")
	// Nobody holds the lock in this test, so the record is the last leader.
	require.Contains(t, r.body, `the last leader was <strong id="leader-name">replica-a</strong>`)
}

func TestFailedFiltersAndKeysetPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mapping := b.failed(t, 75, "mapping_error", time.Hour)
	timeouts := b.failed(t, 10, "timeout", 2*time.Hour)
	b.db.Exec(t, `UPDATE outbox_events SET projection = 'chronicle', entity_type = 'block', last_error = 'Chronicle: Disk FULL'
	               WHERE id = ANY($1)`, timeouts[:4])
	c := b.operator(t)

	count := func(query string) string {
		t.Helper()
		r := c.get(Prefix + "failed" + query)
		require.Equal(t, http.StatusOK, r.code, "%s: %s", query, r.body)
		return reCount.FindStringSubmatch(r.body)[1]
	}
	require.Equal(t, "85", count(""))
	require.Equal(t, "75", count("?reason=mapping_error"))
	require.Equal(t, "10", count("?class=transient"))
	require.Equal(t, "4", count("?projection=chronicle"))
	require.Equal(t, "4", count("?entity_type=block&reason=timeout"))
	require.Equal(t, "4", count("?text=disk+full"), "text ignores case")
	require.Equal(t, "0", count("?text=%25"), "% is itself, not a wildcard")
	require.Equal(t, "28", count("?scope_key=lib-0")) // 25 of the mapping errors, 3 of the timeouts
	require.Equal(t, "75", count("?since=90m"))
	require.Equal(t, "10", count("?until=90m"))

	// Paging forward then back covers every row once, in order.
	var seen []string
	next := Prefix + "failed?reason=mapping_error&size=20"
	var pages []string
	for next != "" {
		r := c.get(next)
		require.Equal(t, http.StatusOK, r.code)
		ids := listed(r.body)
		require.NotEmpty(t, ids)
		seen = append(seen, ids...)
		pages = append(pages, r.body)
		next = link(t, reNext, r.body)
	}
	require.Len(t, pages, 4)
	require.Len(t, seen, 75)
	want := make([]string, 0, 75)
	for _, id := range mapping { // failed 1s, 2s, … before the hour: newest first is id order
		want = append(want, itoa(id))
	}
	require.Equal(t, want, seen)
	back := link(t, rePrev, pages[3])
	r := c.get(back)
	require.Equal(t, listed(pages[2]), listed(r.body), "previous goes back one page")
	require.Empty(t, link(t, rePrev, c.get(link(t, rePrev, pages[1])).body), "the first page has no previous")

	// Sorted by id, largest first, the same rows come the other way round.
	r = c.get(Prefix + "failed?reason=mapping_error&sort=-id&size=500")
	ids := listed(r.body)
	slices.Reverse(ids)
	require.Equal(t, want, ids)
}

func TestFailedBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.failed(t, 2, "timeout", time.Hour)
	c := b.operator(t)
	for query, want := range map[string]string{
		"?colour=red":           `unknown filter "colour"`,
		"?reason=a&reason=b":    "the filter reason is given 2 times",
		"?since=yesterday":      `failed since: "yesterday" is neither an RFC3339 time`,
		"?until=2025-13-45":     "failed until:",
		"?since=1h&until=2h":    "the time window is empty",
		"?class=fatal":          `class "fatal" is neither transient nor deterministic`,
		"?sort=colour":          `unknown sort "colour"`,
		"?after=abc":            `malformed page cursor "abc"`,
		"?after=1.2&before=1.2": "after and before exclude each other",
		"?size=0":               `size "0" is not a number from 1 to 1000`,
		"?text=%3Cscript%3Ealert(1)%3C%2Fscript%3E&since=x": "failed since",
	} {
		r := c.get(Prefix + "failed" + query)
		require.Equal(t, http.StatusBadRequest, r.code, query)
		require.Contains(t, html.UnescapeString(r.body), want, query)
		require.Contains(t, r.body, `id="filters"`, "%s: the form stays, to mend the mistake", query)
		require.NotContains(t, r.body, `id="events"`, "%s: no rows under a filter that failed", query)
		require.NotContains(t, r.body, "<script>", query)
	}
}

func TestEventPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 1, "client_error", time.Hour)
	b.db.Exec(t, `
		UPDATE outbox_events
		   SET payload = '{"title": "<script>alert(1)</script>", "n": 1}',
		       last_error = 'bad <img src=x onerror=alert(2)>',
		       error_history = jsonb_build_array(
		           jsonb_build_object('at', now(), 'attempt', 1, 'class', 'deterministic', 'reason', 'client_error',
		                              'error', '<b>first</b>', 'worker', 'replica-a', 'epoch', 3),
		           jsonb_build_object('at', now(), 'event', 'replayed', 'by', 'bob', 'why', 'try <i>again</i>', 'audit_id', 77))
		 WHERE id = $1`, ids[0])
	c := b.operator(t)
	r := c.get(Prefix + "events/" + itoa(ids[0]))
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Contains(t, r.body, "bad &lt;img src=x onerror=alert(2)&gt;")
	require.Contains(t, r.body, "&lt;b&gt;first&lt;/b&gt;", "every entry of the history")
	require.Contains(t, r.body, "try &lt;i&gt;again&lt;/i&gt;")
	require.Contains(t, r.body, `<a href="/console/audit/77">#77</a>`)
	require.NotContains(t, r.body, "<script>")
	require.NotContains(t, r.body, "<img")
	require.Contains(t, r.body, `id="replay-row"`)

	for path, code := range map[string]int{
		"events/0": http.StatusBadRequest,
		"events/" + url.PathEscape("<script>x</script>"): http.StatusBadRequest,
		"events/999999": http.StatusNotFound,
		"audit/x":       http.StatusBadRequest,
		"audit/999999":  http.StatusNotFound,
	} {
		r := c.get(Prefix + path)
		require.Equal(t, code, r.code, path)
		require.NotContains(t, r.body, "<script>", path)
	}

	// An archived row is still found, and offers a restore only.
	b.db.Exec(t, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids)
	               VALUES ('archive', 'cron', 'monthly', '{}', 1, ARRAY[$1::bigint])`, ids[0])
	b.db.Exec(t, `
		WITH moved AS (DELETE FROM outbox_events WHERE id = $1 RETURNING *)
		INSERT INTO outbox_dead_letter (id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
		       attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at, archive_audit_id)
		SELECT id, projection, entity_type, entity_id, op, event_version, payload, scope_key, status,
		       attempts, error_class, error_reason, last_error, error_history, replay_count, created_at, updated_at,
		       (SELECT max(id) FROM outbox_replay_audit)
		  FROM moved`, ids[0])
	r = c.get(Prefix + "events/" + itoa(ids[0]))
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "archived")
	require.NotContains(t, r.body, `id="replay-row"`)
	require.Contains(t, r.body, `id="restore-row"`)
	require.Contains(t, r.body, "monthly", "its audit rows")
}

func TestAuditLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, `
		INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, replayed_at)
		SELECT CASE WHEN g % 2 = 0 THEN 'replay' ELSE 'discard' END, CASE WHEN g % 3 = 0 THEN 'bob' ELSE 'ada' END,
		       'ticket CHG-' || g, '{"given": {"via": "console"}}', g, ARRAY[g::bigint], now() - make_interval(mins => g)
		  FROM generate_series(1, 60) g`)
	c := b.operator(t)
	rows := func(query string) int {
		t.Helper()
		r := c.get(Prefix + "audit" + query)
		require.Equal(t, http.StatusOK, r.code, "%s: %s", query, r.body)
		return strings.Count(r.body, `<td class="by">`)
	}
	require.Equal(t, 50, rows(""), "a page")
	require.Equal(t, 10, rows("?before=11"), "older ones by keyset")
	require.Equal(t, 30, rows("?action=replay"))
	require.Equal(t, 20, rows("?by=bob"))
	require.Equal(t, 1, rows("?text=chg-42"))
	require.Equal(t, 1, rows("?event=7"))
	require.Equal(t, 10, rows("?since=10m30s"))
	r := c.get(Prefix + "audit")
	require.Contains(t, r.body, `id="older"`)

	for query, want := range map[string]string{
		"?who=ada":           `unknown filter "who"`,
		"?action=delete":     `action "delete" is none of`,
		"?since=soon":        "since:",
		"?event=-1":          `event "-1" is not a positive number`,
		"?since=1h&until=2h": "the time window is empty",
	} {
		r := c.get(Prefix + "audit" + query)
		require.Equal(t, http.StatusBadRequest, r.code, query)
		require.Contains(t, html.UnescapeString(r.body), want, query)
	}

	r = c.get(Prefix + "audit/42")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "ticket CHG-42")
	require.Contains(t, r.body, "&#34;via&#34;: &#34;console&#34;")
}
