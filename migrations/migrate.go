// Package migrations holds the outbox schema as embedded SQL files and applies
// them with goose, under a Postgres advisory lock, after checking that the
// connection points at the database the operator expects.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

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
	Target  Target
	Applied []int64
	Current int64
}

// Up checks the guard and applies every pending migration. Running it twice
// applies nothing the second time.
func Up(ctx context.Context, databaseURL string, want Expect) (Result, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return Result{}, fmt.Errorf("DATABASE_URL: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()

	target, err := inspect(ctx, db, cfg.Host)
	if err != nil {
		return Result{}, err
	}
	res := Result{Target: target}
	if !matches(want, target) {
		return res, &ErrWrongDatabase{Want: want, Found: target}
	}

	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return res, err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return res, err
	}
	applied, err := provider.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	for _, a := range applied {
		res.Applied = append(res.Applied, a.Source.Version)
	}
	res.Current, err = provider.GetDBVersion(ctx)
	return res, err
}

func inspect(ctx context.Context, db *sql.DB, host string) (Target, error) {
	t := Target{Host: host}
	var addr sql.NullString
	var port sql.NullInt64
	err := db.QueryRowContext(ctx,
		`SELECT current_database(), host(inet_server_addr()), inet_server_port()`).Scan(&t.Database, &addr, &port)
	if err != nil {
		return t, fmt.Errorf("connect to database: %w", err)
	}
	t.ServerAddr, t.Port = addr.String, int(port.Int64)
	return t, nil
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
