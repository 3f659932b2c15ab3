package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

type docCmd struct {
	dbFlags
	projectionsFlags
	Entity     string `arg:"" help:"The document as the search index's _id: entity_type:entity_id, e.g. book:42, with a ':' or '%' in the type percent-encoded (crm%3Acontact:42)."`
	Projection string `help:"The projection whose ledger to read." default:"${search_projection}"`
	All        bool   `help:"Also list done events; this reads the whole outbox table."`
	JSON       bool   `name:"json" help:"Print one JSON object."`
}

func (c *docCmd) Help() string {
	return "Shows what the applied-version ledger remembers of a document (the newest version its projection " +
		"confirmed, and whether that was a delete) next to the document's events that can still change it."
}

func (c *docCmd) Run(g *globals) error {
	entityType, entityID, ok := projection.ParseDocumentID(c.Entity)
	if !ok {
		return commandError(c, usagef("ENTITY %q: want the document's _id, entity_type:entity_id, e.g. book:42 "+
			"(a ':' or '%%' in the type percent-encoded: crm%%3Acontact:42)", c.Entity))
	}
	known, err := c.names()
	if err != nil {
		return commandError(c, badFile(err))
	}
	if !slices.Contains(known, c.Projection) {
		// Shown all the same: a projection removed from the file keeps its
		// ledger and events until the retention, and a misspelt one says so.
		g.logger.Warn().Str("projection", c.Projection).Strs("configured", known).
			Msg("not a configured projection: its ledger and events, if any, are shown all the same")
	}
	return opsRun(g, c, func(ctx context.Context, conn *pgx.Conn) error {
		d, err := outbox.ReadDocument(ctx, conn, c.Projection, entityType, entityID, c.All)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSONLines(g.stdout, []outbox.Document{d})
		}
		writeDocument(g.stdout, d)
		return nil
	})
}

func writeDocument(w io.Writer, d outbox.Document) {
	switch a := d.Applied; {
	case a == nil:
		fmt.Fprintf(w, "ledger: %s %s:%s was never applied\n", d.Projection, d.EntityType, d.EntityID)
	case a.Deleted:
		fmt.Fprintf(w, "ledger: %s %s:%s deleted at version %d by event %d, %s\n", d.Projection, d.EntityType, d.EntityID,
			a.Version, a.EventID, formatTime(*d.AppliedAt))
	default:
		fmt.Fprintf(w, "ledger: %s %s:%s at version %d by event %d, %s\n", d.Projection, d.EntityType, d.EntityID,
			a.Version, a.EventID, formatTime(*d.AppliedAt))
	}
	if len(d.Events) == 0 {
		fmt.Fprintln(w, "no events (done ones are listed with --all, and are pruned after the retention)")
		return
	}
	writeDocEvents(w, d.Events)
	if d.Omitted > 0 {
		fmt.Fprintf(w, "%d older done or discarded events not listed\n", d.Omitted)
	}
}

// writeDocEvents is the table of a document's events; an archived one's
// status says so, with when.
func writeDocEvents(w io.Writer, events []outbox.DocEvent) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOP\tVERSION\tSTATUS\tREASON\tCREATED\tPROCESSED")
	for _, e := range events {
		status := e.Status
		if e.ArchivedAt != nil {
			status += ", archived " + formatTime(*e.ArchivedAt)
		}
		processed := "-"
		if e.ProcessedAt != nil {
			processed = formatTime(*e.ProcessedAt)
		}
		reason := ""
		if e.ErrorReason != nil {
			reason = *e.ErrorReason
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\n", e.ID, e.Op, e.Version, status, dash(reason), formatTime(e.CreatedAt), processed)
	}
	tw.Flush()
}
