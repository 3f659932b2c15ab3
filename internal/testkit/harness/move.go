package harness

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// ClusterMove is a database on its way to a fresh cluster of its own, as
// an operator moves one to another server or provider: pg_dump of the
// database, a restore into a cluster just made by initdb (its transaction
// counter far behind a busy one's), and deploy/sql/roles.sql run there
// again, since roles belong to a cluster and a dump of one database
// carries none. The cluster is stopped and removed when the test ends.
type ClusterMove struct {
	pair *PGPair
	dump string
}

// StartMove starts the new cluster and dumps src: what is written to src
// after StartMove returns does not move.
func StartMove(t testing.TB, src DB) *ClusterMove {
	t.Helper()
	pair := StartPGAlone(t)
	return &ClusterMove{pair: pair, dump: pair.Dump(t, src)}
}

// Finish restores the dump into the new cluster and applies roles.sql
// there for roles owner and runtime (with OwnerPassword and
// RuntimePassword), which hands the restored objects to owner and grants
// runtime its privileges. The DB's URL and pool are a superuser's: Login
// gives the roles' URLs.
func (c *ClusterMove) Finish(t testing.TB, owner, runtime string) DB {
	t.Helper()
	db := c.pair.Restore(t, c.dump)
	out, err := ApplyRoles(t, db.URL, db.Name, owner, runtime)
	require.NoError(t, err, "roles.sql on the new cluster: %s", out)
	return db
}
