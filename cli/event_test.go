package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/replay"
)

const eventMarker = "MARKER-91be-ann@example.org"

// maskedEventSetup plants the marker in masked fields of a failed event of
// search, and in its error texts as a row failed before the mask was set
// holds them, archives another, and writes a projections file masking
// email and address.* of search.
func maskedEventSetup(t *testing.T) (opsBundle, string) {
	t.Helper()
	b := opsSetup(t)
	for _, id := range b.ids[0:2] {
		b.db.Exec(t, `UPDATE outbox_events
		   SET payload = jsonb_build_object('title', 'Dune', 'email', $2::text, 'address', jsonb_build_object('city', $2::text)),
		       last_error = 'Preview of field''s value: ''' || $2 || '''',
		       error_history = jsonb_build_array(jsonb_build_object('at', now(), 'attempt', 1, 'error', to_jsonb($2::text)::text))
		 WHERE id = $1`, id, eventMarker)
	}
	_, err := replay.Archive(b.ctx, b.db.Pool, replay.ArchiveRequest{OlderThan: time.Minute, IDs: b.ids[1:2], By: "alice", Why: "closed"})
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "projections.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
projections:
  search:
    kind: search
    engine: {urls: [http://127.0.0.1:9200], password_env: UNSET_IN_THIS_TEST}
    index: books
    mask: [email, "address.*"]
  chronicle: {kind: chronicle}
`), 0o600))
	return b, file
}

func TestCmdEventMasksPayloadAndErrors(t *testing.T) {
	t.Parallel()
	b, file := maskedEventSetup(t)
	for _, id := range b.ids[0:2] {
		for _, format := range [][]string{nil, {"--json"}} {
			args := append([]string{"event", strconv.FormatInt(id, 10), "--projections-file", file}, format...)
			code, out, errOut := b.run(t, args...)
			require.Zero(t, code, errOut)
			require.NotContains(t, out, "MARKER-91be", "%v", args)
			require.Contains(t, out, "Dune", "%v", args)
			require.Contains(t, out, "***", "%v", args)
		}
	}
	require.Zero(t, unmaskAudits(t, b), "a masked read is not audited")
}

func TestCmdEventUnmaskedIsAudited(t *testing.T) {
	t.Parallel()
	b, file := maskedEventSetup(t)
	id := strconv.FormatInt(b.ids[0], 10)
	for name, args := range map[string][]string{
		"no why":         {"--unmasked", "--by", "ada"},
		"no by":          {"--unmasked", "--why", "x"},
		"why, no switch": {"--by", "ada", "--why", "x"},
	} {
		code, out, errOut := b.run(t, append([]string{"event", id, "--projections-file", file}, args...)...)
		require.Equal(t, exitUsage, code, name)
		require.NotContains(t, out+errOut, "MARKER-91be", name)
	}
	require.Zero(t, unmaskAudits(t, b), "a refused read records nothing")

	code, out, errOut := b.run(t, "event", id, "--projections-file", file, "--json", "--unmasked", "--by", "ada", "--why", "ticket SUP-12")
	require.Zero(t, code, errOut)
	var d replay.EventDetail
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Contains(t, d.Payload, eventMarker, "the payload, whole")
	require.NotContains(t, d.LastError, eventMarker, "error texts stay masked")
	require.Equal(t, 1, unmaskAudits(t, b))
	var action, by, why string
	var events []int64
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT action, replayed_by, reason, event_ids FROM outbox_replay_audit
		WHERE action = 'unmask'`).Scan(&action, &by, &why, &events))
	require.Equal(t, []any{"unmask", "ada", "ticket SUP-12", []int64{b.ids[0]}}, []any{action, by, why, events})
}

func unmaskAudits(t *testing.T, b opsBundle) int {
	return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'unmask'`)
}

// wlproj failed list masks a listed error with its row's payload: a row
// failed before its projection had a mask holds the quoted value.
func TestCmdFailedListMasksErrors(t *testing.T) {
	t.Parallel()
	b, file := maskedEventSetup(t)
	for _, args := range [][]string{{"failed", "list"}, {"failed", "list", "--json"},
		{"failed", "list", "--archived"}, {"failed", "list", "--archived", "--json"}} {
		code, out, errOut := b.run(t, append(args, "--projections-file", file)...)
		require.Zero(t, code, errOut)
		require.NotContains(t, out, "MARKER-91be", "%v", args)
		require.Contains(t, out, "Preview of field", "%v: the rest of the error is shown", args)
	}
	code, out, _ := b.run(t, "failed", "list")
	require.Zero(t, code)
	require.Contains(t, out, "MARKER-91be", "without the file there is no mask: the stored text as it is")
}
