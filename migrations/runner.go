package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/serviceutil"
)

const (
	// ApplicationName is the application_name of the migration's sessions.
	ApplicationName = "wlproj-migrate"

	lockTimeoutDefault = 500 * time.Millisecond
	lockWaitDefault    = 5 * time.Minute
	backoffFirst       = 250 * time.Millisecond
	backoffMax         = 5 * time.Second
	blockerPoll        = 100 * time.Millisecond
)

// The defaults and ranges the CLI documents. Half a second: an insert
// queued behind a waiting ALTER waits at most that long, once per try.
const (
	LockTimeoutDefault = lockTimeoutDefault
	LockWaitDefault    = lockWaitDefault
)

var (
	LockTimeoutRange = bounds.Range[time.Duration]{Min: 10 * time.Millisecond, Max: time.Minute}
	LockWaitRange    = bounds.Range[time.Duration]{Min: 10 * time.Millisecond, Max: 24 * time.Hour}
)

// Config tunes how migrations wait for locks.
type Config struct {
	// LockTimeout is how long one statement waits for a lock before it gives
	// up and is retried; while it waits, the application's writes to the
	// same table queue behind it. Defaults to 500ms.
	LockTimeout time.Duration
	// LockWait is how long a statement keeps retrying its lock before the
	// migration fails. Defaults to 5m.
	LockWait time.Duration
	// UpTo stops after this version; 0 applies every migration. Defaults to 0.
	UpTo int64
	// BeforeConnect, given the parsed URL, makes the hook each new session
	// runs before it connects: the CLI's goes past a standby that refuses
	// the session to the next host, as the replicas do
	// (pgpool.BeforeConnect, which this package cannot import: the test
	// harness imports it). Defaults to none: pgx's own host order.
	BeforeConnect func(*pgx.ConnConfig) func(context.Context, *pgx.ConnConfig) error
}

func (c Config) withDefaults() Config {
	if c.LockTimeout == 0 {
		c.LockTimeout = lockTimeoutDefault
	}
	if c.LockWait == 0 {
		c.LockWait = lockWaitDefault
	}
	return c
}

// Validate names the first field out of range.
func (c Config) Validate() error {
	var upTo error
	if c.UpTo < 0 {
		upTo = bounds.Invalid("UpTo", "must not be negative, got %d", c.UpTo)
	}
	return bounds.First(
		bounds.Check("LockTimeout", c.LockTimeout, LockTimeoutRange),
		bounds.Check("LockWait", c.LockWait, LockWaitRange),
		bounds.NotBelow("LockWait", c.LockWait, "LockTimeout", c.LockTimeout),
		upTo,
	)
}

// Blocker is a session holding a lock a migration statement waited for.
type Blocker struct {
	PID         int
	Application string
	State       string
	XactStart   time.Time
	Query       string
}

func (b Blocker) String() string {
	s := fmt.Sprintf("pid %d", b.PID)
	if b.Application != "" {
		s += " " + b.Application
	}
	if b.State != "" {
		s += ", " + b.State
	}
	if !b.XactStart.IsZero() {
		s += fmt.Sprintf(", transaction open %s", time.Since(b.XactStart).Round(time.Second))
	}
	if b.Query != "" {
		s += ", last query: " + firstLine(b.Query)
	}
	return s
}

// LockTimeoutError: a statement did not get its lock within LockTimeout.
// When the runner gives up, it is the migration's error.
type LockTimeoutError struct {
	File      string
	Statement string
	Attempts  int
	Waited    time.Duration
	Blockers  []Blocker
	Err       error

	retry bool // the runner will try again
}

func (e *LockTimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "migration %s: statement %q did not get its lock after %d tries over %s",
		e.File, firstLine(e.Statement), e.Attempts, e.Waited.Round(time.Millisecond))
	if len(e.Blockers) > 0 {
		b.WriteString("; blocked by ")
		for i, bl := range e.Blockers {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(bl.String())
		}
	}
	b.WriteString("; " + e.Hint() + ", then run wlproj migrate again (what was applied stays applied)")
	return b.String()
}

// Hint says what lets the statement through. A session in the way that is
// running statements (not idle in its transaction) is working, not stuck:
// if every try still met it, its transactions outlast the lock timeout,
// and only a longer one (or a quieter moment) finds the gap between them.
// Not so for an index build CONCURRENTLY: it waits, without a lock
// timeout, for every transaction older than itself to end, so the session
// in the way is one transaction or snapshot that lasted the whole
// MIGRATE_LOCK_WAIT, and no lock timeout helps (a previous release's
// standby waiting for leadership in one statement is one).
func (e *LockTimeoutError) Hint() string {
	if concurrentRE.MatchString(e.Statement) {
		return "an index build CONCURRENTLY waits for every transaction and snapshot older than itself to end, " +
			"and the session in the way kept one open all along; a longer MIGRATE_LOCK_TIMEOUT cannot help: end that session " +
			"(a standby of a release that waits for leadership in one statement: restart it onto this binary, and end its wait " +
			"if it outlived it, see the runbook's upgrade order) or wait for its transaction to end"
	}
	working := len(e.Blockers) > 0
	for _, b := range e.Blockers {
		working = working && b.State == "active"
	}
	if working {
		return "the session in the way is running statements whose transactions outlast MIGRATE_LOCK_TIMEOUT: " +
			"give it a longer MIGRATE_LOCK_TIMEOUT (the application's inserts wait up to that long per try) or a quieter moment"
	}
	return "end that transaction or wait for it"
}

func (e *LockTimeoutError) Unwrap() error { return e.Err }

// wait is the retry state of one statement.
type wait struct {
	first    time.Time
	attempts int
}

type runner struct {
	cfg   Config
	log   zerolog.Logger
	db    *sql.DB
	waits map[string]*wait
}

// migration wraps f as a goose Go migration run by r.
func (r *runner) migration(f file) *goose.Migration {
	var up, down *goose.GoFunc
	if f.NoTx {
		up = &goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error { return r.runNoTx(ctx, f, f.Up) }}
		down = &goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error { return r.runNoTx(ctx, f, f.Down) }}
	} else {
		up = &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error { return r.runTx(ctx, tx, f, f.Up) }}
		down = &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error { return r.runTx(ctx, tx, f, f.Down) }}
	}
	return goose.NewGoMigration(f.Version, up, down)
}

// runTx runs stmts in goose's transaction. A lock timeout ends the attempt:
// goose rolls the transaction back, and Run calls backoff and tries again.
func (r *runner) runTx(ctx context.Context, tx *sql.Tx, f file, stmts []statement) error {
	if _, err := tx.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, true)", pgInterval(r.cfg.LockTimeout)); err != nil {
		return err
	}
	var pid int
	if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	for i, st := range stmts {
		if skip, err := r.skip(ctx, tx, f, st); err != nil || skip {
			if err != nil {
				return err
			}
			continue
		}
		blockers, err := r.watch(ctx, pid, func() error { _, err := tx.ExecContext(ctx, st.SQL); return err })
		if err != nil {
			return r.failed(f, i, st, r.cfg.LockTimeout, blockers, err)
		}
	}
	return nil
}

// runNoTx runs each statement alone on a session of its own, retrying a
// statement that timed out on a lock in place.
func (r *runner) runNoTx(ctx context.Context, f file, stmts []statement) error {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The session goes back to the pool, where goose records versions.
	defer conn.ExecContext(context.WithoutCancel(ctx), "RESET lock_timeout") //nolint:errcheck
	var pid int
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	// A killed run of this file may have left a build running; its lock
	// would hold up any statement here on its table. (A file run in one
	// transaction has no CONCURRENTLY build, and an orphan can only be of
	// the first file not yet applied.)
	if err := r.endBuilders(ctx, conn, ""); err != nil {
		return err
	}
	for i, st := range stmts {
		if skip, err := r.skip(ctx, conn, f, st); err != nil || skip {
			if err != nil {
				return err
			}
			continue
		}
		timeout := r.cfg.LockTimeout
		if concurrentRE.MatchString(st.SQL) {
			// Its waits (the table's SHARE UPDATE EXCLUSIVE, older
			// transactions) block no writer: no point giving up early.
			timeout = r.cfg.LockWait
		}
		if _, err := conn.ExecContext(ctx, "SELECT set_config('lock_timeout', $1, false)", pgInterval(timeout)); err != nil {
			return err
		}
		for {
			start := time.Now()
			blockers, err := r.watch(ctx, pid, func() error {
				if err := r.dropInvalid(ctx, conn, st); err != nil {
					return err
				}
				_, err := conn.ExecContext(ctx, st.SQL)
				return err
			})
			if err == nil {
				r.log.Debug().Str("migration", f.Name).Str("statement", firstLine(st.SQL)).Dur("took", time.Since(start)).Msg("migration statement done")
				break
			}
			ferr := r.failed(f, i, st, timeout, blockers, err)
			lt, ok := ferr.(*LockTimeoutError)
			if !ok || !lt.retry {
				return ferr
			}
			if err := r.backoff(ctx, lt); err != nil {
				return err
			}
		}
	}
	return nil
}

// failed turns a statement's error into the migration's error: a lock
// timeout becomes a LockTimeoutError (retry set while within LockWait,
// counted from the start of the statement's first try, timeout ago), and
// so does a deadlock, which rolled the statement back as a timeout does.
// A lock timeout longer than deadlock_timeout (1 s by default, and the
// hint's advice behind a working session) lets Postgres find a cycle
// first: seen in 00021's swap, which takes outbox_events and then the
// views over it while the old release's reader held a view and waited
// for the table.
func (r *runner) failed(f file, i int, st statement, timeout time.Duration, blockers []Blocker, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "55P03" && pgErr.Code != "40P01") { // lock_not_available, deadlock_detected
		return fmt.Errorf("migration %s: statement %q: %w", f.Name, firstLine(st.SQL), err)
	}
	key := fmt.Sprintf("%d/%d", f.Version, i)
	w := r.waits[key]
	if w == nil {
		w = &wait{first: time.Now().Add(-timeout)}
		r.waits[key] = w
	}
	w.attempts++
	waited := time.Since(w.first)
	return &LockTimeoutError{File: f.Name, Statement: st.SQL, Attempts: w.attempts, Waited: waited,
		Blockers: blockers, Err: err, retry: waited < r.cfg.LockWait}
}

// backoff logs the wait and sleeps before the next try, or returns lt when
// the next try would pass LockWait.
func (r *runner) backoff(ctx context.Context, lt *LockTimeoutError) error {
	d := backoffFirst << min(lt.Attempts-1, 10)
	d = min(d, backoffMax)
	if lt.Waited+d >= r.cfg.LockWait {
		lt.retry = false
		return lt
	}
	ev := r.log.Warn().Str("migration", lt.File).Str("statement", firstLine(lt.Statement)).
		Int("attempt", lt.Attempts).Dur("lock_timeout", r.cfg.LockTimeout).Dur("retry_in", d).Dur("waited", lt.Waited)
	for _, b := range lt.Blockers {
		ev = ev.Int("blocked_by_pid", b.PID).Str("blocked_by", b.String())
	}
	ev.Str("hint", lt.Hint()).Msg("migration statement gave up waiting for a lock so as not to hold up the application's writes; retrying")
	return serviceutil.Sleep(ctx, d)
}

// watch runs fn while polling, from another session, which sessions block
// pid; it returns the last blockers seen.
func (r *runner) watch(ctx context.Context, pid int, fn func() error) ([]Blocker, error) {
	done := make(chan struct{})
	result := make(chan []Blocker, 1)
	go func() {
		var last []Blocker
		// Often enough to see the blocker before lock_timeout ends the wait.
		t := time.NewTicker(max(min(blockerPoll, r.cfg.LockTimeout/4), 5*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				result <- last
				return
			case <-t.C:
				if b := r.blockers(ctx, pid); len(b) > 0 {
					last = b
				}
			}
		}
	}()
	err := fn()
	close(done)
	return <-result, err
}

const blockersSQL = `
SELECT b.pid, coalesce(b.application_name, ''), coalesce(b.state, ''), b.xact_start, left(coalesce(b.query, ''), 300)
  FROM unnest(pg_blocking_pids($1)) AS bp(pid)
  JOIN pg_stat_activity b ON b.pid = bp.pid
 ORDER BY b.xact_start NULLS LAST`

func (r *runner) blockers(ctx context.Context, pid int) []Blocker {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rows, err := r.db.QueryContext(ctx, blockersSQL, pid)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []Blocker
	for rows.Next() {
		var b Blocker
		var xs sql.NullTime
		if rows.Scan(&b.PID, &b.Application, &b.State, &xs, &b.Query) == nil {
			b.XactStart = xs.Time
			out = append(out, b)
		}
	}
	return out
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// skip reports whether st must not run: its required extension is missing.
func (r *runner) skip(ctx context.Context, db execer, f file, st statement) (bool, error) {
	if st.RequiresExtension == "" {
		return false, nil
	}
	var ok bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = $1)", st.RequiresExtension).Scan(&ok); err != nil {
		return false, err
	}
	if !ok {
		r.log.Warn().Str("migration", f.Name).Str("statement", firstLine(st.SQL)).Str("extension", st.RequiresExtension).
			Msg("extension not installed: statement skipped")
	}
	return !ok, nil
}

var concurrentRE = regexp.MustCompile(`(?is)^\s*(CREATE\s+(UNIQUE\s+)?INDEX|DROP\s+INDEX|REINDEX)\s+.*CONCURRENTLY`)

// dropInvalid drops the INVALID index a failed or interrupted CREATE INDEX
// CONCURRENTLY IF NOT EXISTS left under st's name, which IF NOT EXISTS would
// keep; first it ends or waits out any session still building it
// (endBuilders).
func (r *runner) dropInvalid(ctx context.Context, conn *sql.Conn, st statement) error {
	m := createIndexRE.FindStringSubmatch(strings.TrimSpace(st.SQL))
	if m == nil || m[2] == "" || m[3] == "" {
		return nil
	}
	index := m[4]
	if invalid, err := indexInvalid(ctx, conn, index); err != nil || !invalid {
		return err
	}
	if err := r.endBuilders(ctx, conn, index); err != nil {
		return err
	}
	// A build waited out may have finished: its index is valid, and kept.
	if invalid, err := indexInvalid(ctx, conn, index); err != nil || !invalid {
		return err
	}
	r.log.Warn().Str("index", index).Msg("dropping the invalid index an interrupted build left, to build it again")
	_, err := conn.ExecContext(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+index)
	return err
}

func pgInterval(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }
