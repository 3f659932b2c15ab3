package console

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/mask"
)

// maskMarker is planted in masked fields; no masked page may show it.
const maskMarker = "MARKER-7f3a-ann@example.org"

// withMasks masks email and address.* of search's payloads.
func withMasks(t *testing.T) setupOption {
	m, err := mask.Compile([]string{"email", "address.*"})
	require.NoError(t, err)
	return func(_ *Config, d *Deps) { d.Masks = map[string]*mask.Mask{"search": m} }
}

// plantMarker gives event id a payload with the marker in masked fields,
// and error texts quoting it, as a row failed before its projection had a
// mask holds them.
func plantMarker(t *testing.T, b *bundle, id int64) {
	b.db.Exec(t, `
		UPDATE outbox_events
		   SET payload = jsonb_build_object('title', 'Dune', 'email', $2::text, 'address', jsonb_build_object('city', $2::text)),
		       last_error = 'mapping_error: Preview of field''s value: ''' || $2 || '''',
		       error_history = jsonb_build_array(jsonb_build_object('at', now(), 'attempt', 1, 'class', 'deterministic',
		           'reason', 'mapping_error', 'error', 'value ' || to_jsonb($2::text)::text))
		 WHERE id = $1`, id, maskMarker)
}

func TestEventPageMasksPayloadAndErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, withMasks(t))
	ids := b.failed(t, 1, "mapping_error", time.Hour)
	plantMarker(t, b, ids[0])
	for name, c := range map[string]*client{"operator": b.operator(t), "read-only": b.viewer(t)} {
		r := c.get(Prefix + "events/" + itoa(ids[0]))
		require.Equal(t, http.StatusOK, r.code, name)
		require.NotContains(t, r.body, "MARKER-7f3a", name)
		require.NotContains(t, r.body, "ann@example", name)
		require.Contains(t, r.body, "Dune", "%s: unmasked fields are shown", name)
		require.Contains(t, r.body, `&#34;email&#34;: &#34;***&#34;`, name)
		require.Contains(t, r.body, `id="masked"`, name)
	}
	require.Contains(t, b.operator(t).get(Prefix+"events/"+itoa(ids[0])).body, `id="unmask-form"`)
	require.NotContains(t, b.viewer(t).get(Prefix+"events/"+itoa(ids[0])).body, `id="unmask-form"`)
}

func TestUnmaskedReadIsAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, withMasks(t))
	ids := b.failed(t, 2, "mapping_error", time.Hour)
	plantMarker(t, b, ids[0])
	path := Prefix + "events/" + itoa(ids[0]) + "/unmasked"

	op := b.operator(t)
	for name, form := range map[string]url.Values{
		"no why":    {},
		"blank why": {"why": {"   "}},
		"extra key": {"why": {"x"}, "all": {"1"}},
		"bad token": {"why": {"x"}, "csrf": {"forged"}},
	} {
		r := op.post(path, form)
		require.GreaterOrEqual(t, r.code, 400, name)
		require.NotContains(t, r.body, "MARKER-7f3a", name)
	}
	require.Zero(t, b.audits(t), "a read refused for its form records nothing")

	// A read-only user may not: the policy's refusal, a 403 and its
	// refused audit row, no unmask row.
	r := b.viewer(t).post(path, url.Values{"why": {"curious"}})
	require.Equal(t, http.StatusForbidden, r.code)
	require.NotContains(t, r.body, "MARKER-7f3a")
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'refused'`))
	require.Zero(t, unmaskAudits(t, b))

	r = op.post(path, url.Values{"why": {"ticket SUP-12: the customer's address"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Contains(t, r.body, maskMarker, "the payload, whole")
	require.Contains(t, r.body, `id="unmasked"`)
	require.NotContains(t, r.body, "Preview of field&#39;s value: &#39;"+maskMarker, "the error texts stay masked")
	require.Equal(t, 1, unmaskAudits(t, b))
	var action, by, why string
	var selector map[string]any
	var events []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT action, replayed_by, reason, selector, event_ids FROM outbox_replay_audit
		WHERE action = 'unmask'`).
		Scan(&action, &by, &why, &selector, &events))
	require.Equal(t, "unmask", action)
	require.Equal(t, "ada", by)
	require.Equal(t, "ticket SUP-12: the customer's address", why)
	require.Equal(t, map[string]any{"event": float64(ids[0]), "projection": "search"}, selector)
	require.Equal(t, []int64{ids[0]}, events)

	again := op.get(Prefix + "events/" + itoa(ids[0]))
	require.NotContains(t, again.body, maskMarker, "masked again on the next read")
	require.Contains(t, again.body, "ticket SUP-12", "the read is in the event's audit")
}

func unmaskAudits(t *testing.T, b *bundle) int {
	return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'unmask'`)
}

// The failed list shows each row's last error masked, also a row that
// failed before its projection had a mask and so stored the quoted value.
func TestFailedListMasksStoredErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, withMasks(t))
	ids := b.failed(t, 2, "mapping_error", time.Hour)
	plantMarker(t, b, ids[0])
	r := b.operator(t).get(Prefix + "failed")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "/console/events/"+itoa(ids[0]))
	require.NotContains(t, r.body, "MARKER-7f3a")
	require.NotContains(t, r.body, "ann@example")
}
