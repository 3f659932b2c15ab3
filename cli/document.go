package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

type docCmd struct {
	dbFlags
	Entity     string `arg:"" help:"The document as entity_type:entity_id (the search index's _id), e.g. book:42."`
	Projection string `help:"The projection whose ledger to read." default:"${search_projection}"`
	All        bool   `help:"Also list done events; this reads the whole outbox table."`
	JSON       bool   `name:"json" help:"Print one JSON object."`
}

func (c *docCmd) Help() string {
	return "Shows what the applied-version ledger remembers of a document (the newest version its projection " +
		"confirmed, and whether that was a delete) next to the document's events that can still change it."
}

func (c *docCmd) Run(g *globals) error {
	entityType, entityID, ok := strings.Cut(c.Entity, ":")
	if !ok || entityType == "" || entityID == "" {
		return commandError(c, usagef("ENTITY %q: want entity_type:entity_id, e.g. book:42", c.Entity))
	}
	return opsRun(c, func(ctx context.Context, conn *pgx.Conn) error {
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
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOP\tVERSION\tSTATUS\tREASON\tCREATED\tPROCESSED")
	for _, e := range d.Events {
		processed := "-"
		if e.ProcessedAt != nil {
			processed = formatTime(*e.ProcessedAt)
		}
		reason := ""
		if e.ErrorReason != nil {
			reason = *e.ErrorReason
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\n", e.ID, e.Op, e.Version, e.Status, dash(reason), formatTime(e.CreatedAt), processed)
	}
	tw.Flush()
}
