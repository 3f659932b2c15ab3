package health

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// The schema gauges are process-wide, so these tests are not parallel: Go
// runs them alone, and the gauge is theirs.

// logSink hands the test each log entry (zerolog writes one per Write).
type logSink chan string

func (s logSink) Write(p []byte) (int, error) {
	s <- string(p)
	return len(p), nil
}

// schemaEntries counts the schema check's entries written since the last
// call.
func (s logSink) schemaEntries() int {
	n := 0
	for {
		select {
		case line := <-s:
			if strings.Contains(line, `"service":"schema"`) {
				n++
			}
		default:
			return n
		}
	}
}

func gauge(t *testing.T, name string) float64 {
	t.Helper()
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, false)
	v, ok, err := harness.ParseMetric(buf.String(), name)
	require.NoError(t, err)
	require.True(t, ok, "no %s series", name)
	return v
}

// A replica on a database one migration behind what its binary needs is
// not ready, says which versions and which command, exports both versions,
// logs it once rather than on every read, and turns ready without a
// restart once the database is migrated.
func TestReadyzFailsOnASchemaOlderThanTheBinary(t *testing.T) {
	db := harness.NewEmptyDatabase(t)
	ctx := context.Background()
	want := migrations.Expect{Database: db.Name}
	behind := migrations.RequiredVersion - 1
	_, err := migrations.Run(ctx, db.URL, want, migrations.Config{UpTo: behind}, zerolog.Nop())
	require.NoError(t, err)
	logs := make(logSink, 1000)
	f := startLogging(t, db.Pool, db.URL, func(c *Config) { c.SchemaInterval = 50 * time.Millisecond }, zerolog.New(logs))

	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	require.Equal(t, "ok", r.body.Checks["database"])
	check := r.body.Checks["schema"]
	require.Contains(t, check, fmt.Sprintf("schema version %d, this binary needs %d or newer", behind, migrations.RequiredVersion), "the versions: %s", check)
	require.Contains(t, check, "wlproj migrate --expect-db "+db.Name, "the command: %s", check)
	require.Equal(t, &SchemaStatus{Database: db.Name, Version: behind, Required: migrations.RequiredVersion,
		Newest: migrations.HeadVersion(), Read: true}, r.body.Schema)
	require.False(t, f.srv.SchemaOK())
	require.Equal(t, float64(behind), gauge(t, "outbox_schema_version"))
	require.Equal(t, float64(migrations.RequiredVersion), gauge(t, "outbox_schema_required_version"))

	time.Sleep(300 * time.Millisecond) // six reads
	require.Equal(t, 1, logs.schemaEntries(), "logged once, not per read")

	_, err = migrations.Up(ctx, db.URL, want)
	require.NoError(t, err)
	harness.Eventually(t, 5*time.Second, "ready after the migration, without a restart", func() bool {
		return f.get(f.port, "/readyz").code == http.StatusOK
	})
	require.True(t, f.srv.SchemaOK())
	require.Equal(t, "ok", f.get(f.port, "/readyz").body.Checks["schema"])
	// Ready from a read of any version from RequiredVersion on, which may
	// have seen the migration half way: the head follows.
	harness.Eventually(t, 5*time.Second, "the head version exported", func() bool {
		return gauge(t, "outbox_schema_version") == float64(migrations.HeadVersion())
	})
	time.Sleep(300 * time.Millisecond) // six reads at the head
	require.LessOrEqual(t, logs.schemaEntries(), 1+int(migrations.HeadVersion()-behind),
		"logged once per version seen (a read may catch the migration half way), not per read")
}

// A database newer than the binary is fine: migrations only add.
func TestReadyzAcceptsASchemaNewerThanTheBinary(t *testing.T) {
	db := harness.NewDatabase(t)
	db.Exec(t, `INSERT INTO goose_db_version (version_id, is_applied) VALUES ($1, true)`, migrations.HeadVersion()+1)
	f := start(t, db.Pool, db.URL, nil)
	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusOK, r.code, r.raw)
	require.Equal(t, migrations.HeadVersion()+1, r.body.Schema.Version)
	require.True(t, f.srv.SchemaOK())
}

// A runtime role that cannot read goose's table (roles.sql not applied
// again after the upgrade that needs the grant) cannot tell its schema:
// not ready, saying what to do, and no leadership.
func TestReadyzNamesTheMissingGrant(t *testing.T) {
	_, runtime := harness.Roles(t, "h")
	db := harness.NewDatabase(t)
	db.Exec(t, `CREATE ROLE `+pgx.Identifier{runtime}.Sanitize()+` LOGIN PASSWORD '`+harness.RuntimePassword+`'`)
	url := db.Login(t, runtime, harness.RuntimePassword)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := start(t, pool, url, nil)

	r := f.get(f.port, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
	check := r.body.Checks["schema"]
	require.Contains(t, check, "permission denied", check)
	require.Contains(t, check, "needs SELECT on goose_db_version: apply roles.sql again", check)
	require.False(t, f.srv.SchemaOK())
}

// The elector's verdict is no older than schemaFreshFor, whatever the
// schedule: a standby about to lead during a rollback reads the version
// again rather than lead on a reading taken before the rollback began (it
// led on a schema its claim refused, from a reading 5 s old).
func TestSchemaOKReadsAgainBeforeLeading(t *testing.T) {
	db := harness.NewDatabase(t)
	f := start(t, db.Pool, db.URL, func(c *Config) { c.SchemaInterval = time.Hour })
	harness.Eventually(t, 5*time.Second, "the first reading", f.srv.SchemaOK)
	db.Exec(t, `DELETE FROM goose_db_version WHERE version_id >= $1`, migrations.RequiredVersion)
	// The reading is kept fresh in the background too (twice a second,
	// whatever SchemaInterval), so whether the next call still says yes
	// depends on the schedule; after schemaFreshFor it cannot.
	time.Sleep(schemaFreshFor + 100*time.Millisecond)
	require.False(t, f.srv.SchemaOK(), "read again: the schema was rolled back under it")
	require.Equal(t, float64(migrations.RequiredVersion-1), gauge(t, "outbox_schema_version"))
}

// Before its first migration a database has none of the tables /readyz and
// the gauges read beside the schema check: the schema check is the
// not-ready reason, logged once, and no probe adds a warning of its own.
func TestReadyzOnAnUnmigratedDatabaseWarnsNothingPerProbe(t *testing.T) {
	db := harness.NewEmptyDatabase(t)
	logs := make(logSink, 1000)
	f := startWith(t, db.Pool, db.URL, func(c *Config) { c.SchemaInterval = 50 * time.Millisecond },
		zerolog.New(logs), Deps{ProjectionsHash: "aaaa1111", LeaderName: "wlproj"})

	for range 5 {
		r := f.get(f.port, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, r.code, r.raw)
		require.Equal(t, "ok", r.body.Checks["database"])
		require.Contains(t, r.body.Checks["schema"], "wlproj migrate --expect-db "+db.Name, "the reason and the fix")
		time.Sleep(100 * time.Millisecond)
	}
	var warnings []string
	for {
		select {
		case line := <-logs:
			if strings.Contains(line, `"level":"warn"`) {
				warnings = append(warnings, line)
			}
			continue
		default:
		}
		break
	}
	require.Empty(t, warnings, "no warning per probe while unmigrated")
}
