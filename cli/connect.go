package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/pgpool"
)

const connectTimeoutDefault = 10 * time.Second

// opsRun connects, runs fn, and turns its error into an exit code with the
// database credentials scrubbed from the message.
func opsRun(g *globals, cmd dbCommand, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	ctx, stop := signal.NotifyContext(g.context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := connect(ctx, cmd.databaseURL())
	if err != nil {
		return commandError(cmd, err)
	}
	defer conn.Close(context.Background())
	return commandError(cmd, fn(ctx, conn))
}

// Validate refuses a database URL that pgpool.ParseURL refuses, before
// anything connects or quotes it. kong calls it for every command that
// embeds dbFlags (the method is promoted to the command); run, which has a
// Validate of its own, calls it first.
func (f dbFlags) Validate(kctx *kong.Context) error {
	if f.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (or --database-url): the Postgres connection URL")
	}
	if _, err := pgpool.ParseURL(f.DatabaseURL); err != nil {
		return renameURL(err, givenAsFlag(kctx, "database-url"))
	}
	return nil
}

// parseURL parses DATABASE_URL and refuses one that could be read two ways
// or could settle on a standby (pgpool.ParseURL). Its error names the
// variable and shows no part of the URL.
func parseURL(databaseURL string) (*pgx.ConnConfig, error) {
	cfg, err := pgpool.ParseURL(databaseURL)
	if err != nil {
		return nil, renameURL(err, false)
	}
	return cfg, nil
}

// renameURL names the database URL in a *pgpool.URLError as the operator
// gave it: the flag if the command line holds it (OWNER_DATABASE_URL in the
// runbook goes that way), else DATABASE_URL. Other errors pass unchanged.
func renameURL(err error, flag bool) error {
	var bad *pgpool.URLError
	if !errors.As(err, &bad) {
		return err
	}
	if flag {
		return usagef("--database-url: %w", bad.Err)
	}
	return usagef("DATABASE_URL: %w", bad.Err)
}

// givenAsFlag reports whether the command line set the flag name, rather
// than its environment variable.
func givenAsFlag(kctx *kong.Context, name string) bool {
	if kctx == nil {
		return false
	}
	for _, p := range kctx.Path {
		if p.Flag != nil && p.Flag.Name == name && !p.Resolved {
			return true
		}
	}
	return false
}

func connect(ctx context.Context, databaseURL string) (*pgx.Conn, error) {
	cfg, err := parseURL(databaseURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, connectTimeoutDefault)
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "wlproj-cli"
	}
	conn, err := pgpool.Connect(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return conn, nil
}

// databaseTarget names the database without credentials, for the status
// header: which database an operator is looking at matters. With several
// hosts in DATABASE_URL it is the one the connection reached, not the first.
func databaseTarget(conn *pgx.Conn) string {
	cfg := conn.Config()
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if len(cfg.Fallbacks) > 0 {
		if tcp, ok := conn.PgConn().Conn().RemoteAddr().(*net.TCPAddr); ok {
			addr = tcp.String()
		}
	}
	return addr + "/" + cfg.Database
}
