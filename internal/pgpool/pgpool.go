// Package pgpool opens the connection pools of wlproj's processes: the
// replica's and those of the commands that need more than one connection
// (rebuild, verify), each named in pg_stat_activity.
package pgpool

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// URLError is a database URL that does not parse.
type URLError struct{ Err error }

func (e *URLError) Error() string { return "DATABASE_URL: " + e.Err.Error() }
func (e *URLError) Unwrap() error { return e.Err }

// Open opens a pool of at most maxConns connections to databaseURL, with
// application as their application_name.
func Open(ctx context.Context, databaseURL string, maxConns int, application string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, &URLError{Err: err}
	}
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.RuntimeParams["application_name"] = application
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}
