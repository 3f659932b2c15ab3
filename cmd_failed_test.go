package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/replay"
)

// The seed of opsSetup: ids[0..2] failed with timeout an hour ago (search),
// ids[3..4] failed with mapping_error three days ago (chronicle), ids[5]
// done, ids[6] pending.

func (b opsBundle) archived(t *testing.T) int {
	return b.db.Int(t, `SELECT count(*) FROM outbox_dead_letter`)
}

// actions are the audit rows' actions, oldest first.
func (b opsBundle) actions(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT coalesce(string_agg(action, ',' ORDER BY id), '') FROM outbox_replay_audit`).Scan(&s))
	return s
}

func TestCmdFailedDiscard(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, out, errOut := b.run(t, "failed", "discard", "--reason", "timeout", "--by", "alice", "--why", "superseded", "--dry-run")
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	for i, id := range b.ids[:3] {
		require.Regexp(t, fmt.Sprintf(`^%d\s+search\s+book/`, id), lines[i+1])
	}
	require.Equal(t, fmt.Sprintf("dry run: 3 events would be discarded (ids %s); nothing changed", replay.FormatIDs(b.ids[:3])), lines[4])
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))

	ids := replay.FormatIDs(b.ids[:2])
	code, out, errOut = b.run(t, "failed", "discard", "--ids", ids, "--by", "alice", "--why", "superseded (CHG-7)")
	require.Zero(t, code, errOut)
	require.Regexp(t, fmt.Sprintf(`discarded 2 events \(ids %s\); audit id \d+\n$`, ids), out)
	require.Equal(t, 2, b.db.Count(t, `status = 'discarded' AND id = ANY($1)
		AND error_history @> '[{"event": "discarded", "by": "alice", "why": "superseded (CHG-7)"}]'`, b.ids[:2]))
	var by, why, given string
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, reason, event_count, selector->'given'->>'ids'
		FROM outbox_replay_audit WHERE action = 'discard'`).Scan(&by, &why, &n, &given))
	require.Equal(t, []any{"alice", "superseded (CHG-7)", 2, ids}, []any{by, why, n, given})

	code, out, _ = b.run(t, "failed", "list", "--json")
	require.Zero(t, code)
	require.Len(t, jsonLines(t, out), 3, "discarded rows are no longer failed")
	code, out, _ = b.run(t, "failed", "discard", "--reason", "parse_error", "--by", "alice", "--why", "x")
	require.Zero(t, code)
	require.Equal(t, "no failed events match; nothing discarded\n", out)
}

func TestCmdFailedDiscardBadInput(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	done, unknown := b.ids[5], b.ids[6]+1000
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--ids", fmt.Sprint(b.ids[0])}, exitUsage, "--by and --why are required: say who is discarding and why"},
		{[]string{"--ids", fmt.Sprint(b.ids[0]), "--by", "alice"}, exitUsage, "--by and --why are required"},
		{[]string{"--by", "alice", "--why", "x"}, exitUsage, "no selector: give --ids, --reason, --projection or --since/--until"},
		{[]string{"--ids", "5-1", "--by", "alice", "--why", "x"}, exitUsage, `--ids: "5-1": range ends before it starts`},
		{[]string{"--reason", "timeout", "--by", "auto", "--why", "x"}, exitUsage, `--by "auto" is reserved`},
		{[]string{"--ids", fmt.Sprintf("%d,%d,%d", b.ids[0], done, unknown), "--by", "alice", "--why", "x"}, exitRefused,
			fmt.Sprintf("discard refused, nothing changed: unknown ids: %d; id %d is done, not failed", unknown, done)},
		{[]string{"--since", "30d", "--max", "4", "--by", "alice", "--why", "x"}, exitRefused,
			"discard refused, nothing changed: 5 failed events match, more than --max 4; narrow the selector, raise --max, or add --yes"},
	} {
		code, out, errOut := b.run(t, append([]string{"failed", "discard"}, tc.args...)...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
	}
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))

	// --json reports the refusal by id, for scripts.
	code, out, _ := b.run(t, "failed", "discard", "--ids", fmt.Sprint(done), "--by", "alice", "--why", "x", "--json")
	require.Equal(t, exitRefused, code)
	require.Equal(t, []any{map[string]any{"id": float64(done), "status": "done"}}, jsonLines(t, out)[0]["not_failed"])
}

func TestCmdFailedArchiveAndRestore(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, _, errOut := b.run(t, "failed", "discard", "--ids", fmt.Sprint(b.ids[0]), "--by", "alice", "--why", "superseded")
	require.Zero(t, code, errOut)

	code, out, errOut := b.run(t, "failed", "archive", "--older-than", "2d", "--by", "alice", "--why", "old", "--dry-run")
	require.Zero(t, code, errOut)
	require.Contains(t, out, fmt.Sprintf("dry run: 2 events would be archived (ids %s); nothing changed", replay.FormatIDs(b.ids[3:5])))
	require.Zero(t, b.archived(t))

	code, out, errOut = b.run(t, "failed", "archive", "--older-than", "2d", "--by", "alice", "--why", "older than 2 days")
	require.Zero(t, code, errOut)
	require.Contains(t, out, fmt.Sprintf("archived 2 events (ids %s) to outbox_dead_letter; audit id ", replay.FormatIDs(b.ids[3:5])))
	// The failed and the discarded row of the last hour, by a shorter age.
	code, out, errOut = b.run(t, "failed", "archive", "--older-than", "30m", "--projection", "search", "--by", "alice", "--why", "x")
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Regexp(t, `^ID\s+.*\sFAILED_AT\s+STATUS\s+LAST_ERROR$`, lines[0])
	require.Regexp(t, fmt.Sprintf(`^%d\s+search\s.*\sdiscarded\s+context deadline`, b.ids[0]), lines[1])
	require.Equal(t, 5, b.archived(t))
	require.Zero(t, b.db.Count(t, `status IN ('failed', 'discarded')`))

	code, out, errOut = b.run(t, "failed", "list", "--archived")
	require.Zero(t, code, errOut)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	require.Regexp(t, `^ID\s+.*\sFAILED_AT\s+STATUS\s+ARCHIVED_AT\s+LAST_ERROR$`, lines[0])
	code, out, _ = b.run(t, "failed", "list", "--archived", "--reason", "mapping_error", "--json")
	require.Zero(t, code)
	objs := jsonLines(t, out)
	require.Len(t, objs, 2)
	require.Equal(t, "failed", objs[0]["status"])
	require.Contains(t, objs[0], "archived_at")
	code, out, _ = b.run(t, "failed", "stats", "--archived")
	require.Zero(t, code)
	require.Contains(t, out, "total: 5 archived events")
	code, out, _ = b.run(t, "failed", "list")
	require.Zero(t, code)
	require.Equal(t, "no failed events match\n", out)

	back := fmt.Sprint(b.ids[3])
	code, out, errOut = b.run(t, "replay", "--archived", "--ids", back, "--by", "bob", "--why", "mapping fixed", "--dry-run")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "dry run: 1 events would be restored (ids "+back+"); nothing changed")
	require.Equal(t, 5, b.archived(t))
	code, out, errOut = b.run(t, "replay", "--archived", "--ids", back, "--by", "bob", "--why", "mapping fixed")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "restored 1 events (ids "+back+") to pending; audit id ")
	require.Equal(t, 1, b.db.Count(t, `id = $1 AND status = 'pending' AND replay_count = 1 AND error_reason = 'mapping_error'
		AND error_history @> '[{"event": "restored", "by": "bob"}]'`, b.ids[3]))
	require.Equal(t, 4, b.archived(t))
	require.Equal(t, "discard,archive,archive,restore", b.actions(t))
}

func TestCmdFailedArchiveBadInput(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	pending, done, unknown := b.ids[6], b.ids[5], b.ids[6]+1000
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--by", "alice", "--why", "x"}, exitUsage, "--older-than"},
		{[]string{"--older-than", "soon", "--by", "alice", "--why", "x"}, exitUsage, `--older-than: "soon" is not a duration like 720h or 30d`},
		{[]string{"--older-than", "0", "--by", "alice", "--why", "x"}, exitUsage, "--older-than must be positive, got 0s"},
		{[]string{"--older-than=-1h", "--by", "alice", "--why", "x"}, exitUsage, "--older-than must be positive, got -1h0m0s"},
		{[]string{"--older-than", "1h", "--why", "x"}, exitUsage, "--by and --why are required: say who is archiving and why"},
		{[]string{"--older-than", "1m", "--ids", fmt.Sprintf("%d,%d,%d,%d", b.ids[0], done, pending, unknown), "--by", "alice", "--why", "x"},
			exitRefused, fmt.Sprintf("archive refused, nothing changed: unknown ids: %d; id %d is done, not failed or discarded; "+
				"id %d is pending, not failed or discarded", unknown, done, pending)},
	} {
		code, out, errOut := b.run(t, append([]string{"failed", "archive"}, tc.args...)...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
	}
	require.Zero(t, b.archived(t))
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))
}

func TestCmdReplayArchivedBadInput(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, _, errOut := b.run(t, "failed", "archive", "--older-than", "2d", "--by", "alice", "--why", "old")
	require.Zero(t, code, errOut)
	archived, live := b.ids[3], b.ids[0]
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--reason", "mapping_error", "--by", "bob", "--why", "x"}, exitUsage, "--ids are required: archived rows come back by id only"},
		{[]string{"--ids", fmt.Sprint(archived), "--by", "bob"}, exitUsage, "--by and --why are required: say who is replaying and why"},
		{[]string{"--ids", fmt.Sprintf("%d,%d", archived, live), "--by", "bob", "--why", "x"}, exitRefused,
			fmt.Sprintf("restore refused, nothing changed: unknown archived ids: %d", live)},
	} {
		code, out, errOut := b.run(t, append([]string{"replay", "--archived"}, tc.args...)...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
		require.Empty(t, out, "%v", tc.args)
	}
	code, out, _ := b.run(t, "replay", "--archived", "--ids", fmt.Sprint(live), "--by", "bob", "--why", "x", "--json")
	require.Equal(t, exitRefused, code)
	require.Equal(t, []any{float64(live)}, jsonLines(t, out)[0]["missing"])
	require.Equal(t, 2, b.archived(t))
	require.Equal(t, "archive", b.actions(t))
}

func TestCmdFailedHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"failed", "discard", "--help"}, {"failed", "archive", "--help"}, {"replay", "--help"}} {
		var out, errOut strings.Builder
		require.Zero(t, run(args, &out, &errOut), "%v: %s", args, errOut.String())
		require.Contains(t, out.String(), "--dry-run", "%v", args)
	}
}
