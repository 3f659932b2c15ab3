package cli

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
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
		require.Zero(t, Run(args, &out, &errOut), "%v: %s", args, errOut.String())
		require.Contains(t, out.String(), "--dry-run", "%v", args)
	}
}

func TestParseTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                          {},
		"24h":                       now.Add(-24 * time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"2025-03-01":                time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC),
		"2025-03-01T10:00:00Z":      time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC),
		"2025-03-01T10:00:00+02:00": time.Date(2025, 3, 1, 8, 0, 0, 0, time.UTC),
	} {
		got, err := parseTime("--since", in, now)
		require.NoError(t, err, in)
		require.True(t, want.Equal(got), "%s: got %s", in, got)
	}
	for _, bad := range []string{"yesterday", "-1h", "5x", "2025-13-01"} {
		_, err := parseTime("--until", bad, now)
		require.ErrorContains(t, err, "--until", bad)
	}
}

func TestOpsFailedList(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)

	lines := b.lines(t, 6, "failed", "list")
	require.Regexp(t, `^ID\s+PROJECTION\s+ENTITY\s+OP\s+ATTEMPTS\s+REPLAYS\s+REASON\s+SCOPE\s+FAILED_AT\s+LAST_ERROR$`, lines[0])
	require.Regexp(t, fmt.Sprintf(`^%d\s+search\s+book/b3\s+upsert\s+5\s+0\s+timeout\s+lib-1\s+\S+Z\s+context deadline exceeded…$`, b.ids[2]), lines[1])
	require.Contains(t, lines[5], "chronicle")
	require.Contains(t, lines[5], "strict_dynamic_mapping_exception: mapping set to strict, dyn…")

	code, out, _ := b.run(t, "failed", "list", "--reason", "mapping_error", "--json")
	require.Zero(t, code)
	objs := jsonLines(t, out)
	require.Len(t, objs, 2)
	require.EqualValues(t, b.ids[4], objs[0]["id"])
	for _, k := range []string{"projection", "entity_type", "entity_id", "op", "attempts", "error_reason",
		"error_class", "last_error", "updated_at", "replay_count", "scope_key"} {
		require.Contains(t, objs[0], k)
	}

	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--projection", "chronicle"}, 2},
		{[]string{"--entity-type", "book"}, 3},
		{[]string{"--scope-key", "lib-0"}, 2},
		{[]string{"--since", "24h"}, 3},
		{[]string{"--until", time.Now().Add(-24 * time.Hour).Format(time.RFC3339)}, 2},
		{[]string{"--since", "7d", "--until", "30m"}, 5},
		{[]string{"--since", "7d", "--until", "2h"}, 2},
		{[]string{"--reason", "timeout", "--projection", "chronicle"}, 0},
	} {
		code, out, errOut := b.run(t, append([]string{"failed", "list", "--json"}, tc.args...)...)
		require.Zero(t, code, errOut)
		require.Len(t, jsonLines(t, out), tc.want, "%v", tc.args)
	}

	code, out, _ = b.run(t, "failed", "list", "--limit", "2")
	require.Zero(t, code)
	require.Contains(t, out, "(first 2 shown; --limit 0 lists all)")

	code, out, _ = b.run(t, "failed", "list", "--reason", "nope")
	require.Zero(t, code)
	require.Equal(t, "no failed events match\n", out)

	code, _, errOut := b.run(t, "failed", "list", "--since", "yesterday")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `--since: "yesterday" is neither`)
}

func TestOpsFailedStats(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)

	lines := b.lines(t, 4, "failed", "stats")
	require.Regexp(t, `^PROJECTION\s+REASON\s+CLASS\s+COUNT\s+OLDEST\s+NEWEST$`, lines[0])
	require.Regexp(t, `^search\s+timeout\s+transient\s+3\s+\S+Z\s+\S+Z$`, lines[1])
	require.Regexp(t, `^chronicle\s+mapping_error\s+deterministic\s+2\s`, lines[2])
	require.Equal(t, "total: 5 failed events", lines[3])

	code, out, _ := b.run(t, "failed", "stats", "--json")
	require.Zero(t, code)
	objs := jsonLines(t, out)
	require.Len(t, objs, 2)
	require.Equal(t, "timeout", objs[0]["reason"])
	require.EqualValues(t, 3, objs[0]["count"])
	oldest, err := time.Parse(time.RFC3339, objs[1]["oldest"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(-72*time.Hour), oldest, time.Minute)

	code, out, _ = b.run(t, "failed", "stats", "--json", "--since", "24h")
	require.Zero(t, code)
	require.Len(t, jsonLines(t, out), 1)
}

func TestOpsReplayRequiresByAndWhy(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	for _, args := range [][]string{
		{"replay", "--ids", fmt.Sprint(b.ids[0])},
		{"replay", "--ids", fmt.Sprint(b.ids[0]), "--by", "alice"},
		{"replay", "--ids", fmt.Sprint(b.ids[0]), "--why", "fixed"},
		{"replay", "--reason", "timeout", "--by", "", "--why", "fixed"},
	} {
		code, out, errOut := b.run(t, args...)
		require.Equal(t, exitUsage, code, "%v", args)
		require.Contains(t, errOut, "--by and --why are required")
		require.Empty(t, out)
	}
	code, _, errOut := b.run(t, "replay", "--by", "alice", "--why", "fixed")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "no selector")
	code, _, errOut = b.run(t, "replay", "--by", "alice", "--why", "fixed", "--ids", "3-1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--ids")
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))
}

func TestOpsReplayDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	lines := b.lines(t, 5, "replay", "--reason", "timeout", "--by", "alice", "--why", "engine back", "--dry-run")
	for i, id := range b.ids[:3] {
		require.Regexp(t, fmt.Sprintf(`^%d\s+search\s+book/`, id), lines[i+1])
	}
	require.Equal(t, fmt.Sprintf("dry run: 3 events would be replayed (ids %s); nothing changed", replay.FormatIDs(b.ids[:3])), lines[4])
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))

	code, out, _ := b.run(t, "replay", "--reason", "timeout", "--by", "alice", "--why", "engine back", "--dry-run", "--json")
	require.Zero(t, code)
	rep := jsonLines(t, out)[0]
	require.Equal(t, true, rep["dry_run"])
	require.Len(t, rep["events"], 3)
	require.Equal(t, 5, b.failedCount(t))
}

func TestOpsReplayWritesOneAuditRow(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, out, errOut := b.run(t, "replay", "--projection", "chronicle", "--since", "7d",
		"--by", "alice", "--why", "mapping fixed in v2")
	require.Zero(t, code, errOut)
	require.Contains(t, out, fmt.Sprintf("replayed 2 events (ids %s) to pending; audit id ", replay.FormatIDs(b.ids[3:5])))
	require.Equal(t, 3, b.failedCount(t))
	require.Equal(t, 2, b.db.Count(t, `status = 'pending' AND replay_count = 1
		AND attempts = 1 AND error_reason = 'mapping_error'`))

	require.Equal(t, 1, b.audits(t))
	var by, why string
	var n int
	var ids []int64
	var sel map[string]any
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, reason, event_count, event_ids, selector
		FROM outbox_replay_audit`).Scan(&by, &why, &n, &ids, &sel))
	require.Equal(t, "alice", by)
	require.Equal(t, "mapping fixed in v2", why)
	require.Equal(t, 2, n)
	require.Equal(t, b.ids[3:5], ids)
	require.Equal(t, "chronicle", sel["projection"])
	require.Equal(t, map[string]any{"projection": "chronicle", "since": "7d"}, sel["given"])
	require.Contains(t, sel, "since", "the resolved time as well as what was typed")
}

func TestOpsReplayUnknownIDChangesNothing(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	unknown := b.ids[6] + 1000
	code, out, errOut := b.run(t, "replay", "--ids", fmt.Sprintf("%d,%d", b.ids[0], unknown),
		"--by", "alice", "--why", "x")
	require.Equal(t, exitRefused, code)
	require.Empty(t, out)
	require.Contains(t, errOut, fmt.Sprintf("replay refused, nothing changed: unknown ids: %d", unknown))
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))
}

func TestOpsReplayOfDoneRowRefused(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	done := b.ids[5]
	code, _, errOut := b.run(t, "replay", "--ids", fmt.Sprintf("%d-%d", b.ids[4], done), "--by", "alice", "--why", "x")
	require.Equal(t, exitRefused, code)
	require.Contains(t, errOut, fmt.Sprintf("id %d is done, not failed", done))
	require.Equal(t, 5, b.failedCount(t))
	require.Equal(t, 1, b.db.Count(t, `id = $1 AND status = 'done' AND replay_count = 0`, done))
	require.Zero(t, b.audits(t))

	// --json still reports by id, for scripts.
	code, out, _ := b.run(t, "replay", "--ids", fmt.Sprint(done), "--by", "alice", "--why", "x", "--json")
	require.Equal(t, exitRefused, code)
	rep := jsonLines(t, out)[0]
	require.Equal(t, []any{map[string]any{"id": float64(done), "status": "done"}}, rep["not_failed"])
}

func TestOpsReplayCap(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, _, errOut := b.run(t, "replay", "--since", "30d", "--max", "4", "--by", "alice", "--why", "x")
	require.Equal(t, exitRefused, code)
	require.Contains(t, errOut, "5 failed events match, more than --max 4")
	require.Contains(t, errOut, "--yes")
	require.Equal(t, 5, b.failedCount(t))
	require.Zero(t, b.audits(t))

	code, out, errOut := b.run(t, "replay", "--since", "30d", "--max", "4", "--yes", "--by", "alice", "--why", "x")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "replayed 5 events")
	require.Zero(t, b.failedCount(t))
	require.Equal(t, 1, b.audits(t))
}

func TestOpsReplayNothingMatches(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	code, out, errOut := b.run(t, "replay", "--reason", "parse_error", "--by", "alice", "--why", "x")
	require.Zero(t, code, errOut)
	require.Equal(t, "no failed events match; nothing replayed\n", out)
	require.Zero(t, b.audits(t))
}

// The listing reads a page per statement: longer than a page, every row
// comes once, newest failure first, and --limit cuts it where it says.
func TestOpsFailedListAcrossPages(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	n := replay.PageSizeRange.Max + 500
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, error_class, error_reason, updated_at)
		SELECT 'book', 'p' || g, 'upsert', 'failed', 'transient', 'server_error', now() - make_interval(secs => g)
		  FROM generate_series(1, $1) g`, n)
	want := harness.Column[int64](t, b.db, `SELECT id FROM outbox_events WHERE status = 'failed' AND error_reason = 'server_error'
		ORDER BY updated_at DESC, id DESC`)

	code, out, errOut := b.run(t, "failed", "list", "--reason", "server_error", "--limit", "0", "--json")
	require.Zero(t, code, errOut)
	var got []int64
	for _, o := range jsonLines(t, out) {
		got = append(got, int64(o["id"].(float64)))
	}
	require.Equal(t, want, got)

	code, out, errOut = b.run(t, "failed", "list", "--reason", "server_error", "--limit", strconv.Itoa(n-1))
	require.Zero(t, code, errOut)
	require.Equal(t, n+1, strings.Count(out, "\n"), "a header, the rows and the note")
	require.Contains(t, out, fmt.Sprintf("(first %d shown; --limit 0 lists all)", n-1))
}
