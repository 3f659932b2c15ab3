package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/migrations"
)

type migrateCmd struct {
	dbFlags
	ExpectDB    string        `name:"expect-db" help:"Refuse to migrate unless the connected database has this name, typed from the change ticket; required except with --dry-run." env:"MIGRATE_EXPECT_DB"`
	ExpectHost  string        `help:"Refuse to migrate unless connected to this host (as written in the URL, or the server address)." env:"MIGRATE_EXPECT_HOST"`
	ExpectPort  int           `help:"Refuse to migrate unless connected to this port." env:"MIGRATE_EXPECT_PORT"`
	DryRun      bool          `name:"dry-run" help:"List the migrations that would run and the lock each statement takes; change nothing."`
	LockTimeout time.Duration `name:"lock-timeout" help:"How long one statement waits for a lock before it gives up and retries, so that the application's writes never queue behind it longer [${migrate_lock_timeout_range}]." env:"MIGRATE_LOCK_TIMEOUT" default:"${migrate_lock_timeout}" field:"LockTimeout"`
	To          int64         `name:"to" help:"Apply migrations up to this version only (0: all); with --down, the version to go back to." env:"MIGRATE_TO" field:"UpTo"`
	Down        bool          `name:"down" help:"Roll back: undo every migration after --to, newest first, with the same lock timeout and retries; audited (--by, --why). Runbook: Rollback."`
	By          string        `help:"With --down: who is rolling back; recorded in the audit row. Required with --down." placeholder:"WHO" field:"By"`
	Why         string        `help:"With --down: why, e.g. the incident or the ticket; recorded in the audit row. Required with --down." placeholder:"TEXT" field:"Why"`
	LockWait    time.Duration `name:"lock-wait" help:"How long a statement keeps retrying its lock before the migration fails, naming the session in its way [${migrate_lock_wait_range}]." env:"MIGRATE_LOCK_WAIT" default:"${migrate_lock_wait}" field:"LockWait"`
}

// The lock flags' defaults and ranges live in the migrations package; they
// are registered here, next to the flags, rather than in vars.go.
func init() {
	durationVars["migrate_lock_timeout"] = durationVar{migrations.LockTimeoutDefault, migrations.LockTimeoutRange}
	durationVars["migrate_lock_wait"] = durationVar{migrations.LockWaitDefault, migrations.LockWaitRange}
}

func (c *migrateCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(g.context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	want := migrations.Expect{Database: c.ExpectDB, Host: c.ExpectHost, Port: c.ExpectPort}
	cfg := migrations.Config{LockTimeout: c.LockTimeout, LockWait: c.LockWait, UpTo: c.To, BeforeConnect: pgpool.BeforeConnect}
	if c.Down {
		cfg.UpTo = 0
	}
	if err := cfg.Validate(); err != nil {
		return renameFields(c, err)
	}
	if _, err := parseURL(c.DatabaseURL); err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	if c.ExpectDB == "" && !c.DryRun {
		// The guard is the point: a URL copied from the wrong env file
		// would otherwise change whatever database it reaches.
		return &exitError{code: exitUsage, err: errors.New("--expect-db (MIGRATE_EXPECT_DB) is required: name the database you mean to migrate, " +
			"typed from the change ticket, not taken from the URL; nothing was changed")}
	}
	if c.Down {
		return c.rollback(ctx, g, want, cfg)
	}
	if c.DryRun {
		plan, err := migrations.DryRun(ctx, c.DatabaseURL, want, cfg)
		if err != nil {
			return err
		}
		plan.Write(g.stdout)
		return nil
	}
	res, err := migrations.Run(ctx, c.DatabaseURL, want, cfg, g.logger)
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

// rollback is migrate --down: checked whole before anything connects, then
// migrations.Down, which refuses what the database makes impossible and
// audits the rest before it undoes anything.
func (c *migrateCmd) rollback(ctx context.Context, g *globals, want migrations.Expect, cfg migrations.Config) error {
	if c.DryRun {
		return &exitError{code: exitUsage, err: errors.New("--dry-run lists what would be applied, not undone: leave it out of --down; nothing was changed")}
	}
	if c.To <= 0 {
		return &exitError{code: exitUsage, err: errors.New("--to is required with --down: the version to go back to, e.g. 16 for the previous release; nothing was changed")}
	}
	rb := migrations.Rollback{To: c.To, By: c.By, Why: c.Why}
	res, err := migrations.Down(ctx, c.DatabaseURL, want, cfg, rb, g.logger)
	var invalid *bounds.FieldError
	if errors.As(err, &invalid) {
		names := flagNames(c)
		names["To"] = names["UpTo"] // Rollback's field, the same flag
		return &exitError{code: exitUsage, err: fmt.Errorf("%w; nothing was changed", bounds.Rename(err, names))}
	}
	if err != nil {
		return err
	}
	g.logger.Info().Str("target", res.Target.String()).Ints64("undone", res.Applied).Int64("from", res.From).
		Int64("version", res.Current).Str("by", c.By).Str("why", c.Why).Msg("migrate down done")
	fmt.Fprintf(g.stdout, "undid %v (audited), schema now at version %d (%s): roll the binaries back now\n", res.Applied, res.Current, res.Target)
	return nil
}
