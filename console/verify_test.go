package console

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOverviewShowsTheLastVerify: the overview shows each projection's
// last scheduled verify, with its counts, samples and a drift mark, and
// says when none has run.
func TestOverviewShowsTheLastVerify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.operator(t)

	r := c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, "No scheduled verify has run: set OUTBOX_VERIFY_INTERVAL")

	b.db.Exec(t, `INSERT INTO outbox_verify_runs (projection, index_name, source_table, started_at, checked, missing, stale,
		extra, resurrected, in_flight, repaired, samples)
		VALUES ('search', 'books', 'search_index', now() - interval '1 minute', 1200, 1, 0, 2, 1, 0, 1,
		        '{"missing": ["book:b1"], "stale": [], "extra": ["book:x1", "book:x2"], "resurrected": ["book:b3"]}')`)
	r = c.get(Prefix)
	require.Contains(t, r.body, `<tr id="verify-search"><td>search</td>`)
	require.Contains(t, r.body, `<strong class="bad">drift</strong></td><td>table search_index</td>`)
	require.Contains(t, r.body, `<td class="num">1200</td><td class="num">1</td><td class="num">0</td><td class="num">2</td><td class="num">1</td><td class="num">1</td>`)
	require.Contains(t, r.body, `<div>extra: book:x1 book:x2 </div><div>missing: book:b1 </div><div>resurrected: book:b3 </div>`)

	b.db.Exec(t, `UPDATE outbox_verify_runs SET source_table = NULL, missing = 0, extra = 0, resurrected = 0, samples = '{}'`)
	r = c.get(Prefix)
	require.Contains(t, r.body, `<td>the ledger</td>`)
	require.NotContains(t, r.body, `<strong class="bad">drift</strong>`)
}
