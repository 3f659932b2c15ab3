package leader

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

func TestConfigRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	base := Config{WorkerID: "a"}.withDefaults()
	for _, ok := range []string{
		"postgres://u@h1:5432/db",
		"postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
		"postgres://u@h1:5432,h2:5433/db?target_session_attrs=primary",
	} {
		c := base
		c.DatabaseURL = ok
		require.NoError(t, c.Validate(), ok)
	}
	for _, bad := range []string{
		"postgres://u@h1:5432,h2:5433/db",
		"postgres://u@h1:5432,h2:5433/db?target_session_attrs=any",
		"postgres://u@h1:5432,h2:5433/db?target_session_attrs=prefer-standby",
	} {
		c := base
		c.DatabaseURL = bad
		err := c.Validate()
		require.ErrorContains(t, err, "DatabaseURL: names 2 hosts (h1:5432, h2:5433) but not target_session_attrs=read-write", bad)
	}
}

// The lock connection skips a closed port and a standby listed before the
// primary, and after the primary dies and the standby is promoted, the
// leader notices, reconnects to the new primary and is elected again.
func TestElectorFollowsPostgresFailover(t *testing.T) {
	t.Parallel()
	pair := harness.StartPGPair(t)
	closed, err := harness.FreePort()
	require.NoError(t, err)
	url := pair.URL([]string{"127.0.0.1:" + strconv.Itoa(closed), pair.Standby.Addr(), pair.Primary.Addr()},
		"target_session_attrs=read-write")
	db := pair.NewDatabase(t, url)
	r := startReplica(t, db, "a")
	waitLeader(t, r)
	epoch := r.e.State().Epoch
	var inRecovery bool
	require.NoError(t, db.Pool.QueryRow(context.Background(), `
		SELECT pg_is_in_recovery() FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		LockSessionName("a")).Scan(&inRecovery))
	require.False(t, inRecovery)

	killed := time.Now()
	require.NoError(t, pair.KillPrimary())
	harness.Eventually(t, 5*time.Second, "the leader to stop its services", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.aborted == 1
	})
	pair.Promote(t)
	harness.Eventually(t, 10*time.Second, "the leader re-elected on the promoted standby", func() bool {
		return r.leading() && r.e.State().Epoch > epoch
	})
	t.Logf("re-elected at epoch %d %s after the primary was killed", r.e.State().Epoch, time.Since(killed))
	in, err := pair.InRecovery(context.Background(), pair.Standby)
	require.NoError(t, err)
	require.False(t, in, "the standby was promoted")
}
