package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Passwords ApplyRoles gives the roles of deploy/sql/roles.sql.
const (
	OwnerPassword   = "owner-pw"
	RuntimePassword = "runtime-pw"
)

// ApplyRoles runs deploy/sql/roles.sql with psql exactly as the header of
// the file says, as the admin of adminURL, for database dbname; it returns
// psql's output.
func ApplyRoles(t testing.TB, adminURL, dbname, owner, runtime string) (string, error) {
	t.Helper()
	cmd := exec.Command(psql(t), "-X", "-v", "ON_ERROR_STOP=1",
		"-v", "dbname="+dbname, "-v", "owner_role="+owner, "-v", "runtime_role="+runtime,
		"-v", "owner_password="+OwnerPassword, "-v", "runtime_password="+RuntimePassword,
		"-f", filepath.Join(Root(t), "deploy", "sql", "roles.sql"), adminURL)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// psql is the stack's psql, else the one on PATH.
func psql(t testing.TB) string {
	if dir := StackEnv(t)["STACK_PG_BINDIR"]; dir != "" {
		p := filepath.Join(dir, "psql")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("psql")
	require.NoError(t, err, "psql is needed to apply roles.sql")
	return p
}
