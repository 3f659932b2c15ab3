// Package pgpool opens the connection pools of wlproj's processes: the
// replica's and those of the commands that need more than one connection
// (rebuild, verify), each named in pg_stat_activity. A URL may name several
// hosts (a primary and its standbys) with target_session_attrs=read-write:
// every new connection then goes to whichever host accepts writes, so the
// pool follows a failover as its broken connections are replaced. A host
// that refuses the session outright (a standby that has not applied a new
// database, role or password yet), where pgx would stop, is tried after the
// others (refusals.go); so is it by Connect, which the lock connection and
// the CLI use. ParseURL is the one check of a database URL every process
// makes before it connects: it refuses a URL that pgx would read otherwise
// than its writer meant, and its errors never show the URL.
package pgpool

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// connectTimeoutDefault bounds one connection attempt to one host when the
// URL sets no connect_timeout. Without it a host that vanished without an
// RST (a powered-off primary, a partition) holds each new connection for
// the kernel's SYN retries, about two minutes, before the next host of the
// URL is tried.
const connectTimeoutDefault = 5 * time.Second

// Open opens a pool of at most maxConns connections to databaseURL, with
// application as their application_name. A URL that ParseURL refuses is
// refused here too (a *URLError), before anything connects.
func Open(ctx context.Context, databaseURL string, maxConns int, application string) (*pgxpool.Pool, error) {
	if err := CheckURL(databaseURL); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, parseError(databaseURL, err)
	}
	if err := CheckHosts(&cfg.ConnConfig.Config); err != nil {
		return nil, &URLError{Err: err}
	}
	cfg.ConnConfig.ConnectTimeout = cmp.Or(cfg.ConnConfig.ConnectTimeout, connectTimeoutDefault)
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.RuntimeParams["application_name"] = application
	withoutJIT(cfg.ConnConfig.RuntimeParams)
	cfg.BeforeConnect = BeforeConnect(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}
