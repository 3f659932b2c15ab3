package console

import (
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

	for name, change := range map[string]func(){
		// Someone else replays one of the rows in between.
		"one replayed by someone else": func() {
			_, err := replay.Replay(b.ctx, b.db.Pool, replay.Request{IDs: ids[:1], By: "bob", Why: "cli"})
			require.NoError(t, err)
		},
		// A new row starts to match the filter.
		"a new row matches": func() { b.failed(t, 1, "timeout", time.Hour) },
	} {
		r := c.post(Prefix+"actions/dry-run", url.Values{"action": {"discard"}, "scope": {"filter"}, "reason": {"timeout"}})
		require.Equal(t, http.StatusOK, r.code, name)
		form := confirmForm(t, r.body)
		form.Set("why", "superseded")
		failed, audits := b.count(t, `status = 'failed'`), b.audits(t)
		change()
		failedAfter := b.count(t, `status = 'failed'`)
		r = c.post(Prefix+"actions/apply", form)
		require.Equal(t, http.StatusConflict, r.code, name)
		require.Contains(t, r.body, "the rows changed since the dry run", name)
		require.Contains(t, r.body, "Nothing changed", name)
		require.Contains(t, r.body, `id="dry-run-again"`, name)
		require.Equal(t, failedAfter, b.count(t, `status = 'failed'`), name)
		require.Zero(t, b.count(t, `status = 'discarded'`), name)
		require.Equal(t, audits+btoi(failed != failedAfter && failedAfter < failed), b.audits(t), "%s: only bob's audit row", name)
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
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
	require.Contains(t, html.UnescapeString(r.body), `Unknown projection "serach"`)

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
