package harness

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The rotation archive keeps, in a run's own database, every row the
// outbox's and the ledger's rotations empty by TRUNCATE, so a run whose
// retention rotates both tables (the drill) can still judge every event and
// document against the model: a row the rotation took is delivered, not
// lost. It is test tooling, never part of the product's schema: it lives in
// a schema of its own (archiveSchema), created by the admin after
// roles.sql, and nothing of the product reads it.
//
// A BEFORE TRUNCATE statement trigger on each partition copies the rows
// being emptied. Its function is the admin's and SECURITY DEFINER: the
// runtime role that rotates needs no grant on the archive, and the copy
// commits or rolls back with the TRUNCATE, so a row is in exactly one of
// the outbox and the archive at any time.

// archiveSchema holds the archive's tables, functions and view.
const archiveSchema = "rotation_archive"

// ArchivedEventStates is a view with the columns of outbox_event_states
// that the verdict and the drill read (archivedColumns) over the outbox's
// rows and the archived ones: every event ever written, in the status it had when its partition
// was emptied if it was. See verifySource.
const ArchivedEventStates = archiveSchema + ".event_states"

// ArchivedLedger is a view of every ledger entry ever written: the
// ledger's and those its rotation emptied.
const ArchivedLedger = archiveSchema + ".ledger_entries"

// archivedColumns are the columns of an event the verdict and the drill
// read; the archive keeps these and no payload.
const archivedColumns = `id, projection, entity_type, entity_id, op, event_version, status, attempts,
       error_class, error_reason, error_history, replay_count, created_at, updated_at, processed_at`

// archiveDDL creates the archive. The status of an emptied row is the
// operator's view's (outbox_event_states): a queued row's status is its
// projection's position's, not the column's. The rows are read by id from
// the view, one index probe per row of the partition, inside the
// rotation's transaction, which holds the partition's ACCESS EXCLUSIVE lock
// (and so the leader's reads of the outbox) meanwhile: the archive's tables
// have no index but the events' id, which the drill's probes need, so the
// copy costs little more than reading the rows (Truncations.CopyMaxSeconds).
var archiveDDL = []string{
	`CREATE SCHEMA ` + archiveSchema,
	`CREATE TABLE ` + archiveSchema + `.events AS
	   SELECT ` + archivedColumns + `, now() AS archived_at, ''::text AS partition FROM public.outbox_event_states WITH NO DATA`,
	`CREATE TABLE ` + archiveSchema + `.ledger AS
	   SELECT l.*, now() AS archived_at, ''::text AS partition FROM public.outbox_ledger l WITH NO DATA`,
	// The drill's probes by id, through ArchivedEventStates.
	`CREATE INDEX ON ` + archiveSchema + `.events (id)`,
	// One row per TRUNCATE that emptied a partition: the rotations the
	// database saw, whoever ran them, and how long the copy held the
	// rotation's transaction (from the TRUNCATE statement's start).
	`CREATE TABLE ` + archiveSchema + `.truncations (
	   partition text NOT NULL, rows bigint NOT NULL,
	   started_at timestamptz NOT NULL DEFAULT statement_timestamp(), at timestamptz NOT NULL DEFAULT clock_timestamp())`,
	`CREATE VIEW ` + ArchivedEventStates + ` AS
	   SELECT ` + archivedColumns + ` FROM public.outbox_event_states
	   UNION ALL SELECT ` + archivedColumns + ` FROM ` + archiveSchema + `.events`,
	`CREATE VIEW ` + ArchivedLedger + ` AS
	   SELECT projection, entity_type, entity_id, version, deleted, event_id, applied_at FROM public.outbox_ledger
	   UNION ALL SELECT projection, entity_type, entity_id, version, deleted, event_id, applied_at FROM ` + archiveSchema + `.ledger`,
	`CREATE FUNCTION ` + archiveSchema + `.keep_events() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
	   SET search_path = pg_catalog, pg_temp AS $$
	 DECLARE n bigint;
	 BEGIN
	   EXECUTE format('INSERT INTO ` + archiveSchema + `.events SELECT ` + strings.ReplaceAll(archivedColumns, "\n", " ") + `, now(), %L
	                     FROM public.outbox_event_states WHERE id = ANY(ARRAY(SELECT id FROM %I.%I))',
	                  TG_TABLE_NAME, TG_TABLE_SCHEMA, TG_TABLE_NAME);
	   GET DIAGNOSTICS n = ROW_COUNT;
	   INSERT INTO ` + archiveSchema + `.truncations (partition, rows) VALUES (TG_TABLE_NAME, n);
	   RETURN NULL;
	 END $$`,
	`CREATE FUNCTION ` + archiveSchema + `.keep_ledger() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
	   SET search_path = pg_catalog, pg_temp AS $$
	 DECLARE n bigint;
	 BEGIN
	   EXECUTE format('INSERT INTO ` + archiveSchema + `.ledger SELECT l.*, now(), %L FROM %I.%I l',
	                  TG_TABLE_NAME, TG_TABLE_SCHEMA, TG_TABLE_NAME);
	   GET DIAGNOSTICS n = ROW_COUNT;
	   INSERT INTO ` + archiveSchema + `.truncations (partition, rows) VALUES (TG_TABLE_NAME, n);
	   RETURN NULL;
	 END $$`,
}

// archivedPartitions are the partitions the rotations empty, each with the
// function that keeps its rows.
var archivedPartitions = map[string]string{
	"outbox_events_0": "keep_events", "outbox_events_1": "keep_events", "outbox_events_2": "keep_events",
	"outbox_ledger_0": "keep_ledger", "outbox_ledger_1": "keep_ledger", "outbox_ledger_2": "keep_ledger",
}

// InstallRotationArchive creates the rotation archive in pool's database,
// which must be migrated and pool logged in as an admin. Install it before
// any replica runs, after roles.sql (which hands the public schema's
// functions to the owner role: the archive's must stay the admin's).
func InstallRotationArchive(ctx context.Context, pool *pgxpool.Pool) error {
	stmts := append([]string{}, archiveDDL...)
	for partition, keep := range archivedPartitions {
		stmts = append(stmts, fmt.Sprintf(`CREATE TRIGGER rotation_archive BEFORE TRUNCATE ON public.%s
		  FOR EACH STATEMENT EXECUTE FUNCTION %s.%s()`, partition, archiveSchema, keep))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("install the rotation archive: %w", err)
		}
	}
	return tx.Commit(ctx)
}

// Truncations counts the TRUNCATEs the archive saw, of the outbox's
// partitions and of the ledger's.
type Truncations struct {
	Events int64 `json:"events"`
	Ledger int64 `json:"ledger"`
	// EventRows and LedgerRows are the rows they emptied, now archived.
	EventRows  int64 `json:"event_rows"`
	LedgerRows int64 `json:"ledger_rows"`
	// CopyMaxSeconds is the longest a copy delayed its TRUNCATE, which
	// holds the partition's ACCESS EXCLUSIVE lock meanwhile: the archive's
	// cost to the run it observes.
	CopyMaxSeconds float64 `json:"copy_max_seconds"`
}

// ArchivedTruncations reads what the archive in pool's database kept.
func ArchivedTruncations(ctx context.Context, pool *pgxpool.Pool) (Truncations, error) {
	var t Truncations
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE partition LIKE 'outbox\_events\_%'), count(*) FILTER (WHERE partition LIKE 'outbox\_ledger\_%'),
		       coalesce(sum(rows) FILTER (WHERE partition LIKE 'outbox\_events\_%'), 0),
		       coalesce(sum(rows) FILTER (WHERE partition LIKE 'outbox\_ledger\_%'), 0),
		       coalesce(round(extract(epoch FROM max(at - started_at))::numeric, 3), 0)::float8
		  FROM `+archiveSchema+`.truncations`).Scan(&t.Events, &t.Ledger, &t.EventRows, &t.LedgerRows, &t.CopyMaxSeconds)
	return t, err
}

// Rotation is what a run's replicas rotated with: the verdict needs it to
// tell a ledger entry the rotation dropped as it should from one it
// dropped too early (see droppedLegitimately).
type Rotation struct {
	// Retention is the replicas' OUTBOX_RETENTION.
	Retention time.Duration
	// TombstoneRetention is their OUTBOX_LEDGER_TOMBSTONE_RETENTION.
	TombstoneRetention time.Duration
}

// VerifyRotated is Verify of a database with the rotation archive
// (InstallRotationArchive) whose replicas rotated with rot: every event is
// judged in the outbox or, if its partition was emptied, in the archive,
// in the status it had then; a document whose ledger entry the rotation
// dropped is judged by the dropped entry, when the drop was legitimate.
func VerifyRotated(ctx context.Context, pool *pgxpool.Pool, elasticURL, index string, rot Rotation, expected ...Failure) (Verdict, error) {
	return verifyFrom(ctx, pool, elasticURL, index, "search", archivedSource(rot), expected...)
}

// archivedSource reads events from the outbox and the archive, and each
// document's newest archived ledger entry.
func archivedSource(rot Rotation) verifySource {
	return verifySource{events: ArchivedEventStates, rotation: &rot, dropped: `
	  SELECT DISTINCT ON (entity_type, entity_id) entity_type, entity_id, version, deleted,
	         extract(epoch FROM archived_at - applied_at)::float8 AS aged_secs, archived_at
	    FROM ` + archiveSchema + `.ledger WHERE projection = $1
	   ORDER BY entity_type, entity_id, version DESC, event_id DESC, archived_at DESC`}
}
