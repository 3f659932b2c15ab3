// Package migrations holds the outbox schema as embedded SQL files and applies
// them with goose, under a Postgres advisory lock, after checking that the
// connection points at the database the operator expects.
//
// The convention every migration file follows, so that applying one never
// stops the application's writes (checked by TestFilesFollowConvention):
//
//   - A statement waits at most Config.LockTimeout (500 ms) for a lock. A
//     statement queued behind an application's long transaction would hold
//     every later writer of its table queued behind itself; instead it gives
//     up, and the runner retries it with backoff for up to Config.LockWait
//     (5 min), logging each wait with the blocking session, then fails with an
//     error naming the statement and the blocker. Only the statements of a
//     CONCURRENTLY build wait the whole LockWait at once: their waits block no
//     writer.
//   - An index on a table that already exists is built CREATE INDEX
//     CONCURRENTLY IF NOT EXISTS in a file marked -- +goose NO TRANSACTION.
//     Before running it the runner drops an INVALID index of that name (left
//     by a build that failed or was killed), so a rerun builds it again
//     instead of keeping the broken one; a build of it still running is
//     ended first if a killed migrate left it, waited for otherwise
//     (orphan.go). Indexes on tables created in the same file are built
//     plainly: no application can write those yet.
//   - In a NO TRANSACTION file each statement commits alone, and a failed
//     run is rerun from the file's start: every statement is idempotent
//     (CREATE … IF NOT EXISTS, ADD COLUMN IF NOT EXISTS, DROP … IF EXISTS; a
//     DROP CONSTRAINT and its replacement in one ALTER TABLE).
//   - A statement that takes ACCESS EXCLUSIVE on a producer table
//     (ProducerTables) runs alone: in a NO TRANSACTION file, or as the only
//     statement of its file, so no later statement's wait extends the lock.
//   - Data moves over big tables go in pages, one short transaction each (a
//     DO block that COMMITs per keyset page, in a NO TRANSACTION file).
//   - -- +wlproj requires-extension NAME before a statement runs it only when
//     the extension is installed; -- +wlproj locks TEXT tells the dry run what
//     a DO block locks.
//
// A new index on outbox_events, for example, is a file of its own:
//
//	-- +goose NO TRANSACTION
//	-- +goose Up
//	CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_x_idx ON outbox_events (x) WHERE status = 'pending';
//
//	-- +goose Down
//	DROP INDEX CONCURRENTLY IF EXISTS outbox_events_x_idx;
//
// Files already released may be edited to follow the convention only if the
// schema they leave stays the same: testdata/v15 keeps them as first
// released, and TestSchemaSameAfterOldToNew compares.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/rs/zerolog"
)

//go:embed *.sql
var embedded embed.FS

// Expect names the database a migration must find before it changes anything.
// Empty fields are not checked.
type Expect struct {
	Database string
	Host     string
	Port     int
}

// Target is what the connection actually reached.
type Target struct {
	Database   string
	Host       string // host from the connection string
	ServerAddr string // inet_server_addr(), empty over a Unix socket
	Port       int
}

func (t Target) String() string {
	return fmt.Sprintf("database=%q host=%q server_addr=%q port=%d", t.Database, t.Host, t.ServerAddr, t.Port)
}

// ErrWrongDatabase is returned when the guard refuses the target.
type ErrWrongDatabase struct {
	Want  Expect
	Found Target
}

func (e *ErrWrongDatabase) Error() string {
	return fmt.Sprintf("refusing to migrate: expected database=%q host=%q port=%s but found %s; nothing was changed",
		e.Want.Database, e.Want.Host, portString(e.Want.Port), e.Found)
}

func portString(p int) string {
	if p == 0 {
		return "any"
	}
	return strconv.Itoa(p)
}

// Result reports what Up did.
type Result struct {
	Target Target
	// From is the version before the run; Current the version after.
	From    int64
	Applied []int64
	Current int64
}

// Up checks the guard and applies every pending migration with the default
// Config. Running it twice applies nothing the second time.
func Up(ctx context.Context, databaseURL string, want Expect) (Result, error) {
	return Run(ctx, databaseURL, want, Config{}, zerolog.Nop())
}

// Run checks the guard and applies the pending migrations up to cfg.UpTo.
// On a database it migrates from nothing to 19 or beyond, it queues new
// rows at once (queueFresh).
func Run(ctx context.Context, databaseURL string, want Expect, cfg Config, log zerolog.Logger) (Result, error) {
	res, err := migrate(ctx, databaseURL, want, cfg, log, nil, func(ctx context.Context, p *goose.Provider) ([]*goose.MigrationResult, error) {
		if cfg.UpTo > 0 {
			return p.UpTo(ctx, cfg.UpTo)
		}
		return p.Up(ctx)
	})
	if err != nil || res.From != 0 || res.Current < ledgerVersion {
		return res, err
	}
	return res, queueFresh(ctx, databaseURL, cfg)
}

// ledgerVersion is the migration that lets a leader switch new rows to
// queued (00019's outbox_ledger_rotation.log_only, 00018's default).
const ledgerVersion = 19

// queueFresh switches new rows to queued on a database migrated from
// nothing: no binary of before 19, which claims pending rows only, ever ran
// there, so there is nothing to wait for (on an upgrade the first leader of
// a binary of 19 or newer switches them, when it takes the ledger).
func queueFresh(ctx context.Context, databaseURL string, cfg Config) error {
	db, _, err := open(ctx, databaseURL, Expect{}, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `UPDATE outbox_ledger_rotation SET log_only = true WHERE NOT log_only`); err != nil {
		return fmt.Errorf("migrate: queue new rows of a new database: %w", err)
	}
	return nil
}

// migrate opens the database behind the guard, calls before (if set) with
// the versions applied, and runs step (goose's up or down) under the
// advisory lock, again after each wait for a lock that a transactional
// migration gave up (goose rolled it back whole).
func migrate(ctx context.Context, databaseURL string, want Expect, cfg Config, log zerolog.Logger,
	before func(context.Context, *sql.DB, map[int64]bool) error,
	step func(context.Context, *goose.Provider) ([]*goose.MigrationResult, error)) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	db, target, err := open(ctx, databaseURL, want, cfg)
	res := Result{Target: target}
	if err != nil {
		return res, err
	}
	defer db.Close()
	logClientCheck(ctx, db, log)
	applied, err := appliedVersions(ctx, db)
	if err != nil {
		return res, err
	}
	for v := range applied {
		res.From = max(res.From, v)
	}
	if before != nil {
		if err := before(ctx, db, applied); err != nil {
			return res, err
		}
	}
	r := &runner{cfg: cfg, log: log, db: db, waits: map[string]*wait{}}
	provider, err := r.provider()
	if err != nil {
		return res, err
	}
	for {
		done, err := step(ctx, provider)
		var partial *goose.PartialError
		if errors.As(err, &partial) {
			done = partial.Applied
		}
		for _, a := range done {
			res.Applied = append(res.Applied, a.Source.Version)
		}
		var lt *LockTimeoutError
		if errors.As(err, &lt) && lt.retry {
			if err := r.backoff(ctx, lt); err != nil {
				return res, err
			}
			continue
		}
		if errors.As(err, &lt) {
			return res, lt
		}
		if err != nil {
			return res, fmt.Errorf("migrate: %w", err)
		}
		break
	}
	res.Current, err = provider.GetDBVersion(ctx)
	return res, err
}

// provider is goose's, running the embedded files through r under goose's
// session lock (one migrate at a time).
func (r *runner) provider() (*goose.Provider, error) {
	files, err := loadFiles(embedded)
	if err != nil {
		return nil, err
	}
	var gooseMigrations []*goose.Migration
	for _, f := range files {
		gooseMigrations = append(gooseMigrations, r.migration(f))
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, r.db, nil,
		goose.WithSessionLocker(locker), goose.WithGoMigrations(gooseMigrations...), goose.WithDisableGlobalRegistry(true))
}

// open connects, as application_name wlproj-migrate so that the operator
// and the application's DBA can tell its sessions apart, on sessions that
// notice a client gone (sessionParams, checkClient), and checks the guard.
func open(ctx context.Context, databaseURL string, want Expect, mc Config) (*sql.DB, Target, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, Target{}, fmt.Errorf("DATABASE_URL: %w", err)
	}
	sessionParams(cfg)
	opts := []stdlib.OptionOpenDB{stdlib.OptionAfterConnect(checkClient)}
	if mc.BeforeConnect != nil {
		opts = append(opts, stdlib.OptionBeforeConnect(mc.BeforeConnect(cfg)))
	}
	db := stdlib.OpenDB(*cfg, opts...)
	target, err := inspect(ctx, db, cfg)
	if err != nil {
		db.Close()
		return nil, target, err
	}
	if !matches(want, target) {
		db.Close()
		return nil, target, &ErrWrongDatabase{Want: want, Found: target}
	}
	return db, target, nil
}

// inspect reads what the connection reached: the database, the server's
// address and port, and the host of the URL it came through (with several
// hosts, the one pgx settled on, not the first).
func inspect(ctx context.Context, db *sql.DB, cfg *pgx.ConnConfig) (Target, error) {
	t := Target{Host: cfg.Host}
	conn, err := db.Conn(ctx)
	if err != nil {
		return t, fmt.Errorf("connect to database: %w", err)
	}
	defer conn.Close()
	if len(cfg.Fallbacks) > 0 {
		_ = conn.Raw(func(dc any) error {
			if c, ok := dc.(*stdlib.Conn); ok {
				t.Host = reachedHost(cfg, c.Conn().PgConn().Conn().RemoteAddr())
			}
			return nil
		})
	}
	var addr sql.NullString
	var port sql.NullInt64
	err = conn.QueryRowContext(ctx,
		`SELECT current_database(), host(inet_server_addr()), inet_server_port()`).Scan(&t.Database, &addr, &port)
	if err != nil {
		return t, fmt.Errorf("connect to database: %w", err)
	}
	t.ServerAddr, t.Port = addr.String, int(port.Int64)
	return t, nil
}

// reachedHost is the host of cfg's list that remote is: same port, and the
// host is remote's address or resolves to it. Unknown: remote itself.
func reachedHost(cfg *pgx.ConnConfig, remote net.Addr) string {
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return remote.String()
	}
	candidates := []struct {
		host string
		port uint16
	}{{cfg.Host, cfg.Port}}
	for _, fb := range cfg.Fallbacks {
		candidates = append(candidates, struct {
			host string
			port uint16
		}{fb.Host, fb.Port})
	}
	for _, c := range candidates {
		if int(c.port) != tcp.Port {
			continue
		}
		if ip := net.ParseIP(c.host); ip != nil {
			if ip.Equal(tcp.IP) {
				return c.host
			}
			continue
		}
		addrs, _ := net.LookupIP(c.host)
		for _, a := range addrs {
			if a.Equal(tcp.IP) {
				return c.host
			}
		}
	}
	return tcp.IP.String()
}

func matches(want Expect, t Target) bool {
	if want.Database != "" && want.Database != t.Database {
		return false
	}
	if want.Host != "" && want.Host != t.Host && want.Host != t.ServerAddr {
		return false
	}
	if want.Port != 0 && want.Port != t.Port {
		return false
	}
	return true
}
