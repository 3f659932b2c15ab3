package harness

import (
	"context"
	"fmt"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/migrations"
)

// DB is a database of a test or run's own, with a pool logged in as the admin.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// CreateEmptyDatabase creates name, with no schema, on the admin's server
// and returns its URL.
func CreateEmptyDatabase(ctx context.Context, adminURL, name string) (string, error) {
	return createDatabase(ctx, adminURL, name, "")
}

// createDatabase creates name as a copy of template (template1, Postgres'
// default, when empty) and returns its URL.
func createDatabase(ctx context.Context, adminURL, name, template string) (string, error) {
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", fmt.Errorf("admin database URL: %w", err)
	}
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		create += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := adminExec(ctx, adminURL, create); err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// CreateDatabase creates name with the outbox schema applied.
func CreateDatabase(ctx context.Context, adminURL, name string) (string, error) {
	dbURL, err := CreateEmptyDatabase(ctx, adminURL, name)
	if err != nil {
		return "", err
	}
	if _, err := migrations.Up(ctx, dbURL, migrations.Expect{Database: name}); err != nil {
		return "", err
	}
	return dbURL, nil
}

// DropDatabase drops name, ending its sessions; a missing one is no error.
func DropDatabase(ctx context.Context, adminURL, name string) error {
	return adminExec(ctx, adminURL, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// DropRoles drops the roles, in order; missing or empty names are no
// error. A role that owns objects cannot be dropped: drop its database first.
func DropRoles(ctx context.Context, adminURL string, roles ...string) error {
	var stmts []string
	for _, r := range roles {
		if r != "" {
			stmts = append(stmts, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize())
		}
	}
	if len(stmts) == 0 {
		return nil
	}
	return adminExec(ctx, adminURL, stmts...)
}

func adminExec(ctx context.Context, adminURL string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// NewEmptyDatabase is CreateEmptyDatabase for tests: a database of the
// test's own, dropped when it ends.
func NewEmptyDatabase(t testing.TB) DB {
	t.Helper()
	return newDatabase(t, CreateEmptyDatabase)
}

// NewDatabase is a migrated database of the test's own, dropped when it
// ends: a copy of the migrated template (copyMigratedDatabase).
func NewDatabase(t testing.TB) DB {
	t.Helper()
	return newDatabase(t, copyMigratedDatabase)
}

func newDatabase(t testing.TB, create func(context.Context, string, string) (string, error)) DB {
	t.Helper()
	ctx := context.Background()
	admin := AdminDatabaseURL(t)
	db := DB{Name: UniqueName("wlproj_t_")}
	// Registered first so it runs last: after the pool is closed.
	t.Cleanup(func() {
		if err := DropDatabase(context.Background(), admin, db.Name); err != nil {
			t.Logf("drop database %s: %v", db.Name, err)
		}
	})
	var err error
	db.URL, err = create(ctx, admin, db.Name)
	require.NoError(t, err)
	db.Pool, err = pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(db.Pool.Close)
	return db
}

// Roles returns an owner and a runtime role name of the test's own (roles
// are cluster-wide), tagged for whoever finds them left over. They are
// dropped when the test ends, after any database the test creates later.
func Roles(t testing.TB, tag string) (owner, runtime string) {
	t.Helper()
	suffix := UniqueName("")
	owner, runtime = "wlproj_owner_"+tag+"_"+suffix, "wlproj_runtime_"+tag+"_"+suffix
	admin := AdminDatabaseURL(t)
	t.Cleanup(func() {
		if err := DropRoles(context.Background(), admin, runtime, owner); err != nil {
			t.Logf("drop roles: %v", err)
		}
	})
	return owner, runtime
}

// Login is the database's URL logged in as user with password.
func (db DB) Login(t testing.TB, user, password string) string {
	t.Helper()
	u, err := UserURL(db.URL, user, password)
	require.NoError(t, err)
	return u
}

// Exec runs sql on the database and fails the test on an error.
func (db DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// Int is the single integer sql returns.
func (db DB) Int(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Count is the number of outbox events matching where, as the operator's
// view shows them (outbox_event_states: a queued row's status is its
// position's).
func (db DB) Count(t testing.TB, where string, args ...any) int {
	t.Helper()
	return db.Int(t, `SELECT count(*) FROM outbox_event_states WHERE `+where, args...)
}
