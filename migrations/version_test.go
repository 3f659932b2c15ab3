package migrations_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// reviewedThrough is the newest migration someone has weighed against
// RequiredVersion.
const reviewedThrough = 30

// A new migration file makes this fail until its author has decided whether
// this binary's SQL needs it, so RequiredVersion cannot silently fall behind
// what the claim, the ack or the reclaimer read.
func TestRequiredVersionReviewed(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(reviewedThrough), migrations.HeadVersion(),
		"migration %d is new: if this binary's SQL uses what it adds (a column, a table, an index its plans rely on), "+
			"raise migrations.RequiredVersion to it; then set reviewedThrough to it", migrations.HeadVersion())
	require.Positive(t, migrations.RequiredVersion)
	require.LessOrEqual(t, migrations.RequiredVersion, migrations.HeadVersion(),
		"a binary that needs a migration it does not carry could never lead")
}

// SchemaVersion reads what wlproj migrate applied: nothing on a fresh
// database, the target of a migration stopped at a version, the head after
// a full one.
func TestSchemaVersion(t *testing.T) {
	t.Parallel()
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()
	want := migrations.Expect{Database: db.Name}

	s, err := migrations.SchemaVersion(ctx, db.Pool)
	require.NoError(t, err, "a database never migrated has no goose table: version 0")
	require.Equal(t, migrations.Schema{Database: db.Name, Version: 0}, s)

	older := migrations.RequiredVersion - 1
	res, err := migrations.Run(ctx, db.URL, want, migrations.Config{UpTo: older}, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, older, res.Current)
	s, err = migrations.SchemaVersion(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, older, s.Version)

	res, err = migrations.Up(ctx, db.URL, want)
	require.NoError(t, err)
	require.Equal(t, migrations.HeadVersion(), res.Current)
	s, err = migrations.SchemaVersion(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrations.HeadVersion(), s.Version)
}
