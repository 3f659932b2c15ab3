package replay

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

func TestAutoArchiverMovesOnlyRowsPastItsAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.seedArchive(t)
	a, err := NewAutoArchiver(b.db.Pool, time.Hour, zerolog.Nop())
	require.NoError(t, err)

	rep, err := a.runOnce(b.ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []int64{id[0], id[1], id[5]}, rep.IDs(), "failed or discarded over an hour ago")
	var by, action string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT replayed_by, action FROM outbox_replay_audit ORDER BY id DESC LIMIT 1`).
		Scan(&by, &action))
	require.Equal(t, []string{AutoArchiveBy, "archive"}, []string{by, action})

	rep, err = a.runOnce(b.ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Events, "nothing left past the age")
}

func TestAutoArchiverRefusesAShortAge(t *testing.T) {
	t.Parallel()
	_, err := NewAutoArchiver(nil, time.Minute, zerolog.Nop())
	require.ErrorContains(t, err, "After=1m0s is out of range")
}
