// Package sql holds the least-privilege SQL for wlproj's roles; its test
// applies roles.sql with psql, as an operator would, and checks what each
// role can and cannot do.
package sql

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/migrations"
	"github.com/wlproj/wlproj/replay"
)

const insufficientPrivilege = "42501"

type bundle struct {
	db         harness.DB
	owner      string
	runtime    string
	ownerURL   string
	runtimeURL string
}

// setup creates two roles with unique names (roles are cluster-wide and
// tests run in parallel) and a fresh database, and drops all three at the end.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{}
	// Before the database, so the roles are dropped after it: a role that
	// still owns objects cannot be dropped.
	b.owner, b.runtime = harness.Roles(t, "t")
	b.db = harness.NewEmptyDatabase(t)
	b.ownerURL = b.db.Login(t, b.owner, harness.OwnerPassword)
	b.runtimeURL = b.db.Login(t, b.runtime, harness.RuntimePassword)
	return b
}

// applyRoles runs roles.sql as the admin connected to the test database.
func (b *bundle) applyRoles(t *testing.T, dbname string) (string, error) {
	t.Helper()
	return harness.ApplyRoles(t, b.db.URL, dbname, b.owner, b.runtime)
}

func (b *bundle) mustApplyRoles(t *testing.T) {
	t.Helper()
	out, err := b.applyRoles(t, b.db.Name)
	require.NoError(t, err, out)
}

func TestRolesBeforeFirstMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.mustApplyRoles(t)
	// The owner can apply the schema itself, with no superuser involved.
	_, err := migrations.Up(context.Background(), b.ownerURL, migrations.Expect{Database: b.db.Name})
	require.NoError(t, err)
	b.mustApplyRoles(t)
	b.mustApplyRoles(t) // idempotent
	b.check(t)
}

func TestRolesAfterAdminMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := migrations.Up(context.Background(), b.db.URL, migrations.Expect{Database: b.db.Name})
	require.NoError(t, err)
	b.mustApplyRoles(t)
	// From now on the owner migrates: a re-run finds goose's table its own.
	_, err = migrations.Up(context.Background(), b.ownerURL, migrations.Expect{Database: b.db.Name})
	require.NoError(t, err)
	b.check(t)
}

func TestRolesRefuseAnotherDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, err := b.applyRoles(t, "not_"+b.db.Name)
	require.Error(t, err)
	require.Contains(t, out, "nothing was changed")
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2)`, b.owner, b.runtime).Scan(&n))
	require.Zero(t, n)
}

// check proves the split: the owner owns the outbox, the runtime role drains
// it as a real replica would and can change nothing else.
func (b *bundle) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var tableOwner, funcOwner string
	var hasPassword, superuser bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		SELECT pg_get_userbyid(c.relowner), pg_get_userbyid(p.proowner),
		       a.rolpassword IS NOT NULL, a.rolsuper
		  FROM pg_class c, pg_proc p, pg_authid a
		 WHERE c.oid = 'outbox_events'::regclass
		   AND p.oid = 'outbox_append_error(jsonb, jsonb, integer)'::regprocedure
		   AND a.rolname = $1`, b.runtime).Scan(&tableOwner, &funcOwner, &hasPassword, &superuser))
	require.Equal(t, b.owner, tableOwner)
	require.Equal(t, b.owner, funcOwner)
	require.True(t, hasPassword, "runtime_password was applied")
	require.False(t, superuser)
	// The queue's objects too: a view reads its tables with its owner's
	// rights, so one left to an admin would read as a superuser.
	require.Equal(t, []string{b.owner}, harness.Column[string](t, b.db, `
		SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class
		 WHERE oid IN ('outbox_positions'::regclass, 'outbox_queue_origin'::regclass,
		               'outbox_done_by_minute'::regclass, 'outbox_event_states'::regclass,
		               'outbox_queue_heads'::regclass, 'outbox_queue_backlog'::regclass)
		UNION
		SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc
		 WHERE oid IN ('outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint)'::regprocedure,
		               'outbox_queue_backlog_rows(bigint)'::regprocedure)`))

	b.drainAsRuntime(t)
	b.archiveAsRuntime(t)
	b.rotateAsRuntime(t)

	conn, err := pgx.Connect(ctx, b.runtimeURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var user string
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_user`).Scan(&user))
	require.Equal(t, b.runtime, user)
	schema, err := migrations.SchemaVersion(ctx, conn)
	require.NoError(t, err, "the runtime role reads the schema version, which a replica needs to lead")
	require.Equal(t, migrations.HeadVersion(), schema.Version)
	for _, stmt := range deniedToRuntime(b.owner) {
		_, err := conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want insufficient_privilege, got %v", stmt, err)
		require.Equal(t, insufficientPrivilege, pgErr.Code, "%s: %s", stmt, pgErr.Message)
	}
}

// deniedToRuntime are statements the runtime role must be refused: DDL,
// writes to the event columns, to the audit, to what only an operator or
// a migration changes, and becoming the owner.
func deniedToRuntime(owner string) []string {
	return []string{
		`DROP TABLE outbox_events`,
		`ALTER TABLE outbox_events ADD COLUMN pwned int`,
		`ALTER TABLE outbox_events DROP CONSTRAINT outbox_events_status_check`,
		`ALTER TABLE outbox_events DISABLE TRIGGER outbox_events_notify`,
		`TRUNCATE outbox_events`,
		`INSERT INTO outbox_events (entity_type, entity_id, op) VALUES ('book', 'x', 'upsert')`,
		`UPDATE outbox_events SET payload = '{}'`,
		`UPDATE outbox_events SET entity_id = 'x'`,
		`CREATE TABLE pwned (id int)`,
		`CREATE TABLE public.pwned (id int)`,
		`CREATE SCHEMA pwned`,
		`CREATE INDEX pwned ON outbox_events (id)`,
		`DROP TABLE outbox_leader`,
		`TRUNCATE outbox_leader`,
		`DELETE FROM outbox_leader`,
		`TRUNCATE outbox_replay_audit`,
		`UPDATE outbox_replay_audit SET reason = 'rewritten'`,
		`DELETE FROM outbox_replay_audit`,
		`UPDATE outbox_dead_letter SET payload = '{}'`,
		`TRUNCATE outbox_dead_letter`,
		`DROP TABLE outbox_dead_letter`,
		`INSERT INTO outbox_projection_state (projection, paused, changed_by, why) VALUES ('search', true, 'x', 'y')`,
		`UPDATE outbox_projection_state SET paused = false`,
		`DELETE FROM outbox_projection_state`,
		`UPDATE chronicle_events SET payload = '{}'`,
		`DELETE FROM chronicle_events`,
		`TRUNCATE chronicle_events`,
		`DROP FUNCTION outbox_append_error(jsonb, jsonb, integer)`,
		`CREATE OR REPLACE FUNCTION outbox_append_error(history jsonb, entry jsonb, keep integer) RETURNS jsonb LANGUAGE sql AS 'SELECT history'`,
		`DROP TRIGGER outbox_events_notify ON outbox_events`,
		`INSERT INTO goose_db_version (version_id, is_applied) VALUES (999, true)`,
		`UPDATE goose_db_version SET version_id = 999`,
		`DELETE FROM goose_db_version`,
		`DELETE FROM outbox_positions`,
		`TRUNCATE outbox_positions`,
		`INSERT INTO outbox_queue_origin (snapshot) VALUES (pg_current_snapshot())`,
		`UPDATE outbox_queue_origin SET snapshot = pg_current_snapshot()`,
		`DELETE FROM outbox_queue_origin`,
		`TRUNCATE outbox_done_by_minute`,
		`DROP VIEW outbox_event_states`,
		`CREATE OR REPLACE VIEW outbox_queue_heads AS SELECT 1 AS projection`,
		`DROP FUNCTION outbox_behind(xid8, bigint, pg_snapshot, pg_snapshot, xid8, bigint)`,
		`SET ROLE ` + pgx.Identifier{owner}.Sanitize(),
	}
}

// drainAsRuntime runs the real binary as the runtime role: it takes the lock,
// bumps the epoch, reads the queued rows by position and saves it, claims
// the pending ones (reading the paused projections), appends to the
// chronicle, acks done and failed (outbox_append_error); then a replay as
// the runtime role writes an audit row, as auto-replay does. The chronicle
// rows are inserted pending so that both paths run as the runtime role: a
// retried or replayed row is claimed.
func (b *bundle) drainAsRuntime(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	index := harness.NewIndex(t)

	// Producers are not the runtime role: the admin writes the events.
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT 'book', e::text, 'upsert', v, jsonb_build_object('kind', 'book', 'title', 'Book ' || e || ' v' || v)
		  FROM generate_series(1, 5) e, generate_series(1, 4) v;
		INSERT INTO outbox_events (projection, status, entity_type, entity_id, op, payload)
		SELECT 'chronicle', 'pending', 'book', e::text, 'upsert', '{"event": "opened"}' FROM generate_series(1, 3) e`)
	require.NoError(t, err)
	var bad int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		INSERT INTO outbox_events (entity_type, entity_id, op, payload) VALUES ('book', 'bad', 'upsert', '[1]')
		RETURNING id`).Scan(&bad))

	r := harness.StartReplica(t, "rt", harness.ReplicaEnv(b.runtimeURL, harness.ElasticURL(t), index, "OUTBOX_POLL_INTERVAL_SECONDS=0.2"))
	harness.Healthy(t, r)
	harness.Drained(t, b.db.Pool, 30*time.Second) // as the runtime role
	// Queued rows are done by position and keep no owner: the position says
	// rt saved it. The claimed chronicle rows were acked by rt row by row.
	var queued, claimed, failed int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE s.status = 'done' AND s.queued AND p.saved_by = 'rt'),
		       count(*) FILTER (WHERE s.status = 'done' AND NOT s.queued AND s.locked_by = 'rt'),
		       count(*) FILTER (WHERE s.status = 'failed' AND s.error_reason = 'payload_invalid'
		                        AND jsonb_array_length(s.error_history) = 1)
		  FROM outbox_event_states s LEFT JOIN outbox_positions p USING (projection)`).Scan(&queued, &claimed, &failed))
	require.Equal(t, 20, queued)
	require.Equal(t, 3, claimed)
	require.Equal(t, 1, failed)
	require.Equal(t, 3, b.db.Int(t, `SELECT count(*) FROM chronicle_events`), "the chronicle appended as the runtime role")
	require.NotContains(t, r.Logs(), "permission denied")

	pool, err := pgxpool.New(ctx, b.runtimeURL)
	require.NoError(t, err)
	defer pool.Close()
	rep, err := replay.Replay(ctx, pool, replay.Request{IDs: []int64{bad}, By: "roles-test", Why: "prove the grants"})
	require.NoError(t, err)
	require.NotZero(t, rep.AuditID)
	harness.Drained(t, b.db.Pool, 30*time.Second) // the replayed event fails again

	// Stop before verifying, so the replica's graceful exit (release of the
	// lock as the runtime role) is part of what passes.
	require.NoError(t, r.Signal(syscall.SIGTERM))
	code, err := r.ExitCode(15 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, r.Logs())
	harness.Verified(t, b.db.Pool, index, harness.Failure{ID: bad, Reason: "payload_invalid"})
}

// archiveAsRuntime proves what the runtime role needs beyond the drain: it
// discards and archives the failed row (the CLI's failed discard and failed
// archive), and deletes done rows as the leader's pruner will. Bringing a
// row back inserts an event, which only the owner may do.
func (b *bundle) archiveAsRuntime(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, b.runtimeURL)
	require.NoError(t, err)
	defer pool.Close()
	var bad int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM outbox_events WHERE status = 'failed'`).Scan(&bad))

	audit := replay.Request{IDs: []int64{bad}, By: "roles-test", Why: "prove the grants"}
	_, err = replay.Discard(ctx, pool, audit)
	require.NoError(t, err)
	rep, err := replay.Archive(ctx, pool, replay.ArchiveRequest{OlderThan: time.Nanosecond, By: audit.By, Why: audit.Why})
	require.NoError(t, err)
	require.Equal(t, []int64{bad}, rep.IDs())
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_dead_letter WHERE id = $1 AND status = 'discarded'`, bad))

	_, err = replay.Restore(ctx, pool, audit)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "restore as the runtime role: want insufficient_privilege, got %v", err)
	require.Equal(t, insufficientPrivilege, pgErr.Code)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_dead_letter WHERE id = $1`, bad), "nothing restored")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // only to see that the pruner may delete
	// Both pruners' deletes: done rows, claimed or queued (found by the
	// view, as the pruner finds them by position), and the acks' minutes.
	tag, err := tx.Exec(ctx, `DELETE FROM outbox_events WHERE id IN (SELECT id FROM outbox_event_states WHERE status = 'done')`)
	require.NoError(t, err)
	require.EqualValues(t, 23, tag.RowsAffected())
	tag, err = tx.Exec(ctx, `DELETE FROM outbox_done_by_minute`)
	require.NoError(t, err)
	require.NotZero(t, tag.RowsAffected(), "the checkpoints counted the queued acks by minute")
}

// rotateAsRuntime runs the real binary as the runtime role with a
// retention of a second: its leader's first pruner round rotates both the
// outbox and the ledger (each current partition was written for more than
// half a retention), with no rotation error counted and no permission
// denied logged.
func (b *bundle) rotateAsRuntime(t *testing.T) {
	t.Helper()
	index := harness.NewIndex(t)
	r := harness.StartReplica(t, "rot", harness.ReplicaEnv(b.runtimeURL, harness.ElasticURL(t), index,
		"OUTBOX_RETENTION=1s", "OUTBOX_LEDGER_TOMBSTONE_RETENTION=1s"))
	harness.Healthy(t, r)
	harness.Eventually(t, 30*time.Second, "both tables rotated by the runtime role", func() bool {
		events, _, err1 := r.Metric("outbox_events_rotations_total")
		ledger, _, err2 := r.Metric("outbox_ledger_rotations_total")
		return err1 == nil && err2 == nil && events >= 1 && ledger >= 1
	})
	scrape, err := r.Scrape()
	require.NoError(t, err)
	for _, table := range []string{"outbox_events", "outbox_ledger"} {
		_, ok, err := harness.ParseMetric(scrape, `outbox_rotation_last_success_timestamp_seconds{table="`+table+`"}`)
		require.NoError(t, err)
		require.True(t, ok, "a round of %s's rotation ended well", table)
		for _, class := range []string{"permission_denied", "other"} {
			n, _, err := harness.ParseMetric(scrape, `outbox_rotation_errors_total{table="`+table+`",class="`+class+`"}`)
			require.NoError(t, err)
			require.Zero(t, n, "%s's rotation failed: %s\n%s", table, class, r.Logs())
		}
	}
	require.NotContains(t, r.Logs(), "permission denied")
	require.NoError(t, r.Signal(syscall.SIGTERM))
	code, err := r.ExitCode(15 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, r.Logs())
}
