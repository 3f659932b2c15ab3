package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/serviceutil"
)

// A CONCURRENTLY build goes on in its session until it ends, whatever became
// of the client that started it (on a server older than 14, or before the
// connection check notices). After a kill -9 of wlproj migrate its build
// may still run when the rerun starts: it holds SHARE UPDATE EXCLUSIVE on
// its table, which every later CONCURRENTLY statement and ALTER of that
// table waits for, and its INVALID index is not yet safe to drop: DROP
// INDEX CONCURRENTLY fails with "tuple concurrently updated" once the build
// moves to its next phase. So each file that runs statement by statement
// first ends such orphaned builds, and before it drops an invalid index the
// runner ends, or waits out, every session still building it.

// builder is a session building an index, as
// pg_stat_progress_create_index shows it.
type builder struct {
	PID         int
	Application string
	Index       string
	Command     string // CREATE INDEX CONCURRENTLY, REINDEX CONCURRENTLY…
	Phase       string
	Started     time.Time // its statement's start
}

func (b builder) String() string {
	return fmt.Sprintf("pid %d %s, %s %s for %s, phase %q", b.PID, b.Application, b.Command, b.Index,
		time.Since(b.Started).Round(time.Second), b.Phase)
}

// buildersSQL lists the sessions of this database building the index $1,
// or, when $1 is null, the builds of any index by sessions named $2.
const buildersSQL = `
SELECT p.pid, coalesce(a.application_name, ''), coalesce(p.index_relid::regclass::text, ''), p.command, p.phase,
       coalesce(a.query_start, now())
  FROM pg_stat_progress_create_index p
  JOIN pg_stat_activity a ON a.pid = p.pid
 WHERE p.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND p.pid <> pg_backend_pid()
   AND (p.index_relid = to_regclass($1) OR ($1 IS NULL AND a.application_name = $2))`

func builders(ctx context.Context, conn *sql.Conn, index, application string) ([]builder, error) {
	rows, err := conn.QueryContext(ctx, buildersSQL, sql.NullString{String: index, Valid: index != ""}, application)
	if err != nil {
		return nil, fmt.Errorf("sessions building indexes: %w", err)
	}
	defer rows.Close()
	var out []builder
	for rows.Next() {
		var b builder
		if err := rows.Scan(&b.PID, &b.Application, &b.Index, &b.Command, &b.Phase, &b.Started); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// endBuilders returns once no other session builds index or, when index is
// empty, once no orphaned build runs in the database. A build by a session
// named as this run's sessions are is an orphan of an earlier wlproj
// migrate: this run holds goose's migration lock, which a live migrate
// would hold, so the migrate that started it is gone and nothing will ever
// record its build. It is terminated, not cancelled: with its client gone
// nobody takes the error, and a cancelled session whose peer vanished
// without closing would sit idle until its keepalives fire. Any other
// session building index (an index built by hand under the same name) is
// waited for, polling, up to LockWait.
func (r *runner) endBuilders(ctx context.Context, conn *sql.Conn, index string) error {
	var own string
	if err := conn.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&own); err != nil {
		return err
	}
	start := time.Now()
	seen := map[int]bool{}
	for {
		found, err := builders(ctx, conn, index, own)
		if err != nil || len(found) == 0 {
			return err
		}
		for _, b := range found {
			if seen[b.PID] {
				continue
			}
			seen[b.PID] = true
			if b.Application == own {
				if err := r.terminateOrphan(ctx, conn, b); err != nil {
					return err
				}
				continue
			}
			r.log.Warn().Str("index", index).Int("builder_pid", b.PID).Str("builder", b.String()).
				Msg("another session is building this index: waiting for it to end before dropping the INVALID index")
		}
		if waited := time.Since(start); waited >= r.cfg.LockWait {
			return &buildInProgressError{Index: index, Builders: found, Waited: waited}
		}
		if err := serviceutil.Sleep(ctx, blockerPoll); err != nil {
			return err
		}
	}
}

// terminateOrphan terminates b; the caller polls until it is gone.
func (r *runner) terminateOrphan(ctx context.Context, conn *sql.Conn, b builder) error {
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", b.PID).Scan(&ok); err != nil {
		return fmt.Errorf("terminate the orphaned build %s: %w", b, err)
	}
	r.log.Warn().Str("index", b.Index).Int("orphan_pid", b.PID).Str("orphan", b.String()).Bool("terminated", ok).
		Msg("terminated an index build left running by an earlier wlproj migrate that no longer runs (this one holds the migration lock); the migration builds the index again")
	return nil
}

// buildInProgressError: another session went on building an index the
// migration must drop and build again for longer than LockWait.
type buildInProgressError struct {
	Index    string
	Builders []builder
	Waited   time.Duration
}

func (e *buildInProgressError) Error() string {
	names := make([]string, len(e.Builders))
	for i, b := range e.Builders {
		names[i] = b.String()
	}
	return fmt.Sprintf("index %s is INVALID and still being built by %s after waiting %s; let that build end (or end it), then run wlproj migrate again (what was applied stays applied)",
		e.Index, strings.Join(names, "; "), e.Waited.Round(time.Second))
}

// indexInvalid reports whether index exists and is INVALID.
func indexInvalid(ctx context.Context, conn *sql.Conn, index string) (bool, error) {
	var invalid bool
	err := conn.QueryRowContext(ctx, `SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)`, index).Scan(&invalid)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return invalid, err
}
