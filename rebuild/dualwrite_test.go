package rebuild

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/harness"
	"github.com/wlproj/wlproj/projection"
)

// TestDualWriteConfirmsAndForgets: the leader's round sees an open rebuild
// of its alias, hands its index to the handler and confirms in the row,
// once per epoch; a rebuild of another alias is ignored and never
// confirmed; a closed one is forgotten within CacheTTL.
func TestDualWriteConfirmsAndForgets(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	search, err := projection.NewSearch(projection.SearchConfig{Client: b.client, Index: b.alias})
	require.NoError(t, err)
	d := NewDualWrite(b.db.Pool, Projection, search, "w1", zerolog.Nop())
	open := func(alias string) int64 {
		return int64(b.db.Int(t, `INSERT INTO outbox_rebuilds (projection, alias, target_index, source_table, mode, started_by, reason)
			VALUES ('search', $1, $1 || '-new', 'search_index', 'bulk', 'alice', 'test') RETURNING id`, alias))
	}

	other := open("another-alias")
	require.NoError(t, d.runOnce(b.ctx, 7))
	got, err := d.RebuildIndex(b.ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a rebuild of another alias is not this handler's")
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE dual_write_at IS NOT NULL`))
	b.db.Exec(t, `UPDATE outbox_rebuilds SET state = 'aborted' WHERE id = $1`, other)

	id := open(b.alias)
	require.NoError(t, d.runOnce(b.ctx, 7))
	got, err = d.RebuildIndex(b.ctx)
	require.NoError(t, err)
	require.Equal(t, b.alias+"-new", got)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds
		WHERE id = $1 AND dual_write_at IS NOT NULL AND dual_write_by = 'w1' AND dual_write_epoch = 7`, id))
	first := b.db.Int(t, `SELECT extract(epoch FROM dual_write_at)::int FROM outbox_rebuilds WHERE id = $1`, id)
	require.NoError(t, d.runOnce(b.ctx, 8))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND dual_write_epoch = 8
		AND extract(epoch FROM dual_write_at)::int = $2`, id, first), "a new epoch confirms again; the first time stays")

	b.db.Exec(t, `UPDATE outbox_rebuilds SET state = 'swapped' WHERE id = $1`, id)
	harness.Eventually(t, 2*CacheTTL+time.Second, "the handler to forget the closed rebuild", func() bool {
		got, err := d.RebuildIndex(b.ctx)
		return err == nil && got == ""
	})
}
