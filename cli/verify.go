package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/verify"
)

type verifyCmd struct {
	dbFlags
	elasticFlags
	projectionsFlags
	ElasticIndex string `help:"The index or alias verified. With a projections file, the projection's index instead." env:"ELASTIC_INDEX" default:"${elastic_index}" field:"Index"`
	Projection   string `help:"Search projection verified: search without a projections file, else one of the file's, whose engine, index and source table it takes." default:"${search_projection}"`
	FromTable    string `name:"from-table" help:"The source-of-truth table (entity_type, entity_id, doc, version); default: the projection's source_table in the projections file; without either the index is compared with the applied-version ledger alone." placeholder:"TABLE"`
	JSON         bool   `name:"json" help:"Print one JSON object."`
	Sample       int    `help:"Document ids shown per kind [${verify_sample_range}]." default:"${verify_sample}" field:"Sample"`
	Rate         int    `help:"Documents checked per second at most (each side of the comparison keeps to it); 0: no cap." default:"0" field:"Rate"`

	Repair bool   `help:"Queue an outbox event for each drifted document that one can put right (an upsert from --from-table for missing and stale, a delete for extra and resurrected); the leader applies them. Queued once the verify is over (as it finds them, with --yes) in short transactions, each with its own audit row."`
	By     string `help:"With --repair: who is repairing; recorded in the audit. Required." placeholder:"WHO" field:"By"`
	Why    string `help:"With --repair: why, e.g. the ticket; recorded in the audit. Required." placeholder:"TEXT" field:"Why"`
	DryRun bool   `name:"dry-run" help:"With --repair: verify and say what would be queued; change nothing."`
	Max    int    `help:"With --repair: refuse, changing nothing, when more documents than this would be repaired [${verify_repair_max_range}]." default:"${verify_repair_max}" field:"Max"`
	Yes    bool   `help:"With --repair: lift --max."`
}

func (c *verifyCmd) Help() string {
	return "With --from-table, first reads the whole index (a scroll, versions only) and the whole table side by side: " +
		"equal as wholes, the index is clean. Otherwise, and without --from-table, looks each page of the index up in the database " +
		"and each page of the database's keys up in the index; " +
		"a document that differs is checked again as it is now, and one with an event pending or processing is the drain's, not drift. " +
		"Kinds: missing (in the source, or live in the ledger, not in the index), stale (older in the index), " +
		"resurrected (in the index, deleted in the ledger), extra (in the index, not in the source, not deleted in the ledger; " +
		"only with --from-table), ahead (newer in the index than in the source: a database restored from an older backup; " +
		"only with --from-table, not repairable: rebuild). " +
		"--repair runs as a role that may insert events (the owner); without --from-table it can only delete (extra, resurrected). " +
		"Exit codes: 0 clean, 4 drift found (repaired or not), 1 error, 2 bad input (nothing read or changed), " +
		"3 repair refused by --max (nothing changed)."
}

func (c *verifyCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(g.context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, pool, err := c.config(ctx)
	if err != nil {
		return commandError(c, err)
	}
	defer pool.Close()
	if !c.Repair {
		rep, err := verify.Run(ctx, cfg)
		if err != nil {
			return commandError(c, err)
		}
		c.print(g.stdout, rep, nil)
		return driftExit(rep)
	}
	fix, err := verify.Repair(ctx, cfg, verify.RepairRequest{By: c.By, Why: c.Why, DryRun: c.DryRun, Max: c.Max, Yes: c.Yes})
	var refused *verify.RefusedError
	if err != nil && !errors.As(err, &refused) {
		return commandError(c, err)
	}
	c.print(g.stdout, fix.Report, &fix)
	if refused != nil {
		return commandError(c, err)
	}
	return driftExit(fix.Report)
}

// driftExit is exit 4 when rep found drift.
func driftExit(rep verify.Report) error {
	if n := rep.Drift(); n > 0 {
		return &exitError{code: exitDrift, err: fmt.Errorf("drift: %d documents differ from the %s", n, truth(rep))}
	}
	return nil
}

func (c *verifyCmd) print(w io.Writer, rep verify.Report, fix *verify.RepairReport) {
	if c.JSON {
		j := verifyJSON(rep)
		if fix != nil {
			j.Repair = repairJSON(*fix)
		}
		writeJSON(w, j)
		return
	}
	writeVerify(w, rep)
	if fix != nil {
		writeRepair(w, *fix, c.Max)
	}
}

// config checks the flags and connects; nothing is read yet.
func (c *verifyCmd) config(ctx context.Context) (verify.Config, *pgxpool.Pool, error) {
	switch {
	case !c.Repair && (c.By != "" || c.Why != "" || c.DryRun || c.Yes):
		return verify.Config{}, nil, usagef("--by, --why, --dry-run and --yes go with --repair")
	case c.Repair && (strings.TrimSpace(c.By) == "" || strings.TrimSpace(c.Why) == ""):
		return verify.Config{}, nil, usagef("--by and --why are required: say who is repairing and why")
	}
	if err := bounds.First(bounds.Check("Max", c.Max, verify.RepairMaxRange), bounds.Check("Sample", c.Sample, verify.SampleRange),
		bounds.Check("Rate", c.Rate, verify.RateRange)); err != nil {
		return verify.Config{}, nil, err
	}
	target, err := c.target(c.Projection, searchTarget{Engine: c.options(), Alias: c.ElasticIndex, SourceTable: c.FromTable})
	if err != nil {
		return verify.Config{}, nil, err
	}
	cfg := verify.Config{Index: target.Alias, Projection: c.Projection, SourceTable: target.SourceTable, Sample: c.Sample, Rate: c.Rate}
	if cfg.Client, err = projection.NewElasticClient(target.Engine); err != nil {
		return cfg, nil, err
	}
	cfg.Pool, err = pgpool.Open(ctx, c.DatabaseURL, 4, "wlproj-verify")
	return cfg, cfg.Pool, err
}

// truth names what the index was compared with.
func truth(rep verify.Report) string {
	if rep.SourceTable != "" {
		return "source table " + rep.SourceTable
	}
	return "applied-version ledger"
}

// verifyReportJSON is the --json shape: the counts as integer fields of
// their own, for scripts, and the samples by kind.
type verifyReportJSON struct {
	Projection  string                   `json:"projection"`
	Index       string                   `json:"index"`
	SourceTable string                   `json:"source_table,omitempty"`
	Checked     int64                    `json:"checked"`
	Missing     int64                    `json:"missing"`
	Stale       int64                    `json:"stale"`
	Extra       int64                    `json:"extra"`
	Resurrected int64                    `json:"resurrected"`
	Ahead       int64                    `json:"ahead"`
	InFlight    int64                    `json:"in_flight"`
	Samples     map[verify.Kind][]string `json:"samples"`
	Compared    string                   `json:"compared"`
	Seconds     float64                  `json:"seconds"`
	Repair      *repairReportJSON        `json:"repair,omitempty"`
}

// repairReportJSON is what --repair queued, or on a dry run would.
type repairReportJSON struct {
	DryRun       bool                  `json:"dry_run"`
	Queued       map[verify.Kind]int64 `json:"queued"`
	Unrepairable map[string]int64      `json:"unrepairable"`
	FirstEventID int64                 `json:"first_event_id,omitempty"`
	LastEventID  int64                 `json:"last_event_id,omitempty"`
	AuditID      int64                 `json:"audit_id,omitempty"`
	AuditIDs     []int64               `json:"audit_ids,omitempty"`
}

func repairJSON(r verify.RepairReport) *repairReportJSON {
	return &repairReportJSON{DryRun: r.DryRun, Queued: r.Queued, Unrepairable: r.Unrepairable, FirstEventID: r.FirstEventID,
		LastEventID: r.LastEventID, AuditID: r.AuditID, AuditIDs: r.AuditIDs}
}

func verifyJSON(rep verify.Report) verifyReportJSON {
	return verifyReportJSON{Projection: rep.Projection, Index: rep.Index, SourceTable: rep.SourceTable, Checked: rep.Checked,
		Missing: rep.Counts[verify.Missing], Stale: rep.Counts[verify.Stale], Extra: rep.Counts[verify.Extra],
		Resurrected: rep.Counts[verify.Resurrected], Ahead: rep.Counts[verify.Ahead], InFlight: rep.InFlight, Samples: rep.Samples, Compared: rep.Compared,
		Seconds: rep.Took.Seconds()}
}

// writeVerify prints the counts per kind with their samples, and what to
// do about drift.
func writeVerify(w io.Writer, rep verify.Report) {
	how := ""
	if rep.Compared == verify.ComparedFingerprints {
		how = ", equal as wholes (fingerprints)"
	}
	fmt.Fprintf(w, "verified %s (projection %s) against the %s: %d documents in %s%s\n",
		rep.Index, rep.Projection, truth(rep), rep.Checked, formatAge(rep.Took), how)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range verify.Kinds {
		if k == verify.Extra && rep.SourceTable == "" {
			fmt.Fprintf(tw, "  %s\t-\t(needs --from-table: the ledger forgets live documents after the retention)\n", k)
			continue
		}
		if k == verify.Ahead && rep.SourceTable == "" {
			fmt.Fprintf(tw, "  %s\t-\t(needs --from-table: the ledger is restored with the database)\n", k)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", k, rep.Counts[k], strings.Join(rep.Samples[k], " "))
	}
	tw.Flush()
	if rep.InFlight > 0 {
		fmt.Fprintf(w, "  %d more differed while the drain was moving them (an event pending, processing, or applied as they were read): not drift\n", rep.InFlight)
	}
	if rep.Drift() == 0 {
		fmt.Fprintln(w, "clean: the index holds what the "+truth(rep)+" says")
		return
	}
	fmt.Fprintf(w, "drift: %d documents; see the runbook's SOP \"the index disagrees with the database\"\n", rep.Drift())
}

// unrepairable says why a document gets no repair event.
var unrepairable = map[string]string{
	verify.NoSource:  "missing or stale, and no --from-table to take the document from",
	verify.NoEntity:  "an _id that is not entity_type:entity_id, which no event addresses: delete it by hand",
	verify.NoVersion: "a source row with a NULL version",
	verify.LedgerLive: "extra, but the ledger says live at that version: the source table lacks a row the outbox wrote; " +
		"fix the table or send the delete event",
	verify.IndexAhead: "ahead: the index holds a newer version than the source row, which the engine keeps over an older one; " +
		"rebuild the index from the table (the runbook's \"Backups and restore\")",
}

// writeRepair says what --repair queued, or would, and what comes next.
func writeRepair(w io.Writer, r verify.RepairReport, maxDocs int) {
	parts := make([]string, 0, len(verify.Kinds))
	for _, k := range verify.Kinds {
		if n := r.Queued[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	queued := strings.Join(parts, ", ")
	for _, why := range []string{verify.NoSource, verify.NoEntity, verify.NoVersion, verify.LedgerLive, verify.IndexAhead} {
		if n := r.Unrepairable[why]; n > 0 {
			fmt.Fprintf(w, "not repairable: %d (%s)\n", n, unrepairable[why])
		}
	}
	switch total := r.QueuedTotal(); {
	case total == 0:
		fmt.Fprintln(w, "repair: nothing to queue")
	case r.DryRun:
		fmt.Fprintf(w, "dry run: would queue %d repair events (%s); nothing changed\n", total, queued)
	case r.AuditID == 0:
		fmt.Fprintf(w, "repair refused: %d documents (%s), more than --max %d; nothing changed\n", total, queued, maxDocs)
	default:
		fmt.Fprintf(w, "repair: queued %d events (%s), ids %d-%d, %s; the leader applies them, "+
			"then run wlproj verify again\n", total, queued, r.FirstEventID, r.LastEventID, auditRows(r.AuditIDs))
		if r.Queued[verify.Missing] > 0 {
			fmt.Fprintln(w, "note: a document deleted by hand in the engine less than index.gc_deletes ago (60s by default) "+
				"refuses its repair; if the next verify still finds it missing, run --repair again after that")
		}
	}
}

// auditRows names a repair's audit rows: one per transaction.
func auditRows(ids []int64) string {
	if len(ids) == 1 {
		return fmt.Sprintf("audit #%d", ids[0])
	}
	return fmt.Sprintf("%d audit rows #%d-#%d", len(ids), ids[0], ids[len(ids)-1])
}
