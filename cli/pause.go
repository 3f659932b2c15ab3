package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

// pauseFlags are what pause and resume take. Exit codes: 0 when the
// projection is now as asked, whether this call changed it or it already
// was (then nothing is written, not even an audit row, and the message says
// so); 1 when the database failed; 2 for a missing --by, --why or
// --projection, or a projection this wlproj does not know.
type pauseFlags struct {
	dbFlags
	projectionsFlags
	Projection string `help:"The projection: one the projections file names, or without a file ${projections_or}." placeholder:"NAME" field:"Projection"`
	By         string `help:"Who is acting; recorded in the state and the audit row. Required." placeholder:"WHO" field:"By"`
	Why        string `help:"Why, e.g. the incident or the ticket; recorded in the state and the audit row. Required." placeholder:"TEXT" field:"Why"`
	JSON       bool   `name:"json" help:"Print the result as one JSON object."`
}

type pauseCmd struct{ pauseFlags }

type resumeCmd struct{ pauseFlags }

func (c *pauseCmd) Run(g *globals) error { return c.set(g, true) }

func (c *resumeCmd) Run(g *globals) error { return c.set(g, false) }

func (f pauseFlags) set(g *globals, paused bool) error {
	known, err := f.names()
	if err != nil {
		return usagef("%s", err)
	}
	return opsRun(g, f, func(ctx context.Context, conn *pgx.Conn) error {
		res, err := outbox.SetPaused(ctx, conn, outbox.PauseRequest{Projection: f.Projection, Paused: paused, By: f.By, Why: f.Why,
			Known: known})
		if err != nil {
			return err
		}
		if f.JSON {
			return writeJSONLines(g.stdout, []outbox.PauseResult{res})
		}
		writePauseResult(g.stdout, res, paused)
		return nil
	})
}

func writePauseResult(w io.Writer, res outbox.PauseResult, paused bool) {
	st := res.State
	switch {
	case !res.Changed && paused:
		fmt.Fprintf(w, "%s is already paused, since %s by %s: %s; nothing changed\n",
			st.Projection, formatTime(st.ChangedAt), st.ChangedBy, st.Why)
	case !res.Changed && st.ChangedBy == "":
		fmt.Fprintf(w, "%s is not paused (it never was); nothing changed\n", st.Projection)
	case !res.Changed:
		fmt.Fprintf(w, "%s is not paused (resumed %s by %s: %s); nothing changed\n",
			st.Projection, formatTime(st.ChangedAt), st.ChangedBy, st.Why)
	case paused:
		fmt.Fprintf(w, "paused %s (audit %d): the leader claims none of its events from its next claim on; "+
			"%d already claimed finish. The other projections carry on. `wlproj resume --projection %s` undoes it.\n",
			st.Projection, res.AuditID, res.InFlight, st.Projection)
	default:
		fmt.Fprintf(w, "resumed %s (audit %d): the leader claims its pending events again, oldest first.\n",
			st.Projection, res.AuditID)
	}
}
