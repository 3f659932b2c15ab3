// Command wlproj drains a Postgres outbox into projections (an Elasticsearch
// index first). main only wires: it parses flags, builds configs, starts the
// pieces and waits for a signal.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/migrations"
)

// exitError carries an exit code through kong's Run.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

type globals struct {
	LogFormat string `help:"Log format." enum:"json,console" default:"json" env:"LOG_FORMAT"`
	LogLevel  string `help:"Log level." enum:"debug,info,warn,error" default:"info" env:"LOG_LEVEL"`

	logger zerolog.Logger
	stdout io.Writer
}

type cli struct {
	globals

	Run     runCmd     `cmd:"" help:"Run a replica: race for leadership, drain the outbox while leader, serve health and metrics."`
	Migrate migrateCmd `cmd:"" help:"Apply the outbox schema migrations (guarded, idempotent)."`
	Replay  replayCmd  `cmd:"" help:"Return failed events to pending, or archived ones with --archived, audited."`
	Failed  failedCmd  `cmd:"" help:"Inspect, discard and archive failed events."`
	Status  statusCmd  `cmd:"" help:"Show outbox status: counts, lag, stuck rows, failed reasons, leader."`
	Doc     docCmd     `cmd:"" help:"Show a document's applied-version ledger entry next to its events."`
	Rebuild rebuildCmd `cmd:"" help:"Rebuild the search index from the source-of-truth table and swap the alias to it, with no downtime. Audited."`
	Pause   pauseCmd   `cmd:"" help:"Pause a projection: its events stay pending while the others drain. Audited."`
	Resume  resumeCmd  `cmd:"" help:"Resume a paused projection where it stopped. Audited."`
	Verify  verifyCmd  `cmd:"" help:"Check that the search index holds what the source table (or the ledger) says; exit 4 on drift."`
}

type dbFlags struct {
	DatabaseURL string `help:"Postgres connection URL." env:"DATABASE_URL" required:""`
}

type migrateCmd struct {
	dbFlags
	ExpectDB   string `name:"expect-db" help:"Refuse to migrate unless the connected database has this name." env:"MIGRATE_EXPECT_DB"`
	ExpectHost string `help:"Refuse to migrate unless connected to this host (as written in the URL, or the server address)." env:"MIGRATE_EXPECT_HOST"`
	ExpectPort int    `help:"Refuse to migrate unless connected to this port." env:"MIGRATE_EXPECT_PORT"`
}

func (c *migrateCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := migrations.Up(ctx, c.DatabaseURL, migrations.Expect{Database: c.ExpectDB, Host: c.ExpectHost, Port: c.ExpectPort})
	if err != nil {
		return err
	}
	g.logger.Info().Str("target", res.Target.String()).Ints64("applied", res.Applied).Int64("version", res.Current).Msg("migrate done")
	if len(res.Applied) == 0 {
		fmt.Fprintf(g.stdout, "schema is up to date at version %d (%s)\n", res.Current, res.Target)
	} else {
		fmt.Fprintf(g.stdout, "applied %v, schema now at version %d (%s)\n", res.Applied, res.Current, res.Target)
	}
	return nil
}

func newLogger(format, level string, w io.Writer) zerolog.Logger {
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w}
	}
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("wlproj"),
		kong.Description("Drains a Postgres outbox into projections, with one active leader."),
		kong.UsageOnError(),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exitCode(code)) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Vars(flagVars()),
	)
	if err != nil {
		fmt.Fprintln(stderr, "wlproj:", err)
		return 2
	}
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil {
				ec, ok := r.(exitCode)
				if !ok {
					panic(r)
				}
				code = int(ec)
			}
		}()
		kctx, err := parser.Parse(args)
		if err != nil {
			fmt.Fprintln(stderr, "wlproj:", err)
			code = 2
			return
		}
		c.logger = newLogger(c.LogFormat, c.LogLevel, stderr)
		c.stdout = stdout
		if err := kctx.Run(&c.globals); err != nil {
			fmt.Fprintln(stderr, "wlproj:", err)
			code = 1
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
			}
		}
	}()
	return code
}

type exitCode int
