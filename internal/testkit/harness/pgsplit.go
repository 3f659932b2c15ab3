package harness

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// StartOldPrimary starts the primary KillPrimary killed again as a primary,
// as Patroni without fencing or a hasty operator might after the standby
// was promoted: two servers then accept writes, the old one on the old
// timeline. Its commits wait for no standby (the synchronous standby it had
// is the other primary now), so whatever reaches it is written there.
func (p *PGPair) StartOldPrimary(t testing.TB) {
	t.Helper()
	// A killed postmaster stays in the process table until it is reaped,
	// and Postgres will not start while the pid in postmaster.pid exists:
	// wait until pg_ctl status says no server runs (exit status 3).
	Eventually(t, 30*time.Second, "the killed primary's postmaster to be gone", func() bool {
		return p.cmd("pg_ctl", "-D", p.Primary.Data, "status").Run() != nil
	})
	p.start(t, p.Primary, "-c synchronous_standby_names=''", "primary")
}

// OnNode is dbURL with its hosts replaced by n alone and no
// target_session_attrs: a connection to that server whatever it is.
func OnNode(t testing.TB, dbURL string, n PGNode) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.Host = n.Addr()
	q := u.Query()
	q.Del("target_session_attrs")
	u.RawQuery = q.Encode()
	return u.String()
}

// DBOnNode is db on n alone (OnNode), with a pool of its own closed when the
// test ends: for reading one server of a pair that may have split.
func DBOnNode(t testing.TB, db DB, n PGNode) DB {
	t.Helper()
	on := DB{Name: db.Name, URL: OnNode(t, db.URL, n)}
	var err error
	on.Pool, err = pgxpool.New(context.Background(), on.URL)
	require.NoError(t, err)
	t.Cleanup(on.Pool.Close)
	return on
}

// TerminateSessions ends db's sessions named application (a replica's pool
// is "wlproj:<worker id>"), as a server restart or an idle timeout would,
// and fails the test when there is none.
func TerminateSessions(t testing.TB, db DB, application string) {
	t.Helper()
	require.Positive(t, db.Int(t, `
		SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
		application), "no session named %s", application)
}
