package console

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOverviewShowsRebuildConfirmation: the overview lists the rebuild the
// leader writes both indexes of, and marks a confirmation the current
// leader's epoch has not given: a swap would be refused.
func TestOverviewShowsRebuildConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('L', 'w2', 8)`)
	b.db.Exec(t, `INSERT INTO outbox_rebuilds (projection, alias, target_index, old_index, source_table, mode, started_by, reason,
		dual_write_at, dual_write_by, dual_write_epoch, dual_write_leader, dual_write_seen_at, dual_write_since)
		VALUES ('search', 'books', 'books-new', 'books-old', 'search_index', 'bulk', 'alice', 'test',
		        now(), 'w1', 7, 'L', now(), now())`)
	c := b.operator(t)

	r := c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<tr id="rebuild-1"><td>#1 of search</td><td>open</td><td>books-new and books-old</td>`)
	require.Contains(t, r.body, `<strong class="bad">not confirmed</strong>: the current leader (epoch 8, worker w2) has not confirmed`)

	b.db.Exec(t, `UPDATE outbox_rebuilds SET dual_write_by = 'w2', dual_write_epoch = 8, dual_write_seen_at = now()`)
	r = c.get(Prefix)
	require.Contains(t, r.body, "by w2, epoch 8 (current)")
	require.NotContains(t, r.body, "not confirmed")
}
