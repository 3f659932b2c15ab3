package migrations

import (
	"context"
	"errors"
	"path"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RequiredVersion is the oldest schema this binary runs on: the newest
// migration its SQL needs. A replica on an older schema neither leads nor
// reports ready (health checks it), so it never claims on a schema its
// statements would fail on.
//
// 30 (the lookup reads the two older partitions in one step) does not
// raise it: the same function, the same answer, read faster.
//
// 29 (the ledger's entry read from its newest partition, and the term's
// barrier) did not raise it: this binary's SQL runs the same on 28, where
// the entry is the newest of all partitions, and a binary of 21 to 28 on
// 29 gets the barrier from the trigger its term's UPDATE of log_only fires.
//
// It is 28: the console reads and writes outbox_console_sessions' auth
// and groups columns, which 00028 adds (how a session signed in, and an
// OpenID user's groups), on every signed-in request, so a binary of 28 on
// 27 would fail every console page. A binary of 21 to 27 runs on 28
// unchanged (its sign-ins take the columns' defaults): the upgrade is the
// usual one, migrate, then restart the standby, then the leader.
//
// Before that, 27: every audit row names its actor and request id
// (outbox_replay_audit.actor and request_id, which 00027 adds), and the
// policy's refusals and unmasked reads are audit actions the check of 27
// accepts. A binary of before 27 runs on 27 unchanged (it leaves both
// columns empty): the upgrade is the usual one, migrate, then restart the
// standby, then the leader.
//
// 26 (the backlog steps over the rows of transactions in progress, and
// the insert trigger's NOTIFY can be turned off for a two-phase commit)
// does not raise it: it redefines functions with the same signatures and
// rows, and this binary's SQL needs neither (status keeps its own copy of
// the backlog's ranges).
//
// 24 (outbox_events_open_doc_idx, which the ledger rotation probes) does
// not raise it: on 23 the rotation is correct, only slow beside many
// failed rows, as before.
//
// 23 (outbox_queue_home, the xid trigger) does not raise it: on 22 a
// replica finds no record of the cluster its positions belong to and leads
// without that check (it logs why), as every binary before 23 does.
//
// 22 (the leader's projections hash, outbox_leader_projections) does not
// raise it: a binary of 22 on 21 records no hash (it logs why) and its
// /readyz leaves the comparison out.
//
// Before that, 21: the leader's pruner rotates outbox_events, which 00021
// partitions (outbox_events_rotation, outbox_events_0 to _2). A binary of
// 19 or 20 runs on 21 unchanged (it deletes done rows row by row, as
// before): the upgrade is the usual one, migrate, then restart the standby,
// then the leader.
//
// Before that, 19: the ledger is outbox_ledger, which 00019 adds (and fills from
// outbox_applied, whose writes by an older binary it copies while the
// replicas are restarted). The upgrade from 17 or 18 is: migrate, then
// restart the standby, then the leader. Once a binary of 19 has led, an
// older one's ledger writes are refused (it would judge events by
// outbox_applied, which no longer moves), so it cannot ack: roll back by
// migrating down to 18 first (wlproj migrate --down --to 18, which merges
// the ledger back), then the binaries.
//
// Before that, 17: the leader reads queued rows by position, which 00017
// adds (the xid column, outbox_positions, outbox_queue_origin). A release
// before 17 claims pending rows only, so new rows stay pending until a
// binary of 19 or newer leads (00018's outbox_new_row_status(), which reads
// the log_only that such a leader sets first): the upgrade from it is one
// migrate to head while it drains, between restarting the standby (whose
// one-statement wait for leadership would hold up 00017's index build)
// and the leader (runbook, Upgrade from the previous release).
//
// 22 and 25 (the audit log's action migrate, for wlproj migrate --down)
// do not raise it: this binary's runtime SQL uses neither.
//
// Raise it when a migration adds something this binary's SQL uses, and
// never for one it does not: migrations only add, so a binary keeps working
// on every schema after its own, and the documented upgrade order (migrate,
// then restart the standby, then the leader) relies on that.
// TestRequiredVersionReviewed fails when a migration is added, until
// someone has decided.
const RequiredVersion int64 = 28

// HeadVersion is the newest migration embedded in this binary: what
// wlproj migrate brings a database to.
func HeadVersion() int64 {
	names, err := embedded.ReadDir(".")
	if err != nil {
		panic("embedded migrations: " + err.Error()) // compiled in: cannot fail
	}
	var head int64
	for _, e := range names {
		if m := versionRE.FindStringSubmatch(path.Base(e.Name())); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			head = max(head, v)
		}
	}
	return head
}

// Schema is what a database's goose table says.
type Schema struct {
	// Database is the database's name, which wlproj migrate --expect-db
	// must be given.
	Database string
	// Version is the newest applied migration; 0 when none is.
	Version int64
}

// schemaVersionSQL reads the applied version as goose does (its Postgres
// dialect's GetLatestVersion: goose deletes a version's row when it goes
// down). goose_db_version holds a row per migration, so this stays a
// sub-millisecond read however large the outbox grows.
const schemaVersionSQL = `SELECT current_database(), coalesce(max(version_id), 0) FROM goose_db_version`

// undefinedTable is the SQLSTATE of a database wlproj migrate never ran on.
const undefinedTable = "42P01"

// Querier is what SchemaVersion reads through: a pool, a connection or a
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SchemaVersion reads the schema version of q's database. A database
// without goose's table is at version 0. The role needs SELECT on
// goose_db_version (deploy/sql/roles.sql grants it to the runtime role).
func SchemaVersion(ctx context.Context, q Querier) (Schema, error) {
	var s Schema
	err := q.QueryRow(ctx, schemaVersionSQL).Scan(&s.Database, &s.Version)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
		err = q.QueryRow(ctx, `SELECT current_database()`).Scan(&s.Database)
		return s, err
	}
	return s, err
}
