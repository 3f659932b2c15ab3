package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/outbox"
)

// States of a rebuild row.
const (
	StateOpen       = "open"
	StateSwapped    = "swapped"
	StateAborted    = "aborted"
	StateRolledBack = "rolled_back"
	StateCleaned    = "cleaned"
)

// Modes of a rebuild.
const (
	ModeBulk = "bulk"
	ModeEmit = "emit-outbox"
)

// lockClass is the first key of the rebuild's advisory lock; the second is
// hashtext(projection). Two-key locks never collide with the leader's and
// goose's one-key locks.
const lockClass = 0x7762 // "wb"

// Row is one rebuild, as outbox_rebuilds holds it.
type Row struct {
	ID             int64      `json:"id"`
	Projection     string     `json:"projection"`
	Alias          string     `json:"alias"`
	Target         string     `json:"target_index"`
	OldIndex       string     `json:"old_index,omitempty"`
	OldIsConcrete  bool       `json:"old_is_concrete"`
	SourceTable    string     `json:"source_table"`
	Mode           string     `json:"mode"`
	MappingSHA256  string     `json:"mapping_sha256,omitempty"`
	State          string     `json:"state"`
	StartedBy      string     `json:"started_by"`
	StartedAt      time.Time  `json:"started_at"`
	DualWriteAt    *time.Time `json:"dual_write_at,omitempty"`
	DualWriteBy    string     `json:"dual_write_by,omitempty"`
	DualWriteEpoch int64      `json:"dual_write_epoch,omitempty"`
	// DualWriteSince is when the unbroken run of confirmations began,
	// LoadSince what it was when the load read its first page.
	DualWriteSince *time.Time `json:"dual_write_since,omitempty"`
	LoadSince      *time.Time `json:"load_since,omitempty"`
	LoadedType     *string    `json:"-"`
	LoadedID       *string    `json:"-"`
	RowsLoaded     int64      `json:"rows_loaded"`
	RowsRefused    int64      `json:"rows_refused"`
	RowsSuperseded int64      `json:"rows_superseded"`
	EmitFirstID    *int64     `json:"emit_first_id,omitempty"`
	EmitLastID     *int64     `json:"emit_last_id,omitempty"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
	// ReleasedAt is when the leader was told to stop writing the index
	// that Cleanup deletes (an abort, a rollback, or Cleanup itself).
	ReleasedAt *time.Time `json:"released_at,omitempty"`
}

const rowColumns = `id, projection, alias, target_index, coalesce(old_index, ''), old_is_concrete, source_table, mode,
       coalesce(mapping_sha256, ''), state, started_by, started_at, dual_write_at, loaded_type, loaded_id,
       rows_loaded, rows_refused, rows_superseded, emit_first_id, emit_last_id, finished_at,
       coalesce(dual_write_by, ''), coalesce(dual_write_epoch, 0), dual_write_since, load_since, released_at`

func scanRow(row pgx.Row) (Row, error) {
	var r Row
	err := row.Scan(&r.ID, &r.Projection, &r.Alias, &r.Target, &r.OldIndex, &r.OldIsConcrete, &r.SourceTable, &r.Mode,
		&r.MappingSHA256, &r.State, &r.StartedBy, &r.StartedAt, &r.DualWriteAt, &r.LoadedType, &r.LoadedID,
		&r.RowsLoaded, &r.RowsRefused, &r.RowsSuperseded, &r.EmitFirstID, &r.EmitLastID, &r.FinishedAt,
		&r.DualWriteBy, &r.DualWriteEpoch, &r.DualWriteSince, &r.LoadSince, &r.ReleasedAt)
	return r, err
}

// Open returns the open rebuild of projection, nil if there is none.
func Open(ctx context.Context, db Querier, projection string) (*Row, error) {
	r, err := scanRow(db.QueryRow(ctx, `SELECT `+rowColumns+` FROM outbox_rebuilds WHERE projection = $1 AND state = 'open'`, projection))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the open rebuild: %w", err)
	}
	return &r, nil
}

// List returns the rebuilds of projection, newest first.
func List(ctx context.Context, db Querier, projection string) ([]Row, error) {
	rows, err := db.Query(ctx, `SELECT `+rowColumns+` FROM outbox_rebuilds WHERE projection = $1 ORDER BY id DESC`, projection)
	if err != nil {
		return nil, fmt.Errorf("list rebuilds: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) { return scanRow(row) })
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// started_at is the clock time, not the transaction's: the wait for the
// leaders' caches counts from it.
const insertSQL = `
INSERT INTO outbox_rebuilds (projection, alias, target_index, old_index, old_is_concrete, source_table, mode,
                             mapping_sha256, started_by, reason, started_at)
VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, nullif($8, ''), $9, $10, clock_timestamp())
RETURNING ` + rowColumns

// insertOpen writes the open row and its audit row in one transaction.
func insertOpen(ctx context.Context, pool *pgxpool.Pool, r Row, why string) (Row, error) {
	var out Row
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		out, err = scanRow(tx.QueryRow(ctx, insertSQL, r.Projection, r.Alias, r.Target, r.OldIndex, r.OldIsConcrete,
			r.SourceTable, r.Mode, r.MappingSHA256, r.StartedBy, why))
		if err != nil {
			return fmt.Errorf("open rebuild: %w", err)
		}
		return audit(ctx, tx, r.StartedBy, why, 0, auditEntry{Step: "open", Row: out})
	})
	return out, err
}

// transition moves rebuild id from state from to state to, with extra SET
// clauses (constants of this package), and writes the audit row; it fails
// when the row is not in state from any more.
func transition(ctx context.Context, pool *pgxpool.Pool, id int64, from, to, set, by, why string, count int64, entry auditEntry) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE outbox_rebuilds SET state = $3`+set+` WHERE id = $1 AND state = $2`, id, from, to)
		if err != nil {
			return fmt.Errorf("rebuild #%d %s → %s: %w", id, from, to, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("rebuild #%d is no longer %s; nothing changed", id, from)
		}
		return audit(ctx, tx, by, why, count, entry)
	})
}

// auditEntry is the selector column of a rebuild's audit row: the step and
// the rebuild as it stood.
type auditEntry struct {
	Step    string           `json:"step"`
	Row     Row              `json:"rebuild"`
	Deleted []string         `json:"deleted_indexes,omitempty"`
	Refused map[string]int64 `json:"refused_by_reason,omitempty"`
	// Lost and LostIDs are the documents a swap with Config.AllowRefused
	// left behind (Report.Lost); Behind the source rows behind the ledger.
	Lost    int64    `json:"lost,omitempty"`
	LostIDs []string `json:"lost_ids,omitempty"`
	Behind  int64    `json:"behind,omitempty"`
	Note    string   `json:"note,omitempty"`
}

func audit(ctx context.Context, tx pgx.Tx, by, why string, count int64, entry auditEntry) error {
	_, _, err := outbox.WriteAudit(ctx, tx, outbox.Audit{Action: "rebuild", By: by, Why: why, Selector: entry, Count: count,
		Projection: entry.Row.Projection})
	return err
}

// checkpointSQL records how far the load got; only an open row moves.
const checkpointSQL = `
UPDATE outbox_rebuilds
   SET loaded_type = $2, loaded_id = $3, rows_loaded = $4, rows_refused = $5, rows_superseded = $6
 WHERE id = $1 AND state = 'open'`

func checkpoint(ctx context.Context, db *pgxpool.Pool, r *Row) error {
	_, err := db.Exec(ctx, checkpointSQL, r.ID, r.LoadedType, r.LoadedID, r.RowsLoaded, r.RowsRefused, r.RowsSuperseded)
	if err != nil {
		return fmt.Errorf("record progress: %w", err)
	}
	return nil
}

// lock is the advisory lock that lets one rebuild command at a time work on
// a projection, held on a connection of its own for the whole command.
type lock struct {
	conn *pgxpool.Conn
}

// acquire takes the lock, or returns a *BusyError naming its holder.
// begin applies cfg's defaults, validates it and takes the projection's
// rebuild lock: how every rebuild command starts.
func begin(ctx context.Context, cfg Config) (Config, *lock, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	l, err := acquire(ctx, cfg.Pool, cfg.Projection)
	return cfg, l, err
}

func acquire(ctx context.Context, pool *pgxpool.Pool, projection string) (*lock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, lockClass, projection).Scan(&ok); err != nil {
		conn.Release()
		return nil, fmt.Errorf("rebuild lock: %w", err)
	}
	if ok {
		return &lock{conn: conn}, nil
	}
	conn.Release()
	busy := &BusyError{Projection: projection}
	_ = pool.QueryRow(ctx, `
		SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.client_addr::text, 'local'), a.backend_start
		  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		   AND l.classid::bigint = $1 AND l.objid::bigint = (hashtext($2)::bigint & 4294967295)`,
		lockClass, projection).Scan(&busy.PID, &busy.Application, &busy.Client, &busy.Since)
	return nil, busy
}

// release unlocks and returns the connection; closing it would unlock too.
func (l *lock) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		_ = l.conn.Conn().Close(ctx)
	}
	l.conn.Release()
}

// TryLock takes the rebuild lock of projection the way Run does and
// returns its release; false when another session holds it. Tests and
// operators' scripts use it to keep rebuilds out.
func TryLock(ctx context.Context, pool *pgxpool.Pool, projection string) (func(), bool, error) {
	l, err := acquire(ctx, pool, projection)
	var busy *BusyError
	if errors.As(err, &busy) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return l.release, true, nil
}
