package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
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
	code := Run(args, &stdout, &stderr)
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
		"rows go with their partition within 252h; none older than that; oldest done",
	} {
		require.Contains(t, out, want)
	}
	// Only a done row past one and a half retentions says the rotation is late.
	b.db.Exec(t, `UPDATE outbox_events SET processed_at = now() - interval '3 hours' WHERE status = 'done'`)
	code, out, errOut = b.run(t, "status", "--retention", "1h")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "rows go with their partition within 1h30m; 1 done older than that: the rotation is late, see its log")

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

// status names who holds the database's vacuum horizon, since when and how
// many transactions ago, and the dead rows of the outbox and the ledger;
// once the session ends, nothing.
func TestOpsStatusShowsTheHorizon(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	holder := harness.HoldSnapshot(t, b.db.URL, "app-report")
	b.db.Exec(t, `SELECT txid_current()`)

	code, out, errOut := b.run(t, "status")
	require.Zero(t, code, errOut)
	require.Contains(t, out, fmt.Sprintf(`horizon     session "app-report" (pid %d, idle in transaction), held `, holder.PID))
	require.Regexp(t, `held [0-9.]+m?s, [1-9][0-9]* transactions ago\n`, out)
	require.Regexp(t, `vacuum      outbox_events: [0-9]+ dead, [0-9]+ live, last autovacuum `, out)
	require.Contains(t, out, "vacuum      outbox_ledger: ")

	code, out, errOut = b.run(t, "status", "--json")
	require.Zero(t, code, errOut)
	s := jsonLines(t, out)[0]
	h := s["horizon"].(map[string]any)
	require.Equal(t, "backend", h["kind"])
	require.Equal(t, "postgres", h["age_basis"])
	require.Positive(t, h["age_seconds"])
	require.GreaterOrEqual(t, h["age_transactions"], 1.0)
	holderJSON := h["holder"].(map[string]any)
	require.EqualValues(t, holder.PID, holderJSON["pid"])
	require.Equal(t, "app-report", holderJSON["application_name"])
	require.Equal(t, "idle in transaction", holderJSON["state"])
	require.Equal(t, false, holderJSON["wlproj"])
	vacuum := s["vacuum"].([]any)
	require.Len(t, vacuum, 2)
	require.Equal(t, "outbox_events", vacuum[0].(map[string]any)["table"])
	require.Contains(t, vacuum[0], "dead_tuples")

	holder.Release()
	harness.Eventually(t, 10*time.Second, "nothing holds the horizon", func() bool {
		_, out, _ := b.run(t, "status", "--json")
		h := jsonLines(t, out)[0]["horizon"].(map[string]any)
		return h["kind"] == "none" && h["holder"] == nil && h["age_seconds"] == 0.0
	})
	_, out, _ = b.run(t, "status")
	require.Contains(t, out, "horizon     nothing holds a snapshot")
}
