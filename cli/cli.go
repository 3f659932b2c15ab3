package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
)

type globals struct {
	LogFormat string      `help:"Log format." enum:"json,console" default:"json" env:"LOG_FORMAT"`
	LogLevel  string      `help:"Log level." enum:"debug,info,warn,error" default:"info" env:"LOG_LEVEL"`
	Version   versionFlag `help:"Print the version, commit, Go version and build date, and exit."`

	logger zerolog.Logger
	stdout io.Writer
	// ctx carries the command's actor (policy.CLI: its --by, filled in by
	// the audit, and the OS user) and its span; nil before runTraced.
	ctx context.Context
}

// context is the command's base context.
func (g *globals) context() context.Context {
	if g.ctx == nil {
		return context.Background()
	}
	return g.ctx
}

// commandLine is the kong model: the global flags and every command.
type commandLine struct {
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
	Queue   queueCmd   `cmd:"" help:"The queue's storage: rebase it after the database moved to another Postgres cluster. Audited."`

	Projections projectionsCmd `cmd:"" help:"Check or list the projections file (OUTBOX_PROJECTIONS_FILE)."`
	Policy      policyCmd      `cmd:"" help:"Check the console's policy file (OUTBOX_POLICY_FILE), or what one user may do."`
	Build       versionCmd     `cmd:"" name:"version" help:"Print the version, commit, dirty flag, Go version and build date."`
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

// logTimeFormat stamps log lines to the millisecond: a takeover, a batch
// and an ack happen within milliseconds of each other, and lines stamped
// to the second could not be put in order.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func init() { zerolog.TimeFieldFormat = logTimeFormat }

// Model is the command line's kong model, its ${…} filled: what --help
// shows, for tests that hold the runbook to it.
func Model() (*kong.Application, error) {
	var c commandLine
	parser, err := kong.New(&c, kong.Vars(flagVars()))
	if err != nil {
		return nil, err
	}
	return parser.Model, nil
}

// Run runs wlproj with args (without the program name) and returns its
// exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	var c commandLine
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
		if err := runTraced(kctx, &c.globals); err != nil {
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

// exitCode is what kong's Exit panics with, so that Run returns the code
// instead of the process exiting.
type exitCode int
