package cli

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/pgpool"
)

const connectTimeoutDefault = 10 * time.Second

// opsRun connects, runs fn, and turns its error into an exit code with the
// database credentials scrubbed from the message.
func opsRun(cmd dbCommand, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := connect(ctx, cmd.databaseURL())
	if err != nil {
		return commandError(cmd, err)
	}
	defer conn.Close(context.Background())
	return commandError(cmd, fn(ctx, conn))
}

// parseURL parses DATABASE_URL and refuses a list of several hosts that
// could settle on a standby (pgpool.CheckHosts), before anything connects.
func parseURL(databaseURL string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, usagef("DATABASE_URL: %w", err)
	}
	if err := pgpool.CheckHosts(&cfg.Config); err != nil {
		return nil, usagef("DATABASE_URL: %w", err)
	}
	return cfg, nil
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
