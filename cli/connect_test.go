package cli

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// With several hosts in DATABASE_URL, status names the one it reached, not
// the first of the list (after a failover, the first is the dead primary).
func TestDatabaseTargetIsTheHostReached(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	closed, err := harness.FreePort()
	require.NoError(t, err)
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	reached := u.Host
	u.Host = "127.0.0.1:" + strconv.Itoa(closed) + "," + reached
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()

	conn, err := connect(context.Background(), u.String())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.Equal(t, cfg.Host+":"+strconv.Itoa(int(cfg.Port))+"/"+db.Name, databaseTarget(conn))
	require.False(t, strings.Contains(databaseTarget(conn), strconv.Itoa(closed)))
}

func TestConnectRefusesSeveralHostsWithoutReadWrite(t *testing.T) {
	t.Parallel()
	_, err := connect(context.Background(), "postgres://u@127.0.0.1:1,127.0.0.1:2/db")
	require.ErrorContains(t, err, "DATABASE_URL: names 2 hosts (127.0.0.1:1, 127.0.0.1:2) but not target_session_attrs=read-write")
	require.Equal(t, exitUsage, codeOf(err), "bad input, nothing tried")
}
