package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

type rebuildCmd struct {
	dbFlags
	elasticFlags
	ElasticIndex string        `help:"The alias readers and the replicas use; if it is a concrete index, the first rebuild turns it into an alias." env:"ELASTIC_INDEX" default:"search"`
	Projection   string        `help:"Projection to rebuild (only search has an index)." default:"search"`
	FromTable    string        `name:"from-table" help:"The source-of-truth table: entity_type text, entity_id text, doc jsonb, version bigint." placeholder:"TABLE"`
	Mapping      string        `help:"JSON file with the new index's settings and mappings (as PUT /<index> takes); default: the current index's." type:"existingfile" placeholder:"FILE"`
	EmitOutbox   bool          `name:"emit-outbox" help:"Enqueue an upsert event per source row for the leader to project, instead of bulk-loading (run as a role that may insert events)."`
	EmitRate     int           `help:"--emit-outbox: rows enqueued per second at most (unset: see below)."`
	EmitBacklog  int           `help:"--emit-outbox: enqueue only while at most this many events of the projection are pending (unset: see below)."`
	BulkSize     int           `help:"Rows per bulk request, as the daemon's [${bulk_size_range}]." default:"${bulk_size}"`
	Concurrency  int           `help:"Bulk requests in flight, as the daemon's [${concurrency_range}]." default:"${concurrency}"`
	MaxPayload   int           `name:"max-payload-bytes" help:"Largest doc loaded; larger ones are refused as payload_invalid, as the daemon does." env:"OUTBOX_MAX_PAYLOAD_BYTES" default:"${max_payload_bytes}"`
	Confirm      time.Duration `name:"confirm-timeout" help:"How long to wait for the leader to confirm it writes to the new index too (unset: see below)."`
	DryRun       bool          `name:"dry-run" help:"Check the source table, the mapping and the alias, say what would happen, change nothing."`
	Cleanup      bool          `help:"Delete the indexes that finished rebuilds replaced (and that aborted ones built)."`
	Abort        bool          `help:"Close the open rebuild without swapping; --cleanup deletes its index later."`
	Rollback     bool          `help:"Move the alias back to the index the newest rebuild replaced (the leader kept writing it since the swap); --cleanup deletes the rebuild's index later."`
	Progress     string        `help:"Progress display: a bar on a terminal, JSON lines otherwise." enum:"auto,bar,json" default:"auto"`
	By           string        `help:"Who is rebuilding; recorded in the audit. Required." placeholder:"WHO"`
	Why          string        `help:"Why, e.g. the mapping change or the ticket; recorded in the audit. Required." placeholder:"TEXT"`
}

func (c *rebuildCmd) Help() string {
	return "Builds a new index named <ELASTIC_INDEX>-<UTC time> from --from-table, while the leader writes live events to " +
		"both indexes, then swaps the alias ELASTIC_INDEX to it in one _aliases call; the old index stays, and the leader keeps writing it " +
		"for a rollback (--rollback), until --cleanup. " +
		"Interrupted, it leaves the alias as it was; the same command resumes it. " +
		"Exit codes: 0 done, 1 error or stopped (resumable), 2 bad input, 3 refused (busy, nothing to clean, nothing to roll back to, another rebuild open); " +
		"bad input and refusals change nothing. " + fmt.Sprintf("Unset, --emit-rate is %d rows/s, --emit-backlog %d events, "+
		"--confirm-timeout %s.", rebuild.EmitRateDefault, rebuild.EmitBacklogDefault, rebuild.ConfirmTimeoutDefault)
}

// rebuildFlags names rebuild.Config's fields by their flags.
var rebuildFlags = map[string]string{"By": "--by", "Why": "--why", "Alias": "ELASTIC_INDEX", "BulkSize": "--bulk-size",
	"Concurrency": "--concurrency", "EmitRate": "--emit-rate", "EmitBacklog": "--emit-backlog",
	"ConfirmTimeout": "--confirm-timeout", "MaxPayloadBytes": "--max-payload-bytes"}

func (c *rebuildCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, pool, err := c.config(ctx)
	if err != nil {
		return c.exit(err)
	}
	defer pool.Close()
	out := newRebuildOutput(g.stdout, c.Progress, c.Cleanup || c.Abort || c.Rollback)
	cfg.Progress, cfg.OnRefused = out, out.refused
	switch {
	case c.Cleanup:
		cleaned, err := rebuild.Cleanup(ctx, cfg)
		out.cleaned(cleaned)
		return c.exit(err)
	case c.Abort:
		row, err := rebuild.Abort(ctx, cfg)
		if err == nil {
			out.aborted(row)
		}
		return c.exit(err)
	case c.Rollback:
		row, err := rebuild.Rollback(ctx, cfg)
		if err == nil {
			out.rolledBack(row)
		}
		return c.exit(err)
	case c.DryRun:
		plan, err := rebuild.DryRun(ctx, cfg)
		if err == nil {
			out.plan(plan)
		}
		return c.exit(err)
	}
	rep, err := rebuild.Run(ctx, cfg)
	out.done(rep, err)
	return c.exit(err)
}

// config checks the flags and connects; nothing is read yet.
func (c *rebuildCmd) config(ctx context.Context) (rebuild.Config, *pgxpool.Pool, error) {
	switch {
	case btoi(c.Cleanup)+btoi(c.Abort)+btoi(c.Rollback) > 1,
		(c.Cleanup || c.Abort || c.Rollback) && (c.DryRun || c.EmitOutbox || c.FromTable != "" || c.Mapping != ""):
		return rebuild.Config{}, nil, usagef("--cleanup, --abort and --rollback take no other action flag")
	case strings.TrimSpace(c.By) == "" || strings.TrimSpace(c.Why) == "":
		return rebuild.Config{}, nil, usagef("--by and --why are required: say who is rebuilding and why")
	case !c.Cleanup && !c.Abort && !c.Rollback && c.FromTable == "":
		return rebuild.Config{}, nil, usagef("--from-table is required: the source-of-truth table to rebuild from")
	}
	// kong applied the flags' defaults: a zero here is the operator's.
	if err := bounds.First(bounds.Check("BulkSize", c.BulkSize, rebuild.BulkSizeRange),
		bounds.Check("Concurrency", c.Concurrency, rebuild.ConcurrencyRange)); err != nil {
		return rebuild.Config{}, nil, err
	}
	cfg := rebuild.Config{Projection: c.Projection, Alias: c.ElasticIndex, SourceTable: c.FromTable,
		EmitOutbox: c.EmitOutbox, EmitRate: c.EmitRate, EmitBacklog: c.EmitBacklog, BulkSize: c.BulkSize,
		Concurrency: c.Concurrency, MaxPayloadBytes: c.MaxPayload, ConfirmTimeout: c.Confirm, By: c.By, Why: c.Why}
	if c.Mapping != "" {
		var err error
		if cfg.Mapping, err = os.ReadFile(c.Mapping); err != nil {
			return cfg, nil, usagef("--mapping: %v", err)
		}
		cfg.MappingFile = c.Mapping
	}
	var err error
	cfg.Client, err = projection.NewElasticClient(projection.ElasticOptions{URL: c.ElasticURL, Username: c.ElasticUsername,
		Password: c.ElasticPassword, CAFile: c.ElasticCAFile, Timeout: seconds(c.ElasticTimeout)})
	if err != nil {
		return cfg, nil, err
	}
	poolCfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return cfg, nil, usagef("DATABASE_URL: %w", err)
	}
	poolCfg.MaxConns = int32(c.Concurrency + 4)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "wlproj-rebuild:" + c.By
	cfg.Pool, err = pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return cfg, nil, fmt.Errorf("database: %w", err)
	}
	return cfg, cfg.Pool, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// exit gives an error its exit code and the operator's words, with the
// credentials scrubbed.
func (c *rebuildCmd) exit(err error) error {
	if err == nil {
		return nil
	}
	code := exitFailure
	var input *rebuild.InputError
	var refused *rebuild.RefusedError
	var busy *rebuild.BusyError
	var usage usageError
	var field *bounds.FieldError
	switch {
	case errors.As(err, &input), errors.As(err, &usage), errors.As(err, &field):
		code = exitUsage
	case errors.As(err, &refused), errors.As(err, &busy):
		code = exitRefused
	}
	msg := redact(bounds.Rename(err, rebuildFlags).Error(), c.DatabaseURL)
	return &exitError{code: code, err: redactedError{msg: msg, err: err}}
}

// writeJSON prints v as one line.
func writeJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", b)
}

// reasons is "mapping_error 3, payload_invalid 1", most first.
func reasons(by map[string]int64) string {
	type rc struct {
		r string
		n int64
	}
	var list []rc
	for r, n := range by {
		list = append(list, rc{r, n})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n || (list[i].n == list[j].n && list[i].r < list[j].r) })
	parts := make([]string, len(list))
	for i, x := range list {
		parts[i] = fmt.Sprintf("%s %d", x.r, x.n)
	}
	return strings.Join(parts, ", ")
}

// rebuildOutput shows a rebuild's progress: on a terminal a bar with rate
// and ETA (progressbar, on stderr) and text on stdout; otherwise one JSON
// object per line on stdout, for logs and scripts.
type rebuildOutput struct {
	w    io.Writer
	json bool

	mu      sync.Mutex
	bar     *progressbar.ProgressBar
	phase   string
	total   int64
	count   int64
	started time.Time
	printed time.Time
}

// rebuildBarTo is where the bar is drawn; tests silence it.
var rebuildBarTo io.Writer = os.Stderr

// jsonProgressEvery spaces the JSON progress lines.
const jsonProgressEvery = time.Second

func newRebuildOutput(w io.Writer, mode string, quiet bool) *rebuildOutput {
	json := mode == "json" || (mode == "auto" && !isatty.IsTerminal(os.Stderr.Fd()))
	if quiet && mode == "auto" {
		json = false
	}
	return &rebuildOutput{w: w, json: json}
}

// Phase implements rebuild.Progress.
func (o *rebuildOutput) Phase(name string, total int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finishBar()
	o.phase, o.total, o.count, o.started = name, total, 0, time.Now()
	if o.json {
		o.progressLine()
		return
	}
	o.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(rebuildBarTo), progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("rows"),
		progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionFullWidth())
}

// Add implements rebuild.Progress.
func (o *rebuildOutput) Add(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.show(o.count + n)
}

// Set implements rebuild.Progress.
func (o *rebuildOutput) Set(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.show(n)
}

// show makes n the count done and shows it; called with o.mu held.
func (o *rebuildOutput) show(n int64) {
	o.count = n
	if o.bar != nil {
		_ = o.bar.Set64(n)
	}
	if o.json && (time.Since(o.printed) >= jsonProgressEvery || n == o.total) {
		o.progressLine()
	}
}

func (o *rebuildOutput) progressLine() {
	secs := time.Since(o.started).Seconds()
	line := map[string]any{"event": "progress", "phase": o.phase, "done": o.count, "total": o.total}
	if secs > 0 && o.count > 0 {
		rate := float64(o.count) / secs
		line["rows_per_second"] = math.Round(rate)
		line["eta_seconds"] = math.Round(float64(o.total-o.count)/rate*10) / 10
	}
	writeJSON(o.w, line)
	o.printed = time.Now()
}

func (o *rebuildOutput) finishBar() {
	if o.bar != nil {
		_ = o.bar.Finish()
		fmt.Fprintln(rebuildBarTo)
		o.bar = nil
	}
}

// Note implements rebuild.Progress.
func (o *rebuildOutput) Note(msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.json {
		writeJSON(o.w, map[string]any{"event": "note", "message": msg})
		return
	}
	if o.bar != nil {
		_ = o.bar.Clear()
	}
	fmt.Fprintln(o.w, msg)
}

// refused reports one refused row as it is found.
func (o *rebuildOutput) refused(r rebuild.Refused) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.json {
		writeJSON(o.w, map[string]any{"event": "refused", "row": r})
		return
	}
	if o.bar != nil {
		_ = o.bar.Clear()
	}
	fmt.Fprintf(o.w, "refused %s:%s version %d: %s: %s\n", r.EntityType, r.EntityID, r.Version, r.Reason, r.Message)
}

func (o *rebuildOutput) done(rep rebuild.Report, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finishBar()
	if err != nil && rep.Rebuild.ID == 0 {
		return
	}
	if o.json {
		writeJSON(o.w, map[string]any{"event": "done", "ok": err == nil, "report": rep})
		return
	}
	if err != nil {
		return // the error says where it stopped and what to do
	}
	r := rep.Rebuild
	rate := 0.0
	if rep.Seconds > 0 {
		rate = float64(rep.Loaded+rep.Superseded+rep.Refused) / rep.Seconds
	}
	fmt.Fprintf(o.w, "rebuild #%d done: %d source rows from %s into %s in %.1fs (%.0f rows/s)\n",
		r.ID, rep.Rows, r.SourceTable, r.Target, rep.Seconds, rate)
	fmt.Fprintf(o.w, "  loaded %d, superseded %d (the ledger or the index had newer), refused %d\n", rep.Loaded, rep.Superseded, rep.Refused)
	if rep.Refused > 0 {
		fmt.Fprintf(o.w, "  refused by reason: %s\n", reasons(rep.RefusedByReason))
	}
	fmt.Fprintf(o.w, "  %s had %d documents before the swap; %s has %d\n", r.Alias, rep.DocsBefore, r.Target, rep.DocsAfter)
}

func (o *rebuildOutput) plan(p rebuild.Plan) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "dry_run", "plan": p})
		return
	}
	for _, line := range p.Steps {
		fmt.Fprintln(o.w, line)
	}
	fmt.Fprintln(o.w, "dry run: nothing changed")
}

func (o *rebuildOutput) aborted(r rebuild.Row) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "aborted", "rebuild": r})
		return
	}
	fmt.Fprintf(o.w, "aborted rebuild #%d: %s still points at %s; the leader stops writing to %s, "+
		"which wlproj rebuild --cleanup deletes\n", r.ID, r.Alias, dash(r.OldIndex), r.Target)
}

func (o *rebuildOutput) rolledBack(r rebuild.Row) {
	if o.json {
		writeJSON(o.w, map[string]any{"event": "rolled_back", "rebuild": r})
		return
	}
	fmt.Fprintf(o.w, "rolled back rebuild #%d: %s points at %s again; the leader stops writing to %s, "+
		"which wlproj rebuild --cleanup deletes\n", r.ID, r.Alias, r.OldIndex, r.Target)
}

func (o *rebuildOutput) cleaned(done []rebuild.Cleaned) {
	for _, c := range done {
		if o.json {
			writeJSON(o.w, map[string]any{"event": "cleaned", "cleaned": c})
			continue
		}
		if c.Released != "" {
			fmt.Fprintf(o.w, "rebuild #%d: %s\n", c.Rebuild.ID, c.Note)
			continue
		}
		if c.Deleted != "" {
			fmt.Fprintf(o.w, "rebuild #%d: deleted index %s\n", c.Rebuild.ID, c.Deleted)
		} else {
			fmt.Fprintf(o.w, "rebuild #%d: closed; no index of it was left to delete\n", c.Rebuild.ID)
		}
	}
}
