package console

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/replay"
)

var (
	reHidden       = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
	reConfirmCount = regexp.MustCompile(`<strong id="confirm-count">(\d+)</strong>`)
)

// confirmForm is the form of a dry run's page: its hidden fields.
func confirmForm(t *testing.T, body string) url.Values {
	t.Helper()
	i := strings.Index(body, `id="confirm-form"`)
	require.GreaterOrEqual(t, i, 0, "no confirmation form in:\n%s", body)
	form := url.Values{}
	for _, m := range reHidden.FindAllStringSubmatch(body[i:], -1) {
		if m[1] != "csrf" {
			form.Add(m[1], html.UnescapeString(m[2]))
		}
	}
	return form
}

func TestReplayByFilterDryRunThenConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 4, "mapping_error", time.Hour)
	b.failed(t, 2, "timeout", time.Hour)
	c := b.operator(t)

	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"},
		"reason": {"mapping_error"}, "since": {"2h"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Equal(t, "4", reConfirmCount.FindStringSubmatch(r.body)[1])
	require.Contains(t, r.body, "reason = mapping_error, failed since = 2h", "the filter as typed")
	require.Equal(t, 6, b.count(t, `status = 'failed'`), "a dry run changes nothing")
	require.Zero(t, b.audits(t))

	form := confirmForm(t, r.body)
	require.Equal(t, replay.SelectionToken(ids), form.Get("token"))
	_, err := time.Parse(time.RFC3339Nano, form.Get("since"))
	require.NoError(t, err, "the confirmation acts on the window its dry run resolved")

	// Without a why it asks again, changing nothing.
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "Say why")
	require.Contains(t, r.body, `id="confirm-form"`)
	require.Equal(t, 6, b.count(t, `status = 'failed'`))

	form.Set("why", "mapping fixed (CHG-7)")
	form.Set("reset_attempts", "1")
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Regexp(t, `^/console/audit/\d+\?notice=replayed$`, r.location)
	require.Equal(t, 4, b.count(t, `status = 'pending' AND error_reason = 'mapping_error' AND replay_count = 1 AND attempts = 0`))
	require.Equal(t, 2, b.count(t, `status = 'failed'`))

	var by, why, action string
	var sel []byte
	var count int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, reason, action, selector, event_count FROM outbox_replay_audit`).
		Scan(&by, &why, &action, &sel, &count))
	require.Equal(t, []any{"ada", "mapping fixed (CHG-7)", "replay", 4}, []any{by, why, action, count})
	var selector map[string]any
	require.NoError(t, json.Unmarshal(sel, &selector))
	require.Equal(t, map[string]any{"reason": "mapping_error", "since": "2h", "via": "console"}, selector["given"])
	require.Equal(t, true, selector["reset_attempts"])

	r = c.get(r.location)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "Replayed: the rows are pending again")
	require.Contains(t, r.body, `<td id="audit-by">ada</td>`)
}

func TestApplyRefusedWhenTheRowsChangedSinceTheDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 3, "timeout", time.Hour)
	c := b.operator(t)

	for _, tc := range []struct {
		name   string
		change func()
		// audits is the audit rows the change writes itself.
		audits int
	}{
		// Someone else replays one of the rows in between.
		{"one replayed by someone else", func() {
			_, err := replay.Replay(b.ctx, b.db.Pool, replay.Request{IDs: ids[:1], By: "bob", Why: "cli"})
			require.NoError(t, err)
		}, 1},
		// A new row starts to match the filter.
		{"a new row matches", func() { b.failed(t, 1, "timeout", time.Hour) }, 0},
	} {
		name := tc.name
		r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"discard"}, "scope": {"filter"}, "reason": {"timeout"}})
		require.Equal(t, http.StatusOK, r.code, name)
		form := confirmForm(t, r.body)
		form.Set("why", "superseded")
		audits := b.audits(t)
		tc.change()
		failedAfter := b.count(t, `status = 'failed'`)
		r = c.post(Prefix+"actions/apply", form)
		require.Equal(t, http.StatusConflict, r.code, name)
		require.Contains(t, r.body, "the rows changed since the dry run", name)
		require.Contains(t, r.body, "Nothing changed", name)
		require.Contains(t, r.body, `id="dry-run-again"`, name)
		require.Equal(t, failedAfter, b.count(t, `status = 'failed'`), name)
		require.Zero(t, b.count(t, `status = 'discarded'`), name)
		require.Equal(t, audits+tc.audits, b.audits(t), "%s: no audit row from the refused discard", name)
	}

	// The same for a selection: the dry run's ids are taken by someone else.
	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[1]), itoa(ids[2])}})
	require.Equal(t, http.StatusOK, r.code)
	form := confirmForm(t, r.body)
	form.Set("why", "fixed")
	_, err := replay.Discard(b.ctx, b.db.Pool, replay.Request{IDs: ids[2:3], By: "bob", Why: "gone"})
	require.NoError(t, err)
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, html.UnescapeString(r.body), "is discarded, not failed")
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'failed'`, ids[1]), "nothing changed")
}

func TestActionBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "timeout", time.Hour)
	c := b.operator(t)
	for name, tc := range map[string]struct {
		path string
		form url.Values
		code int
		want string
	}{
		"a filter matching nothing": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "reason": {"parse_error"}},
			http.StatusOK, "No failed events match reason = parse_error: nothing to replay. Nothing changed."},
		"no filter at all": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}},
			http.StatusBadRequest, "acting on every failed row needs a filter"},
		"nothing selected": {"actions/dry-run", url.Values{"action": {"discard"}, "scope": {"ids"}},
			http.StatusBadRequest, "no rows are selected"},
		"an unknown action": {"actions/dry-run", url.Values{"action": {"delete"}, "scope": {"ids"}, "id": {itoa(ids[0])}},
			http.StatusBadRequest, `unknown action "delete"`},
		"an unknown field": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "colour": {"red"}},
			http.StatusBadRequest, `unknown filter "colour"`},
		"a malformed window": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "since": {"tuesday"}},
			http.StatusBadRequest, "failed since:"},
		"an id that is not failed": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0]), "999"}},
			http.StatusConflict, "unknown ids: 999"},
		"apply without a dry run": {"actions/apply", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(ids[0])}, "why": {"x"}},
			http.StatusBadRequest, "Run the dry run first"},
		"an id that is no number": {"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {"<b>1</b>"}},
			http.StatusBadRequest, `"<b>1</b>" is not an event id`},
	} {
		r := c.post(Prefix+tc.path, tc.form)
		require.Equal(t, tc.code, r.code, "%s: %s", name, r.body)
		require.Contains(t, html.UnescapeString(r.body), tc.want, name)
		require.NotContains(t, r.body, "<b>1</b>", name)
	}
	require.Equal(t, 2, b.count(t, `status = 'failed'`))
	require.Zero(t, b.audits(t))
}

func TestOverTheCapNeedsATick(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.failed(t, replay.MaxDefault+1, "server_error", time.Hour)
	c := b.operator(t)

	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "reason": {"server_error"}})
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "1001 failed events match")
	require.Contains(t, r.body, "more than 1000")
	require.NotContains(t, r.body, `id="confirm-form"`)

	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "reason": {"server_error"}, "yes": {"1"}})
	require.Equal(t, http.StatusOK, r.code)
	require.Equal(t, "1001", reConfirmCount.FindStringSubmatch(r.body)[1])
	require.Contains(t, r.body, "the first 50 of 1001")
	form := confirmForm(t, r.body)
	require.Equal(t, "1", form.Get("yes"))
	form.Set("why", "engine back")
	require.Equal(t, http.StatusSeeOther, c.post(Prefix+"actions/apply", form).code)
	require.Equal(t, 1001, b.count(t, `status = 'pending'`))
}

func TestDiscardOneRowFromItsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "payload_invalid", time.Hour)
	c := b.operator(t)
	r := c.get(Prefix + "events/" + itoa(ids[1]))
	require.Contains(t, r.body, `id="discard-row"`)
	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"discard"}, "scope": {"ids"}, "id": {itoa(ids[1])}})
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "This would discard <strong id=\"confirm-count\">1</strong> events: event "+itoa(ids[1]))
	require.NotContains(t, r.body, "reset_attempts", "a discard has no attempts to reset")
	form := confirmForm(t, r.body)
	form.Set("why", "entity deleted")
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, 1, b.count(t, `status = 'discarded' AND id = $1`, ids[1]))
	require.Equal(t, 1, b.count(t, `status = 'failed'`))

	r = c.get(Prefix + "events/" + itoa(ids[1]))
	require.Contains(t, r.body, "entity deleted", "the audit row on the row's page")
	require.Contains(t, r.body, "discarded")
	require.NotContains(t, r.body, `id="discard-row"`, "no action on a row that is not failed")
}

func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.operator(t)

	r := c.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "Say why")
	r = c.post(Prefix+"projections/pause", url.Values{"projection": {"serach"}, "op": {"pause"}, "why": {"x"}})
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, html.UnescapeString(r.body), `unknown projection "serach"; this wlproj knows search, chronicle; nothing changed`)

	r = c.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}, "why": {"engine upgrade (CHG-9)"}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, Prefix+"?notice=paused", r.location)
	r = c.get(r.location)
	require.Contains(t, r.body, "Paused.")
	require.Regexp(t, `(?s)id="projection-search".*paused</strong> by ada`, r.body)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'pause' AND replayed_by = 'ada'
	                                  AND reason = 'engine upgrade (CHG-9)'`))

	r = c.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}, "why": {"again"}})
	require.Equal(t, http.StatusConflict, r.code)
	require.Contains(t, r.body, "already paused")

	r = c.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"resume"}, "why": {"done"}})
	require.Equal(t, http.StatusSeeOther, r.code)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'resume'`))
	r = c.get(Prefix + "audit?action=pause")
	require.Contains(t, r.body, "engine upgrade (CHG-9)")
}

// deadLetter are the ids in outbox_dead_letter, in order.
func (b *bundle) deadLetter(t *testing.T) []int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id FROM outbox_dead_letter ORDER BY id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// auditRow is one outbox_replay_audit row, its selector's "given" decoded.
type auditRow struct {
	action, by, why string
	ids             []int64
	given           map[string]any
}

func (b *bundle) auditRow(t *testing.T, id int64) auditRow {
	t.Helper()
	var a auditRow
	var sel []byte
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT action, replayed_by, reason, event_ids, selector
	                                                FROM outbox_replay_audit WHERE id = $1`, id).
		Scan(&a.action, &a.by, &a.why, &a.ids, &sel))
	var selector struct {
		Given map[string]any `json:"given"`
	}
	require.NoError(t, json.Unmarshal(sel, &selector))
	a.given = selector.Given
	return a
}

var reAuditLocation = regexp.MustCompile(`^/console/audit/(\d+)\?notice=(\w[\w-]*)$`)

// applied checks that r is the redirect of a done action to its audit row,
// with notice, and returns the row's id.
func applied(t *testing.T, r response, notice string) int64 {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	m := reAuditLocation.FindStringSubmatch(r.location)
	require.NotNil(t, m, r.location)
	require.Equal(t, notice, m[2])
	id, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return id
}

func TestArchiveByFilterDryRunThenConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := b.failed(t, 3, "mapping_error", 48*time.Hour)
	discarded := b.failed(t, 1, "mapping_error", 48*time.Hour)
	b.db.Exec(t, `UPDATE outbox_events SET status = 'discarded' WHERE id = $1`, discarded[0])
	young := b.failed(t, 2, "mapping_error", time.Hour)
	other := b.failed(t, 2, "timeout", 48*time.Hour)
	moved := append(slices.Clone(old), discarded...)
	c := b.operator(t)

	r := c.get(Prefix + "failed?reason=mapping_error")
	require.Contains(t, r.body, `id="archive-all"`)
	require.Contains(t, r.body, `id="archive-selected"`)
	r = c.get(Prefix + "failed?reason=mapping_error&class=deterministic")
	require.NotContains(t, r.body, `id="archive-all"`, "archive does not select by class")
	require.Contains(t, r.body, "An archive selects by projection and reason only")

	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"archive"}, "scope": {"filter"},
		"reason": {"mapping_error"}, "older_than": {"1d"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Equal(t, "4", reConfirmCount.FindStringSubmatch(r.body)[1])
	require.Contains(t, r.body, "every failed or discarded event matching reason = mapping_error, failed more than 1d ago (before ")
	require.Contains(t, r.body, "<td>discarded</td>", "the confirmation shows the discarded row as such")
	require.Empty(t, b.deadLetter(t), "a dry run changes nothing")
	require.Zero(t, b.audits(t))

	form := confirmForm(t, r.body)
	require.Equal(t, replay.SelectionToken(moved), form.Get("token"))
	_, err := time.Parse(time.RFC3339Nano, form.Get("older_than"))
	require.NoError(t, err, "the confirmation acts on the cut-off its dry run resolved")
	require.NotContains(t, r.body, "reset_attempts", "an archive resets nothing")

	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Contains(t, r.body, "Say why")
	require.Contains(t, r.body, `id="confirm-form"`)
	require.Empty(t, b.deadLetter(t))

	form.Set("why", "mapping errors of the old schema (CHG-8)")
	auditID := applied(t, c.post(Prefix+"actions/apply", form), "archived")
	require.Equal(t, moved, b.deadLetter(t))
	require.Zero(t, b.count(t, `id = ANY($1)`, moved), "moved, not copied")
	require.Equal(t, 4, b.count(t, `id = ANY($1) AND status = 'failed'`, slices.Concat(young, other)), "too young or another reason")
	require.Equal(t, 4, b.db.Int(t, `SELECT count(*) FROM outbox_dead_letter WHERE archive_audit_id = $1`, auditID))
	a := b.auditRow(t, auditID)
	require.Equal(t, []any{"archive", "ada", "mapping errors of the old schema (CHG-8)", moved},
		[]any{a.action, a.by, a.why, a.ids})
	require.Equal(t, map[string]any{"reason": "mapping_error", "older-than": "1d", "via": "console"}, a.given)
	r = c.get(Prefix + "audit/" + itoa(auditID) + "?notice=archived")
	require.Contains(t, r.body, "Archived: the rows moved to the dead letter")

	r = c.get(Prefix + "archived")
	require.Equal(t, http.StatusOK, r.code)
	require.Equal(t, "4", reCount.FindStringSubmatch(r.body)[1])
	require.ElementsMatch(t, []string{itoa(moved[0]), itoa(moved[1]), itoa(moved[2]), itoa(moved[3])}, listed(r.body))
	require.Contains(t, r.body, `id="restore-selected"`)
	require.Equal(t, "2", reCount.FindStringSubmatch(c.get(Prefix + "archived?scope_key=lib-1&reason=mapping_error").body)[1],
		"the archived page filters as the failed page does")
}

func TestArchiveASelectionThenRestoreOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 3, "timeout", 48*time.Hour)
	fresh := b.failed(t, 1, "timeout", time.Minute)
	b.db.Exec(t, `UPDATE outbox_events SET payload = '{"title": "<script>alert(1)</script>"}',
	               last_error = 'bad <img src=x onerror=alert(2)>' WHERE id = $1`, ids[0])
	c := b.operator(t)

	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"archive"}, "scope": {"ids"},
		"id": {itoa(ids[0]), itoa(ids[1]), itoa(fresh[0])}, "older_than": {"1d"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Equal(t, "2", reConfirmCount.FindStringSubmatch(r.body)[1])
	require.Contains(t, r.body, `<p class="warn" id="skipped">Left alone: `+itoa(fresh[0])+`: ticked, but failed after `)
	form := confirmForm(t, r.body)
	form.Set("why", "engine outage of last month")
	auditID := applied(t, c.post(Prefix+"actions/apply", form), "archived")
	require.Equal(t, ids[:2], b.deadLetter(t))
	require.Equal(t, 2, b.count(t, `id = ANY($1) AND status = 'failed'`, []int64{ids[2], fresh[0]}))
	a := b.auditRow(t, auditID)
	require.Equal(t, []any{"archive", "ada", ids[:2]}, []any{a.action, a.by, a.ids})
	require.Equal(t, map[string]any{"ids": replay.FormatIDs([]int64{ids[0], ids[1], fresh[0]}), "older-than": "1d",
		"via": "console"}, a.given)

	// The archived row's payload and error are text, on every page.
	escaped := func(r response) {
		t.Helper()
		require.Contains(t, r.body, "bad &lt;img src=x onerror=alert(2)&gt;")
		require.NotContains(t, r.body, "<img")
		require.NotContains(t, r.body, "<script>")
	}
	r = c.get(Prefix + "archived")
	escaped(r)
	r = c.get(Prefix + "events/" + itoa(ids[0]))
	escaped(r)
	require.Contains(t, r.body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Contains(t, r.body, `id="restore-row"`, "an archived row's page offers restore")
	require.NotContains(t, r.body, `id="replay-row"`)
	require.Contains(t, r.body, `href="/console/archived" aria-current="page"`, "an archived row belongs to Archived")
	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"restore"}, "scope": {"ids"}, "id": {itoa(ids[0])}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	escaped(r)
	require.Contains(t, r.body, `This would restore <strong id="confirm-count">1</strong> events: event `+itoa(ids[0]))
	require.Contains(t, r.body, `name="reset_attempts"`)
	require.Contains(t, r.body, `<a href="/console/archived">cancel</a>`)
	require.Contains(t, r.body, `href="/console/archived" aria-current="page"`, "a restore's confirmation belongs to Archived")
	require.NotContains(t, r.body, `href="/console/failed" aria-current="page"`)
	require.Equal(t, ids[:2], b.deadLetter(t), "a dry run changes nothing")

	form = confirmForm(t, r.body)
	form.Set("why", "customer asked (CHG-126)")
	form.Set("reset_attempts", "1")
	auditID = applied(t, c.post(Prefix+"actions/apply", form), "restored")
	require.Equal(t, ids[1:2], b.deadLetter(t))
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'pending' AND attempts = 0 AND replay_count = 1`, ids[0]))
	a = b.auditRow(t, auditID)
	require.Equal(t, []any{"restore", "ada", "customer asked (CHG-126)", ids[:1]}, []any{a.action, a.by, a.why, a.ids})
	require.Equal(t, map[string]any{"ids": itoa(ids[0]), "via": "console"}, a.given)
	r = c.get(Prefix + "audit/" + itoa(auditID) + "?notice=restored")
	require.Contains(t, r.body, "Restored: the rows are pending again")
	require.Equal(t, 2, b.audits(t))
}

func TestArchiveAndRestoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 3, "timeout", 48*time.Hour)
	_, err := replay.Archive(b.ctx, b.db.Pool, replay.ArchiveRequest{OlderThan: time.Hour, IDs: ids[2:], By: "cron", Why: "monthly"})
	require.NoError(t, err)
	pending := b.failed(t, 1, "timeout", 48*time.Hour)
	b.db.Exec(t, `UPDATE outbox_events SET status = 'pending' WHERE id = $1`, pending[0])
	c := b.operator(t)
	archive := func(scope string, kv ...string) url.Values {
		v := url.Values{"action": {"archive"}, "scope": {scope}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v
	}
	for name, tc := range map[string]struct {
		path string
		form url.Values
		code int
		want string
	}{
		"no age": {"actions/dry-run", archive("filter", "reason", "timeout"),
			http.StatusBadRequest, "say how long ago the rows must have failed to be archived"},
		"a negative age": {"actions/dry-run", archive("filter", "older_than", "-2d"),
			http.StatusBadRequest, `older than "-2d": must be positive`},
		"an age that is no duration": {"actions/dry-run", archive("ids", "id", itoa(ids[0]), "older_than", "<b>1</b>"),
			http.StatusBadRequest, `older than "<b>1</b>" is not a duration like 720h or 30d`},
		"a filter archive does not select by": {"actions/dry-run", archive("filter", "class", "transient", "older_than", "1d"),
			http.StatusBadRequest, "archive selects by projection and reason only, as the CLI's wlproj failed archive does: take class out"},
		"a pending row": {"actions/dry-run", archive("ids", "id", itoa(pending[0]), "older_than", "1d"),
			http.StatusConflict, "is pending, not failed or discarded"},
		"a token of other rows": {"actions/apply", archive("ids", "id", itoa(ids[0]), "older_than", "1d", "why", "x", "token", "1-abc"),
			http.StatusConflict, "the rows changed since the dry run: 1 failed or discarded events match now, not the ones you confirmed"},
		"restore by filter": {"actions/dry-run", url.Values{"action": {"restore"}, "scope": {"filter"}, "reason": {"timeout"}},
			http.StatusBadRequest, "restore takes ticked rows only: archived events are chosen by id"},
		"restore a row that is not archived": {"actions/dry-run", url.Values{"action": {"restore"}, "scope": {"ids"}, "id": {itoa(ids[0])}},
			http.StatusConflict, "unknown archived ids: " + itoa(ids[0])},
		"a stale form token": {"actions/dry-run", archive("ids", "id", itoa(ids[0]), "older_than", "1d", "csrf", "stale"),
			http.StatusForbidden, "the form's security token is missing or stale"},
	} {
		r := c.post(Prefix+tc.path, tc.form)
		require.Equal(t, tc.code, r.code, "%s: %s", name, r.body)
		require.Contains(t, html.UnescapeString(r.body), tc.want, name)
		require.NotContains(t, r.body, "<b>1</b>", name)
	}
	require.Equal(t, ids[2:], b.deadLetter(t))
	require.Equal(t, 2, b.count(t, `id = ANY($1) AND status = 'failed'`, ids[:2]))
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'pending'`, pending[0]))
	require.Equal(t, 1, b.audits(t), "cron's archive only")
}

func TestArchiveAndRestoreRefusedWhenTheRowsChangedSinceTheDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "timeout", 48*time.Hour)
	c := b.operator(t)

	// A row starts to match the archive's filter between the dry run and
	// the confirmation: the archive moves nothing, and writes no audit row.
	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"archive"}, "scope": {"filter"}, "reason": {"timeout"}, "older_than": {"1d"}})
	require.Equal(t, "2", reConfirmCount.FindStringSubmatch(r.body)[1])
	form := confirmForm(t, r.body)
	form.Set("why", "old")
	late := b.failed(t, 1, "timeout", 72*time.Hour)
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusConflict, r.code, r.body)
	require.Contains(t, r.body, "3 failed or discarded events match now, not the ones you confirmed")
	require.Contains(t, r.body, `id="dry-run-again"`)
	require.Empty(t, b.deadLetter(t))
	require.Zero(t, b.audits(t))
	require.Equal(t, 3, b.count(t, `id = ANY($1) AND status = 'failed'`, append(slices.Clone(ids), late...)))

	// Someone restores one of the rows between a restore's dry run and its
	// confirmation.
	_, err := replay.Archive(b.ctx, b.db.Pool, replay.ArchiveRequest{OlderThan: time.Hour, IDs: ids, By: "cron", Why: "monthly"})
	require.NoError(t, err)
	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"restore"}, "scope": {"ids"}, "id": {itoa(ids[0]), itoa(ids[1])}})
	require.Equal(t, "2", reConfirmCount.FindStringSubmatch(r.body)[1])
	form = confirmForm(t, r.body)
	form.Set("why", "wanted back")
	_, err = replay.Restore(b.ctx, b.db.Pool, replay.Request{IDs: ids[:1], By: "bob", Why: "cli"})
	require.NoError(t, err)
	r = c.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusConflict, r.code, r.body)
	require.Contains(t, r.body, "unknown archived ids: "+itoa(ids[0]))
	require.Equal(t, ids[1:], b.deadLetter(t), "nothing changed")
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'pending' AND replay_count = 1`, ids[0]), "bob's restore only")
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'failed'`, late[0]))
	require.Equal(t, 2, b.audits(t), "cron's archive and bob's restore")
}

func TestReadOnlyMayNotArchiveOrRestore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.failed(t, 2, "timeout", 48*time.Hour)
	_, err := replay.Archive(b.ctx, b.db.Pool, replay.ArchiveRequest{OlderThan: time.Hour, IDs: ids[:1], By: "cron", Why: "monthly"})
	require.NoError(t, err)
	c := b.viewer(t)

	r := c.get(Prefix + "archived")
	require.Equal(t, http.StatusOK, r.code)
	require.Equal(t, "1", reCount.FindStringSubmatch(r.body)[1])
	require.Equal(t, []string{itoa(ids[0])}, listed(r.body))
	r = c.get(Prefix + "failed")
	require.Equal(t, []string{itoa(ids[1])}, listed(r.body))
	r = c.get(Prefix + "events/" + itoa(ids[0]))
	require.Equal(t, http.StatusOK, r.code)
	for _, page := range []string{"archived", "failed", "events/" + itoa(ids[0]), "events/" + itoa(ids[1])} {
		r := c.get(Prefix + page)
		for _, button := range []string{`id="restore-selected"`, `id="restore-row"`, `id="archive-all"`, `id="archive-selected"`,
			`name="id"`, `id="archive-form"`} {
			require.NotContains(t, r.body, button, page)
		}
	}

	for path, form := range map[string]url.Values{
		"actions/dry-run": {"action": {"archive"}, "scope": {"ids"}, "id": {itoa(ids[1])}, "older_than": {"1d"}},
		"actions/apply":   {"action": {"restore"}, "scope": {"ids"}, "id": {itoa(ids[0])}, "why": {"x"}, "token": {replay.SelectionToken(ids[:1])}},
	} {
		r := c.post(Prefix+path, form)
		require.Equal(t, http.StatusForbidden, r.code, path)
		require.Contains(t, r.body, "viv is a read-only user")
	}
	require.Equal(t, ids[:1], b.deadLetter(t))
	require.Equal(t, 1, b.count(t, `id = $1 AND status = 'failed'`, ids[1]))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action <> 'refused'`))
	require.Equal(t, 2, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'refused' AND replayed_by = 'viv'`),
		"each refusal is audited")
}

// asRuntime serves the console as the least-privilege runtime role of
// deploy/sql/roles.sql, applied with psql as the runbook does. Take the
// roles (harness.Roles) before setup, so that they outlive the database.
func asRuntime(t *testing.T, owner, runtime string) setupOption {
	return func(_ *Config, d *Deps) {
		admin := d.Pool.Config().ConnString()
		out, err := harness.ApplyRoles(t, admin, d.Pool.Config().ConnConfig.Database, owner, runtime)
		require.NoError(t, err, out)
		u, err := harness.UserURL(admin, runtime, harness.RuntimePassword)
		require.NoError(t, err)
		d.Pool, err = pgxpool.New(context.Background(), u)
		require.NoError(t, err)
		t.Cleanup(d.Pool.Close)
	}
}

func TestRestoreNeedsTheOwnerRole(t *testing.T) {
	t.Parallel()
	owner, runtime := harness.Roles(t, "console")
	b := setup(t, asRuntime(t, owner, runtime))
	ids := b.failed(t, 2, "timeout", 48*time.Hour)
	c := b.operator(t)

	// The runtime role archives, as the leader's auto-archive does.
	r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"archive"}, "scope": {"filter"}, "reason": {"timeout"}, "older_than": {"1d"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	form := confirmForm(t, r.body)
	form.Set("why", "old")
	applied(t, c.post(Prefix+"actions/apply", form), "archived")
	require.Equal(t, ids, b.deadLetter(t))

	// But it never inserts events, so it cannot restore one.
	r = c.post(Prefix+"actions/dry-run", url.Values{"action": {"restore"}, "scope": {"ids"}, "id": {itoa(ids[0])}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	require.Contains(t, html.UnescapeString(r.body), "This replica's database role may not restore these events (permission denied")
	require.Contains(t, html.UnescapeString(r.body), `Run wlproj replay --archived as the owner role instead (--database-url "$OWNER_DATABASE_URL")`)
	require.Equal(t, ids, b.deadLetter(t))
	require.Zero(t, b.count(t, `id = ANY($1)`, ids))
	require.Equal(t, 1, b.audits(t))
}
