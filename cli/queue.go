package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

// queueCmd groups the commands on the queue's storage itself.
type queueCmd struct {
	Rebase queueRebaseCmd `cmd:"" help:"After the database moved to another Postgres cluster (pg_dump and restore, logical replication, pg_upgrade), make its queue readable there: settle what the old positions confirmed, send the rest. Audited."`
}

// queueRebaseCmd is `wlproj queue rebase`. Exit codes: 0 done (or the dry
// run's counts), 1 the database failed, 2 a missing --by or --why, 3
// refused (nothing to rebase, or --kept-counter contradicted); nothing
// changed then.
type queueRebaseCmd struct {
	dbFlags
	By          string `help:"Who is acting; recorded in the audit row. Required." placeholder:"WHO"`
	Why         string `help:"Why, e.g. the migration's ticket; recorded in the audit row. Required." placeholder:"TEXT"`
	KeptCounter bool   `name:"kept-counter" help:"The new cluster's transaction counter went on from the old one's (pg_upgrade, a file-level copy): keep the positions, record the new cluster only. Refused when any row or position says otherwise."`
	DryRun      bool   `name:"dry-run" help:"Count what the rebase would do, and change nothing."`
	JSON        bool   `name:"json" help:"Print the result as one JSON object."`
}

func (c *queueRebaseCmd) Run(g *globals) error {
	if c.By == "" || c.Why == "" {
		return usagef("--by and --why are required: the rebase is audited; nothing changed")
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		res, err := outbox.Rebase(ctx, conn, outbox.RebaseRequest{By: c.By, Why: c.Why, KeptCounter: c.KeptCounter, DryRun: c.DryRun})
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSONLines(g.stdout, []outbox.RebaseResult{res})
		}
		writeRebase(g.stdout, res)
		return nil
	})
}

func writeRebase(w io.Writer, res outbox.RebaseResult) {
	verb := "rebased"
	if res.DryRun {
		verb = "dry run, nothing changed: would rebase"
	}
	if res.KeptCounter {
		fmt.Fprintf(w, "%s the queue from cluster %d to %d, keeping its positions (the counter went on)", verb, res.Home.Recorded, res.Home.Here)
	} else {
		fmt.Fprintf(w, "%s the queue from cluster %d to %d: %d rows the old positions confirmed are done, %d go to the "+
			"claim (sent again if the old cluster had sent them: a no-op for the engine), %d stay queued for the new position",
			verb, res.Home.Recorded, res.Home.Here, res.Done, res.Pending, res.Left)
	}
	if res.AuditID != 0 {
		fmt.Fprintf(w, " (audit %d). The replicas lead again within %s.\n", res.AuditID, "10 s")
		return
	}
	fmt.Fprintln(w, ".")
}
