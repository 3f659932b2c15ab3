package console

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// withPolicy gives the console a policy file of text.
func withPolicy(t *testing.T, text string) setupOption {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return func(c *Config, _ *Deps) { c.PolicyFile = path }
}

// ada may replay and discard library 1's events of search; viv may look at
// everything but act on nothing.
const lib1Policy = `
roles:
  lib-1:
    actions: [replay, discard]
    projections: [search]
    scopes: [lib-1]
  reader:
    actions: [view]
    projections: ["*"]
    scopes: ["*"]
users:
  ada: [lib-1]
  viv: [reader]
`

func TestAScopedOperatorSeesAndChangesOnlyItsScope(t *testing.T) {
	t.Parallel()
	b := setup(t, withPolicy(t, lib1Policy))
	ids := b.failed(t, 9, "mapping_error", time.Hour) // lib-1, lib-2, lib-0, ...
	b.db.Exec(t, `UPDATE outbox_events SET projection = 'search'`)
	mine, other := ids[0], ids[1]
	ada := b.operator(t)

	list := ada.get(Prefix + "failed?scope_key=lib-2")
	require.Equal(t, http.StatusOK, list.code)
	require.NotContains(t, list.body, "/console/events/", "a filter on another scope does not widen the grants")
	list = ada.get(Prefix + "failed")
	var listed []string
	for _, m := range reEventLink.FindAllStringSubmatch(list.body, -1) {
		listed = append(listed, m[1])
	}
	require.ElementsMatch(t, []string{itoa(ids[0]), itoa(ids[3]), itoa(ids[6])}, listed)
	overview := ada.get(Prefix)
	require.Contains(t, overview.body, `id="scoped"`)
	require.NotContains(t, overview.body, `id="lag"`, "the counts over every scope are not ada's")

	require.Equal(t, http.StatusOK, ada.get(Prefix+"events/"+itoa(mine)).code)
	before := b.audits(t)
	r := ada.get(Prefix + "events/" + itoa(other))
	require.Equal(t, http.StatusForbidden, r.code)
	require.Contains(t, r.body, "the refusal is audited")
	require.NotEmpty(t, r.header.Get("X-Request-Id"))
	require.Equal(t, before+1, b.audits(t))
	var by, requestID string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, request_id FROM outbox_replay_audit
		WHERE action = 'refused' AND $1 = ANY(event_ids)`, other).Scan(&by, &requestID))
	require.Equal(t, "ada", by)
	require.Equal(t, r.header.Get("X-Request-Id"), requestID, "the audit row carries the request's id")

	// An id that is not there reads as one of another scope.
	missing := ada.get(Prefix + "events/999999")
	require.Equal(t, http.StatusForbidden, missing.code)
	require.Equal(t, r.body[strings.Index(r.body, "<main>"):strings.Index(r.body, "Refused: ")],
		missing.body[strings.Index(missing.body, "<main>"):strings.Index(missing.body, "Refused: ")])
	r = ada.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(mine), "999999"}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)

	// Ids of another scope, typed by hand: refused, audited, nothing changed.
	r = ada.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(mine), itoa(other)}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	require.Equal(t, 9, b.count(t, `status = 'failed'`))
	// A filter: only ada's scope, dry run and confirmation alike.
	r = ada.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"filter"}, "reason": {"mapping_error"}})
	require.Equal(t, http.StatusOK, r.code, r.body)
	require.Equal(t, "3", reConfirmCount.FindStringSubmatch(r.body)[1])
	form := confirmForm(t, r.body)
	form.Set("why", "fixed the mapping")
	r = ada.post(Prefix+"actions/apply", form)
	require.Equal(t, http.StatusSeeOther, r.code, r.body)
	require.Equal(t, 3, b.count(t, `status = 'pending' AND scope_key = 'lib-1'`))
	require.Equal(t, 6, b.count(t, `status = 'failed' AND scope_key <> 'lib-1'`))

	// An action ada's role does not grant, and one on the whole projection.
	r = ada.post(Prefix+"actions/dry-run", url.Values{"action": {"archive"}, "scope": {"filter"}, "older_than": {"1m"}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	r = ada.post(Prefix+"projections/pause", url.Values{"projection": {"search"}, "op": {"pause"}, "why": {"x"}})
	require.Equal(t, http.StatusForbidden, r.code, r.body)
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_projection_state`))

	// The audit log: ada's replay is hers to see; a row that also took
	// another scope's events is not.
	b.db.Exec(t, `INSERT INTO outbox_replay_audit (action, replayed_by, reason, selector, event_count, event_ids, projections, scope_keys)
		VALUES ('discard', 'zed', 'zed-was-here', '{}', 2, ARRAY[$1::bigint, $2::bigint], '{search,search}', '{lib-1,lib-2}')`, mine, other)
	audit := ada.get(Prefix + "audit")
	require.Contains(t, audit.body, "fixed the mapping")
	require.NotContains(t, audit.body, "zed-was-here")
	zed := int64(b.db.Int(t, `SELECT id FROM outbox_replay_audit WHERE replayed_by = 'zed'`))
	require.Equal(t, http.StatusForbidden, ada.get(Prefix+"audit/"+itoa(zed)).code)

	viv := b.viewer(t)
	require.Contains(t, viv.get(Prefix+"audit").body, "zed-was-here", "an operator of every scope sees every row")
	r = viv.post(Prefix+"actions/dry-run", url.Values{"action": {"replay"}, "scope": {"ids"}, "id": {itoa(other)}})
	require.Equal(t, http.StatusForbidden, r.code)
}

func TestAUserThePolicyGrantsNothingIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, withPolicy(t, `
roles:
  reader:
    actions: [view]
    projections: ["*"]
    scopes: ["*"]
users:
  viv: [reader]
`))
	ada := b.operator(t)
	refusals := func() int {
		return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'refused' AND replayed_by = 'ada'`)
	}
	before := refusals()
	r := ada.get(Prefix + "failed")
	require.Equal(t, http.StatusForbidden, r.code)
	require.Contains(t, r.body, "no role of the policy file")
	require.Equal(t, before+1, refusals())
}

func TestAPolicyFileNamingAnUnknownProjectionStopsTheStart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte("roles:\n  r:\n    actions: [view]\n    projections: [serch]\n    scopes: [\"*\"]\nusers:\n  ada: [r]\n"), 0o600))
	_, err := New(Config{UsersFile: usersFile(t), PolicyFile: path}, Deps{Pool: nil})
	require.Error(t, err)
	_, err = loadPolicy(path, []string{"search", "chronicle"})
	require.EqualError(t, err, path+`:4: roles.r.projections: names projection "serch", which this replica does not run (it runs: search, chronicle)`)
}
