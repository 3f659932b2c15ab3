package cli

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
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

func connect(ctx context.Context, databaseURL string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, usagef("DATABASE_URL: %w", err)
	}
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, connectTimeoutDefault)
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "wlproj-cli"
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return conn, nil
}

// databaseTarget names the database without credentials, for the status
// header: which database an operator is looking at matters.
func databaseTarget(conn *pgx.Conn) string {
	cfg := conn.Config()
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
