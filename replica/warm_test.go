package replica

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// A standby's pool keeps the connections a takeover wants open, and a pool
// that has them opens no more.
func TestWarmPoolOpensConnectionsAhead(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	ctx := context.Background()
	pool, err := pgpool.Open(ctx, db.URL, 8, "wlproj:warm")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Zero(t, pool.Stat().TotalConns(), "pgxpool opens nothing by itself")
	warmPool(ctx, pool, 4)
	require.EqualValues(t, 4, pool.Stat().IdleConns())
	warmPool(ctx, pool, 4)
	require.EqualValues(t, 4, pool.Stat().TotalConns(), "enough open already: none added")
}
