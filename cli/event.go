package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/replica"
)

type eventCmd struct {
	dbFlags
	projectionsFlags
	ID       int64  `arg:"" help:"The event's id."`
	JSON     bool   `name:"json" help:"Print one JSON object."`
	Unmasked bool   `help:"Show the payload with its masked fields: --by and --why are required, and the read is audited (action unmask)."`
	By       string `help:"Who reads the payload unmasked; recorded in the audit row. Required with --unmasked." placeholder:"WHO"`
	Why      string `help:"Why, e.g. the ticket; recorded in the audit row. Required with --unmasked." placeholder:"TEXT"`
}

func (c *eventCmd) Help() string {
	return "Shows one event of the outbox or the dead letter whole. The fields its projection masks (mask: in the projections " +
		"file) show ***, in the payload and in any error text that quotes them; --unmasked shows the payload as it was " +
		"written, and records who read it and why in the audit log."
}

func (c *eventCmd) Run(g *globals) error {
	switch {
	case c.ID <= 0:
		return commandError(c, usagef("ID %d: want an event id, a positive number", c.ID))
	case c.Unmasked && (strings.TrimSpace(c.By) == "" || strings.TrimSpace(c.Why) == ""):
		return commandError(c, usagef("--unmasked needs --by and --why: the read is audited with who and why"))
	case !c.Unmasked && (c.By != "" || c.Why != ""):
		return commandError(c, usagef("--by and --why go with --unmasked, the one audited read"))
	}
	masks, err := c.masks()
	if err != nil {
		return commandError(c, badFile(err))
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		d, err := replay.Event(ctx, conn, c.ID)
		if err != nil {
			return err
		}
		m := masks[d.Projection]
		if c.Unmasked {
			if m.Empty() {
				return usagef("projection %s masks nothing: the event shows its payload whole without --unmasked", d.Projection)
			}
			if err := auditUnmasked(ctx, conn, d, c.By, c.Why); err != nil {
				return err
			}
		}
		d.Mask(m, c.Unmasked)
		if c.JSON {
			return writeJSONLines(g.stdout, []replay.EventDetail{d})
		}
		writeEvent(g.stdout, d)
		return nil
	})
}

// masks are the projections' masks, read from the projections file
// without the engines' secrets; none without a file.
func (f projectionsFlags) masks() (map[string]*mask.Mask, error) {
	if f.ProjectionsFile == "" {
		return nil, nil
	}
	specs, err := replica.LoadProjectionsUnresolved(f.ProjectionsFile)
	return specs.Masks(), err
}

// auditUnmasked records the read before anything is shown.
func auditUnmasked(ctx context.Context, conn *pgx.Conn, d replay.EventDetail, by, why string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, _, err := outbox.WriteAudit(ctx, tx, replay.UnmaskAudit(d, strings.TrimSpace(by), strings.TrimSpace(why)))
		return err
	})
}

func writeEvent(w io.Writer, d replay.EventDetail) {
	fmt.Fprintf(w, "event %d: %s %s:%s %s, %s, attempts %d, replays %d\n", d.ID, d.Projection, d.EntityType, d.EntityID,
		d.Op, d.Status, d.Attempts, d.ReplayCount)
	if d.ErrorReason != "" {
		fmt.Fprintf(w, "last error (%s / %s): %s\n", d.ErrorClass, d.ErrorReason, d.LastError)
	}
	fmt.Fprintf(w, "payload:\n%s\n", d.Payload)
	for _, h := range d.History {
		what := h.Event
		if what == "" {
			what = fmt.Sprintf("attempt %d failed", h.Attempt)
		}
		fmt.Fprintf(w, "%s  %s  %s\n", formatTime(h.At), what, dash(h.Error+h.Why))
	}
}
