package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/wlproj/wlproj/migrations"
)

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
