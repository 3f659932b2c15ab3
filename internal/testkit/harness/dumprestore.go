package harness

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// RestoreInto copies database src, as pg_dump writes it and psql reads it
// back (no owners, no grants: the roles are the old cluster's), into a
// new database of p's primary, dropped with the pair: what an operator
// does to move a database to another cluster. Every row is written anew
// by the restore's own transactions; triggers are created after the data,
// as pg_dump orders them.
func (p *PGPair) RestoreInto(t testing.TB, src DB) DB {
	t.Helper()
	return p.Restore(t, p.Dump(t, src))
}

// Dump writes src with pg_dump into a file of p's directory, as
// RestoreInto reads it, and returns its path: what src is at this moment,
// and nothing written to it afterwards.
func (p *PGPair) Dump(t testing.TB, src DB) string {
	t.Helper()
	dump := filepath.Join(p.dir, UniqueName("dump_")+".sql")
	p.run(t, "pg_dump", "--no-owner", "--no-privileges", "--file", dump, "--dbname", src.URL)
	return dump
}

// Restore reads a file of Dump's into a new database of p's primary,
// dropped with the pair, with a superuser's pool on it.
func (p *PGPair) Restore(t testing.TB, dump string) DB {
	t.Helper()
	ctx := context.Background()
	db := DB{Name: UniqueName("wlproj_r_")}
	var err error
	db.URL, err = CreateEmptyDatabase(ctx, p.nodeURL(p.Primary), db.Name)
	require.NoError(t, err)
	p.run(t, "psql", "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "--file", dump, "--dbname", db.URL)
	db.Pool, err = pgxpool.New(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(db.Pool.Close)
	return db
}
