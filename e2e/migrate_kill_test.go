package e2e

// Process tests of `wlproj migrate` killed with kill -9. The server session
// of an index build outlives its client: the server must end it when it can
// tell the client is gone, and a rerun must end it rather than race it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
)

// migrateProc is one `wlproj migrate` process, started as an operator would.
type migrateProc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

func startMigrate(t *testing.T, dbURL string, args ...string) *migrateProc {
	t.Helper()
	m := &migrateProc{done: make(chan struct{})}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	args = append([]string{"migrate", "--database-url", dbURL, "--expect-db", strings.TrimPrefix(u.Path, "/")}, args...)
	m.cmd = exec.Command(harness.Binary(t), args...)
	m.cmd.Env = os.Environ()
	m.cmd.Stdout, m.cmd.Stderr = &m.out, &m.out
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, m.cmd.Start())
	go func() { _ = m.cmd.Wait(); close(m.done) }()
	t.Cleanup(m.kill)
	return m
}

func (m *migrateProc) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// kill is kill -9; it returns once the process is gone.
func (m *migrateProc) kill() {
	_ = m.cmd.Process.Kill()
	<-m.done
}

// wait returns the exit code and output, failing the test after timeout.
func (m *migrateProc) wait(t *testing.T, timeout time.Duration) (int, string) {
	t.Helper()
	select {
	case <-m.done:
		return m.cmd.ProcessState.ExitCode(), m.out.String()
	case <-time.After(timeout):
		m.kill()
		t.Fatalf("wlproj migrate still running after %s:\n%s", timeout, m.out.String())
		return 0, ""
	}
}

// withParam is dbURL with one more query parameter: a setting for the
// sessions it opens.
func withParam(t *testing.T, dbURL, name, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// dueIndex is the index 00016 builds CONCURRENTLY on outbox_events.
const dueIndex = "outbox_events_due_idx"

// midBuild is a database whose wlproj migrate was killed while one of its
// builds waited for an application's old snapshot.
type midBuild struct {
	db      harness.DB
	app     pgx.Tx // the REPEATABLE READ transaction the build waits for
	builder int    // the killed migrate's building session
}

// buildKill says where killMidBuild kills the migrate.
type buildKill struct {
	from    int64                   // the schema version the migrate starts from
	prepare string                  // SQL run before it, if any
	index   string                  // the index whose build it is killed in
	dbURL   func(harness.DB) string // the URL it is given
}

// killMidBuild starts wlproj migrate while an application transaction holds
// a snapshot (as a pg_dump does, or a standby did when it waited in one
// statement), waits until the build of k.index waits for it in its last
// phase, and kills the migrate there.
func killMidBuild(t *testing.T, k buildKill) midBuild {
	t.Helper()
	ctx := context.Background()
	s := midBuild{db: databaseAt(t, k.from)}
	s.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT 'book', g::text, 'upsert', 1, '{"title": "t"}' FROM generate_series(1, 10000) g`)
	if k.prepare != "" {
		s.db.Exec(t, k.prepare)
	}
	app, err := pgx.Connect(ctx, s.db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { app.Close(context.Background()) })
	s.app, err = app.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = s.app.Exec(ctx, `SELECT count(*) FROM outbox_leader`)
	require.NoError(t, err)

	m := startMigrate(t, k.dbURL(s.db))
	harness.Eventually(t, 30*time.Second, "the build waiting for the application's snapshot", func() bool {
		s.builder = s.db.Int(t, `SELECT coalesce(max(pid), 0) FROM pg_stat_progress_create_index
			WHERE index_relid = to_regclass($1) AND phase = 'waiting for old snapshots'`, k.index)
		return s.builder != 0
	})
	require.Zero(t, s.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_xmin IS NOT NULL`, s.builder),
		"the build holds no snapshot of its own while it waits")
	m.kill()
	return s
}

// unchecked is db's URL with the server's check for a client gone off.
func unchecked(t *testing.T) func(harness.DB) string {
	return func(db harness.DB) string { return withParam(t, db.URL, "client_connection_check_interval", "0") }
}

func (s midBuild) alive(t *testing.T, pid int) bool {
	return s.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) > 0
}

// vacuumOutbox runs VACUUM of outbox_events, giving up on its lock after
// wait: nil when no session holds it off.
func vacuumOutbox(db harness.DB, wait time.Duration) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`, wait.String()); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `VACUUM outbox_events`)
	return err
}

// migrated checks that the rerun left head applied, the index valid and no
// session of wlproj migrate behind, and that VACUUM of the outbox runs.
func (s midBuild) migrated(t *testing.T) {
	t.Helper()
	require.Equal(t, 1, s.db.Int(t, `SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass($1) AND indisvalid`, dueIndex))
	require.Zero(t, s.db.Int(t, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid`), "no INVALID index left")
	harness.Eventually(t, 10*time.Second, "no session of wlproj migrate left", func() bool {
		return s.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
			migrations.ApplicationName) == 0
	})
	require.NoError(t, vacuumOutbox(s.db, 2*time.Second), "VACUUM of the outbox is held off")
}

// TestMigrateRerunEndsOrphanedBuild: a killed migrate's build goes on
// waiting when the server cannot tell its client is gone (a server older
// than 14, or a host that vanished before its keepalives fire; here the
// connection check is off in the URL), holding off VACUUM of the outbox.
// The rerun terminates it rather than racing it with DROP INDEX
// CONCURRENTLY ("tuple concurrently updated"), then builds the index.
func TestMigrateRerunEndsOrphanedBuild(t *testing.T) {
	t.Parallel()
	s := killMidBuild(t, buildKill{from: 15, index: dueIndex, dbURL: unchecked(t)})
	time.Sleep(2 * time.Second)
	require.True(t, s.alive(t, s.builder), "the orphaned build outlives its client")
	var pgErr *pgconn.PgError
	err := vacuumOutbox(s.db, 500*time.Millisecond)
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "55P03", "the orphan holds VACUUM of the outbox off: %v", err)

	rerun := startMigrate(t, s.db.URL)
	harness.Eventually(t, 30*time.Second, "the rerun ending the orphaned build", func() bool { return !s.alive(t, s.builder) })
	// The rerun's own build waits for the application's snapshot, as any
	// build must; it ends once the application does.
	require.NoError(t, s.app.Rollback(context.Background()))
	code, out := rerun.wait(t, 2*time.Minute)
	require.Zero(t, code, out)
	t.Logf("rerun:\n%s", out)
	s.migrated(t)
}

// TestMigrateRerunEndsOrphanedBuildOfLaterStatement: 00008 builds two
// indexes on outbox_events; the migrate is killed in the second build. The
// rerun runs the file from its start, and its first statement, though its
// index is built, waits for the table's lock, which the orphaned second
// build holds: the rerun ends the orphan before its first statement.
func TestMigrateRerunEndsOrphanedBuildOfLaterStatement(t *testing.T) {
	t.Parallel()
	s := killMidBuild(t, buildKill{from: 7, index: "outbox_events_failed_error_idx", dbURL: unchecked(t),
		prepare: `CREATE INDEX outbox_events_failed_time_idx ON outbox_events (updated_at, id) WHERE status = 'failed'`})
	rerun := startMigrate(t, s.db.URL)
	harness.Eventually(t, 30*time.Second, "the rerun ending the orphaned build", func() bool { return !s.alive(t, s.builder) })
	require.NoError(t, s.app.Rollback(context.Background()))
	code, out := rerun.wait(t, 2*time.Minute)
	require.Zero(t, code, out)
	s.migrated(t)
}

// TestMigrateKilledBuildEndsOnItsOwn: with client_connection_check_interval
// on migrate's sessions, the server ends a killed migrate's build within
// about a second, while the snapshot it waited for is still held: VACUUM of
// the outbox runs again, and the rerun builds the index.
func TestMigrateKilledBuildEndsOnItsOwn(t *testing.T) {
	t.Parallel()
	s := killMidBuild(t, buildKill{from: 15, index: dueIndex, dbURL: func(db harness.DB) string { return db.URL }})
	killed := time.Now()
	harness.Eventually(t, 10*time.Second, "the server ending the killed migrate's build", func() bool { return !s.alive(t, s.builder) })
	t.Logf("the orphaned build ended %s after the kill", time.Since(killed).Round(time.Millisecond))
	require.NoError(t, vacuumOutbox(s.db, 2*time.Second), "VACUUM of the outbox is held off")

	require.NoError(t, s.app.Rollback(context.Background()))
	code, out := startMigrate(t, s.db.URL).wait(t, 2*time.Minute)
	require.Zero(t, code, out)
	s.migrated(t)
}

// TestMigrateKilledAnywhereRerunSucceeds: kill -9 of wlproj migrate at
// random points of a migration from version 3 over a full outbox (the
// ledger's paged data move, the CONCURRENTLY builds, the ALTERs, goose's
// bookkeeping), half of the runs with the server's connection check off so
// that their statements outlive them; then one run to the end. It
// succeeds, and leaves the schema and ledger of a migration never killed.
func TestMigrateKilledAnywhereRerunSucceeds(t *testing.T) {
	t.Parallel()
	killed, straight := outboxAtV3(t), outboxAtV3(t)
	_, err := migrations.Up(context.Background(), straight.URL, migrations.Expect{Database: straight.Name})
	require.NoError(t, err)

	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, seed))
	// Each run is killed a little after it has applied a version drawn at
	// random from those still to apply (or at once): the kills land in every
	// migration, not only in the longest (00004's data move).
	var runs []string
	head := version(t, straight)
	for i := 0; i < 10 && version(t, killed) < head; i++ {
		now := version(t, killed)
		after, delay := int64(now+rng.IntN(head-now+1)), time.Duration(rng.IntN(40))*time.Millisecond
		dbURL, how := killed.URL, "checked"
		if rng.IntN(2) == 0 {
			dbURL, how = unchecked(t)(killed), "unchecked"
		}
		m := startMigrate(t, dbURL)
		harness.Eventually(t, time.Minute, "the run applying a version", func() bool {
			return m.exited() || int64(version(t, killed)) >= after
		})
		time.Sleep(delay)
		m.kill()
		require.True(t, m.cmd.ProcessState.Success() || m.cmd.ProcessState.ExitCode() == -1,
			"a rerun after a kill failed (runs so far: %s):\n%s", strings.Join(runs, "; "), m.out.String())
		runs = append(runs, fmt.Sprintf("%s, after %d + %s → %d", how, after, delay, version(t, killed)))
	}
	t.Logf("seed %d; killed runs: %s", seed, strings.Join(runs, "; "))
	code, out := startMigrate(t, killed.URL).wait(t, 2*time.Minute)
	require.Zero(t, code, out)
	require.Equal(t, shape(t, straight), shape(t, killed), "the killed migration's schema or ledger differs")
	harness.Eventually(t, 30*time.Second, "no session of wlproj migrate left", func() bool {
		return killed.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
			migrations.ApplicationName) == 0
	})
}

func version(t *testing.T, db harness.DB) int {
	return db.Int(t, `SELECT max(version_id) FROM goose_db_version WHERE is_applied`)
}

// databaseAt is a database of the test's own migrated up to version.
func databaseAt(t *testing.T, version int64) harness.DB {
	t.Helper()
	db := harness.NewEmptyDatabase(t)
	_, err := migrations.Run(context.Background(), db.URL, migrations.Expect{Database: db.Name}, migrations.Config{UpTo: version}, zerolog.Nop())
	require.NoError(t, err)
	return db
}

// outboxAtV3 is a database at version 3 with 60 000 events, the same in
// every call: nine in ten done, a document's versions spread over pages.
func outboxAtV3(t *testing.T) harness.DB {
	t.Helper()
	db := databaseAt(t, 3)
	db.Exec(t, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, status, processed_at)
		SELECT 'book', (g % 15000)::text, CASE WHEN g % 13 = 0 THEN 'delete' ELSE 'upsert' END, g,
		       jsonb_build_object('title', 'book ' || g),
		       CASE WHEN g % 10 = 2 THEN 'pending' ELSE 'done' END,
		       CASE WHEN g % 10 <> 2 THEN timestamptz '2026-01-01' + g * interval '1 second' END
		  FROM generate_series(1, 60000) g`)
	return db
}

// shape is what a migration leaves: the version, the columns, the indexes
// with their validity, the constraints, and the ledger.
func shape(t *testing.T, db harness.DB) []string {
	t.Helper()
	return harness.Column[string](t, db, `
		SELECT 'version ' || max(version_id) FROM goose_db_version WHERE is_applied
		UNION ALL
		SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || coalesce(column_default, '')
		  FROM information_schema.columns WHERE table_schema = current_schema()
		UNION ALL
		SELECT pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid
		  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = current_schema()::regnamespace
		UNION ALL
		SELECT conrelid::regclass || ' ' || pg_get_constraintdef(oid) || ' ' || convalidated
		  FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
		UNION ALL
		SELECT format('ledger %s/%s/%s v=%s del=%s ev=%s at=%s', projection, entity_type, entity_id, version, deleted, event_id, applied_at)
		  FROM outbox_ledger_entries
		ORDER BY 1`)
}
