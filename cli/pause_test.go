package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type pauseBundle struct{ db harness.DB }

// run runs wlproj in-process against this database.
func (b pauseBundle) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(append(args, "--database-url", b.db.URL), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func (b pauseBundle) unchanged(t *testing.T) {
	t.Helper()
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_projection_state`), "no state was written")
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit`), "no audit row was written")
}

func TestCmdPauseRequiresByWhyAndAKnownProjection(t *testing.T) {
	t.Parallel()
	b := pauseBundle{db: harness.NewDatabase(t)}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "--projection", "chronicle", "--why", "INC-7"}, "--by is required: say who is pausing"},
		{[]string{"pause", "--projection", "chronicle", "--by", "alice"}, "--why is required"},
		{[]string{"resume", "--projection", "chronicle", "--by", " ", "--why", "x"}, "--by is required: say who is resuming"},
		{[]string{"pause", "--by", "alice", "--why", "x"}, "--projection is required"},
		{[]string{"pause", "--projection", "timeline", "--by", "alice", "--why", "x"},
			`--projection: unknown projection "timeline"; this wlproj knows chronicle, search; nothing changed`},
		{[]string{"resume", "--projection", "Search", "--by", "alice", "--why", "x"}, `unknown projection "Search"`},
	} {
		code, out, errOut := b.run(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
		require.Empty(t, out)
	}
	b.unchanged(t)
}

func TestCmdPauseResumeAudited(t *testing.T) {
	t.Parallel()
	b := pauseBundle{db: harness.NewDatabase(t)}
	b.db.Exec(t, `INSERT INTO outbox_events (projection, entity_type, entity_id, op)
		SELECT 'chronicle', 'book', g::text, 'upsert' FROM generate_series(1, 3) g`)

	code, out, errOut := b.run(t, "resume", "--projection", "chronicle", "--by", "alice", "--why", "INC-7")
	require.Zero(t, code, errOut)
	require.Equal(t, "chronicle is not paused (it never was); nothing changed\n", out)
	b.unchanged(t)

	code, out, errOut = b.run(t, "pause", "--projection", "chronicle", "--by", "alice", "--why", "INC-7 chronicle disk full")
	require.Zero(t, code, errOut)
	require.Regexp(t, `^paused chronicle \(audit \d+\): the leader claims none of its events`, out)

	// Pausing again says so, exits 0 and writes nothing.
	code, out, errOut = b.run(t, "pause", "--projection", "chronicle", "--by", "bob", "--why", "me too")
	require.Zero(t, code, errOut)
	require.Regexp(t, `^chronicle is already paused, since \S+Z by alice: INC-7 chronicle disk full; nothing changed`, out)

	code, out, errOut = b.run(t, "status")
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^  chronicle\s+paused\s+3\s+\S+\s+\S+Z\s+alice\s+INC-7 chronicle disk full$`, out)
	require.Regexp(t, `(?m)^  search\s+running\s+0\s+-\s+-\s+-\s+-$`, out)

	code, out, errOut = b.run(t, "status", "--json")
	require.Zero(t, code, errOut)
	projections := jsonLines(t, out)[0]["projections"].([]any)
	require.Len(t, projections, 2)
	chronicle := projections[0].(map[string]any)
	require.Equal(t, "chronicle", chronicle["projection"])
	require.Equal(t, true, chronicle["paused"])
	require.EqualValues(t, 3, chronicle["pending"])
	require.Equal(t, "alice", chronicle["changed_by"])
	require.Contains(t, chronicle, "changed_at")

	code, out, errOut = b.run(t, "resume", "--projection", "chronicle", "--by", "alice", "--why", "disk replaced", "--json")
	require.Zero(t, code, errOut)
	res := jsonLines(t, out)[0]
	require.Equal(t, true, res["changed"])
	require.Equal(t, false, res["state"].(map[string]any)["paused"])

	code, out, _ = b.run(t, "resume", "--projection", "chronicle", "--by", "alice", "--why", "again")
	require.Zero(t, code)
	require.Regexp(t, `^chronicle is not paused \(resumed \S+Z by alice: disk replaced\); nothing changed`, out)

	actions := harness.Column[string](t, b.db, `
		SELECT action || ' ' || replayed_by || ' ' || reason || ' ' || (selector->>'projection') || ' ' || event_count || ' ' || cardinality(event_ids)
		  FROM outbox_replay_audit ORDER BY id`)
	require.Equal(t, []string{"pause alice INC-7 chronicle disk full chronicle 0 0", "resume alice disk replaced chronicle 0 0"}, actions)
}

// A command's audit row names its actor: --by, the OS user who ran it,
// via the CLI, and the command's request id.
func TestCmdAuditRowNamesTheCLIActor(t *testing.T) {
	t.Parallel()
	b := pauseBundle{db: harness.NewDatabase(t)}
	code, _, errOut := b.run(t, "pause", "--projection", "chronicle", "--by", "alice", "--why", "INC-8")
	require.Zero(t, code, errOut)
	var user, via, auth, osUser, requestID, actorRequestID string
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT actor->>'user', actor->>'via', actor->>'auth', actor->>'os_user',
		       request_id, actor->>'request_id' FROM outbox_replay_audit WHERE action = 'pause'`).
		Scan(&user, &via, &auth, &osUser, &requestID, &actorRequestID))
	require.Equal(t, []string{"alice", "cli", "os"}, []string{user, via, auth})
	require.NotEmpty(t, osUser)
	require.Len(t, requestID, 16)
	require.Equal(t, requestID, actorRequestID)
	var projections, scopes []*string
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT projections, scope_keys FROM outbox_replay_audit WHERE action = 'pause'`).
		Scan(&projections, &scopes))
	require.Equal(t, "chronicle", *projections[0])
	require.Nil(t, scopes[0], "a pause takes the projection as a whole")
}
