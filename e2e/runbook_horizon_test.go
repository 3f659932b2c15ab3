package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// rbHorizonSOP is the heading of the SOP whose queries find who holds the
// vacuum horizon.
const rbHorizonSOP = "### Something holds the vacuum horizon"

// The SOP's queries find each kind of holder as an operator would meet it:
// a session idle in a transaction, a replication slot, a prepared
// transaction. TestRunbookCommands runs them too, but with nothing to find.
func TestRunbookHorizonQueriesFindTheHolders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	psql := rbTool(t, "psql", harness.StackEnv(t)["STACK_PG_BINDIR"], "/usr/lib/postgresql/15/bin")
	db := harness.NewDatabase(t)

	harness.HoldSnapshot(t, db.URL, "forgotten-report")
	slot := harness.UniqueName("rb_slot_")
	db.Exec(t, `SELECT pg_create_physical_replication_slot($1)`, slot)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot) })
	gid := harness.UniqueName("rb_gid_")
	harness.PrepareTransaction(t, db, gid)

	blocks := rbSection(t, rbHorizonSOP)
	want := []string{"forgotten-report", slot, gid, "outbox_events"}
	require.Len(t, blocks, len(want), "the SOP's runnable queries: sessions, slots, prepared transactions, dead rows")
	for i, b := range blocks {
		bctx, cancel := context.WithTimeout(ctx, rbBlockTimeout)
		out, err := exec.CommandContext(bctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", b.body, db.URL).CombinedOutput()
		cancel()
		require.NoError(t, err, "%s:%d: %s", rbFile, b.line, out)
		require.Contains(t, string(out), want[i], "%s:%d finds it:\n%s", rbFile, b.line, out)
	}
}

// rbSection is the runnable SQL blocks under heading, up to the next
// heading of its level or above.
func rbSection(t *testing.T, heading string) []rbBlock {
	t.Helper()
	text := rbRead(t)
	lines := strings.Split(text, "\n")
	start, end := 0, len(lines)
	for i, l := range lines {
		if l == heading {
			start = i + 1
			continue
		}
		if start > 0 && (strings.HasPrefix(l, "### ") || strings.HasPrefix(l, "## ")) {
			end = i + 1
			break
		}
	}
	require.Positive(t, start, "%s has no heading %q", rbFile, heading)
	var out []rbBlock
	for _, b := range rbParse(t, text) {
		if b.runnable && b.lang == "sql" && b.line > start && b.line < end {
			out = append(out, b)
		}
	}
	return out
}
