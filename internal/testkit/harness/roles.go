package harness

import (
	"context"
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

// RolesSQL is one run of deploy/sql/roles.sql with psql, exactly as the
// header of the file says, as the admin of AdminURL for database DBName.
type RolesSQL struct {
	Psql, Root, AdminURL, DBName   string
	Owner, Runtime                 string
	OwnerPassword, RuntimePassword string
}

// Apply runs it and returns psql's output.
func (r RolesSQL) Apply(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, r.Psql, "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-v", "dbname="+r.DBName, "-v", "owner_role="+r.Owner, "-v", "runtime_role="+r.Runtime,
		"-v", "owner_password="+r.OwnerPassword, "-v", "runtime_password="+r.RuntimePassword,
		"-f", filepath.Join(r.Root, "deploy", "sql", "roles.sql"), r.AdminURL)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ApplyRoles is RolesSQL.Apply for tests, with the stack's psql and the
// passwords OwnerPassword and RuntimePassword.
func ApplyRoles(t testing.TB, adminURL, dbname, owner, runtime string) (string, error) {
	t.Helper()
	return RolesSQL{Psql: psql(t), Root: Root(t), AdminURL: adminURL, DBName: dbname, Owner: owner, Runtime: runtime,
		OwnerPassword: OwnerPassword, RuntimePassword: RuntimePassword}.Apply(context.Background())
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
