package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/replay"
)

// opsBundle is a migrated database with failed rows seeded by plain SQL.
type opsBundle struct {
	db  harness.DB
	ctx context.Context
	ids []int64 // ids[0..4]: failed; ids[5]: done; ids[6]: pending
}

func opsSetup(t *testing.T) opsBundle {
	t.Helper()
	b := opsBundle{db: harness.NewDatabase(t), ctx: context.Background()}
	b.ids = harness.Column[int64](t, b.db, `
		INSERT INTO outbox_events (entity_type, entity_id, op, scope_key, created_at)
		SELECT 'book', 'b' || g, 'upsert', 'lib-' || (g % 2), now() - interval '2 hours'
		  FROM generate_series(1, 7) g
		RETURNING id`)
	b.db.Exec(t, `
		UPDATE outbox_events SET status = 'failed', attempts = 5, error_class = 'transient', error_reason = 'timeout',
		       last_error = 'context deadline exceeded' || chr(10) || 'second line', updated_at = now() - interval '1 hour'
		 WHERE id = ANY($1)`, b.ids[0:3])
	b.db.Exec(t, `
		UPDATE outbox_events SET status = 'failed', attempts = 1, error_class = 'deterministic', error_reason = 'mapping_error',
		       last_error = 'strict_dynamic_mapping_exception: mapping set to strict, dynamic introduction of [subtitle] is not allowed',
		       projection = 'chronicle', entity_type = 'block', updated_at = now() - interval '3 days'
		 WHERE id = ANY($1)`, b.ids[3:5])
	b.db.Exec(t, `UPDATE outbox_events SET status = 'done', processed_at = now() WHERE id = $1`, b.ids[5])
	return b
}

func (b opsBundle) failedCount(t *testing.T) int {
	return b.db.Count(t, `status = 'failed'`)
}

func (b opsBundle) audits(t *testing.T) int {
	return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit`)
}

// run runs wlproj in-process against this database.
func (b opsBundle) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(args, "--database-url", b.db.URL)
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// lines runs a command that must succeed and print n lines, and returns them.
func (b opsBundle) lines(t *testing.T, n int, args ...string) []string {
	t.Helper()
	code, out, errOut := b.run(t, args...)
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, n, out)
	return lines
}

func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		objs = append(objs, m)
	}
	return objs
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

func TestOpsStatus(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	b.db.Exec(t, `UPDATE outbox_events SET status = 'processing', locked_by = 'w1', claim_token = 2,
		lease_until = now() + interval '1 minute', processing_started_at = now() - interval '10 minutes' WHERE id = $1`, b.ids[6])
	b.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'worker-a', 4)`)

	code, out, errOut := b.run(t, "status")
	require.Zero(t, code, errOut)
	for _, want := range []string{
		"database  ", "/" + b.db.Name,
		"pending     0", "processing  1", "done        ", "(estimate; --exact counts)", "failed      5",
		"lag         0 pending, nothing pending",
		"in flight   1",
		"stuck       1 (lease expired or processing longer than 5m0s)",
		"leader      none active; last was worker-a, epoch 4",
		"top failed reasons:", "search      timeout        3", "chronicle   mapping_error  2",
	} {
		require.Contains(t, out, want)
	}

	code, out, _ = b.run(t, "status", "--json", "--exact", "--max-processing-seconds", "3600")
	require.Zero(t, code)
	objs := jsonLines(t, out)
	require.Len(t, objs, 1)
	s := objs[0]
	require.Equal(t, map[string]any{"pending": 0.0, "processing": 1.0, "done": 1.0, "failed": 5.0, "discarded": 0.0}, s["counts"])
	require.Equal(t, true, s["done_exact"])
	require.EqualValues(t, 0, s["stuck"], "under the 1h cap")
	require.EqualValues(t, 1, s["in_flight"])
	require.EqualValues(t, 3600, s["max_processing_seconds"])
	require.Len(t, s["top_failed_reasons"], 2)
	leader := s["leader"].(map[string]any)
	require.Equal(t, "worker-a", leader["worker_id"])
	require.EqualValues(t, 4, leader["epoch"])
	require.Equal(t, false, leader["active"])

	// Lag and the oldest pending age.
	b.db.Exec(t, `UPDATE outbox_events SET status = 'pending' WHERE id = $1`, b.ids[5])
	code, out, _ = b.run(t, "status", "--json")
	require.Zero(t, code)
	s = jsonLines(t, out)[0]
	require.EqualValues(t, 1, s["lag"])
	require.InDelta(t, 7200, s["oldest_pending_age_seconds"], 60)
	code, out, _ = b.run(t, "status")
	require.Zero(t, code)
	require.Contains(t, out, "lag         1 pending, oldest 2h0m")

	code, _, errOut = b.run(t, "status", "--max-processing-seconds", "0")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "OUTBOX_MAX_PROCESSING_SECONDS")
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

func TestOpsSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	const secret = "s3cr3t-planted"
	// The test server trusts local connections: the password is never checked.
	good := b.db.Login(t, "", secret)
	u, err := url.Parse(good)
	require.NoError(t, err)
	u.Host = u.Hostname() + ":1" // nothing listens on port 1
	unreachable := u.String()
	malformed := "postgres://postgres:" + secret + "@127.0.0.1:notaport/db"
	bin := harness.Binary(t)

	cases := []struct {
		url  string
		args []string
		code int
	}{
		{good, []string{"--help"}, 0},
		{good, []string{"replay", "--help"}, 0},
		{good, []string{"status", "--help"}, 0},
		{good, []string{"failed", "list", "--help"}, 0},
		{good, []string{"status"}, 0},
		{good, []string{"status", "--json"}, 0},
		{good, []string{"failed", "list"}, 0},
		{good, []string{"failed", "list", "--json"}, 0},
		{good, []string{"failed", "stats"}, 0},
		{good, []string{"replay", "--reason", "timeout", "--dry-run", "--by", "a", "--why", "b"}, 0},
		{good, []string{"replay", "--ids", "999999", "--by", "a", "--why", "b"}, exitRefused},
		{good, []string{"replay", "--ids", "1"}, exitUsage},
		{good, []string{"status", "--bogus-flag"}, 2},
		{unreachable, []string{"status"}, exitFailure},
		{unreachable, []string{"failed", "list"}, exitFailure},
		{unreachable, []string{"failed", "stats", "--json"}, exitFailure},
		{unreachable, []string{"replay", "--ids", "1", "--by", "a", "--why", "b"}, exitFailure},
		{malformed, []string{"status"}, exitUsage},
	}
	for _, tc := range cases {
		// Through the environment, as deployed...
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+tc.url, "PGCONNECT_TIMEOUT=5")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		require.Equal(t, tc.code, code, "%v\nstdout: %s\nstderr: %s", tc.args, stdout.String(), stderr.String())
		require.NotContains(t, stdout.String(), secret, "%v", tc.args)
		require.NotContains(t, stderr.String(), secret, "%v", tc.args)

		// ...and as a flag, where a command takes one.
		if tc.args[0] == "--help" {
			continue
		}
		var out, errOut bytes.Buffer
		code = run(append(tc.args, "--database-url", tc.url), &out, &errOut)
		require.Equal(t, tc.code, code, "%v\nstdout: %s\nstderr: %s", tc.args, out.String(), errOut.String())
		require.NotContains(t, out.String(), secret, "%v", tc.args)
		require.NotContains(t, errOut.String(), secret, "%v", tc.args)
		if tc.url == unreachable {
			require.Contains(t, errOut.String(), "connect to database")
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	dsn := "postgres://u:p%40ss-w0rd@h:5432/db?sslmode=disable"
	got := redact("dial postgres://u:p%40ss-w0rd@h:5432/db?sslmode=disable failed; pw p@ss-w0rd; also postgres://x:other@y/z", dsn)
	require.NotContains(t, got, "p@ss-w0rd")
	require.NotContains(t, got, "p%40ss-w0rd")
	require.NotContains(t, got, "other")

	kv := "host=h user=u password=hunter22 dbname=db"
	require.Equal(t, "bad xxxxx and xxxxx", redact("bad "+kv+" and hunter22", kv))
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
