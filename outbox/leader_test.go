package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

// bumpEpoch takes the next epoch of leader name "test" on the server of url.
func bumpEpoch(t *testing.T, url string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var epoch int64
	require.NoError(t, conn.QueryRow(ctx, outbox.BumpEpochSQL, "test", "a").Scan(&epoch))
	return epoch
}

// A promoted standby's epochs start above every epoch its old primary can
// take on the old timeline, so when the old primary comes back as a primary
// the two servers never hand out the same fencing token, and a claim or ack
// carrying one server's epoch matches nothing on the other.
func TestBumpEpochCrossesTimelines(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	db := pair.NewDatabase(t, pair.URL([]string{pair.Primary.Addr()}))
	onOld, onNew := db.URL, harness.OnNode(t, db.URL, pair.Standby)
	require.Equal(t, int64(1), bumpEpoch(t, onOld), "timeline 1 counts from 1, as before")
	require.Equal(t, int64(2), bumpEpoch(t, onOld))

	require.NoError(t, pair.KillPrimary())
	pair.Promote(t)
	first := bumpEpoch(t, onNew)
	require.Equal(t, int64(outbox.EpochsPerTimeline+1), first, "timeline 2's first epoch")
	require.Equal(t, first+1, bumpEpoch(t, onNew), "then one by one")

	pair.StartOldPrimary(t)
	for range 3 {
		require.Less(t, bumpEpoch(t, onOld), first, "the old primary stays below the promoted standby")
	}
}
