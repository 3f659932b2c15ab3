package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

type rebuildCmd struct {
	dbFlags
	elasticFlags
	projectionsFlags
	ElasticIndex string        `help:"The alias readers and the replicas use; if it is a concrete index, the first rebuild turns it into an alias. With a projections file, the projection's index instead." env:"ELASTIC_INDEX" default:"${elastic_index}" field:"Alias"`
	Projection   string        `help:"Search projection to rebuild: search without a projections file, else one of the file's, whose engine, index and source table it takes." default:"${search_projection}"`
	FromTable    string        `name:"from-table" help:"The source-of-truth table: entity_type text, entity_id text, doc jsonb, version bigint; default: the projection's source_table in the projections file." placeholder:"TABLE"`
	Mapping      string        `help:"JSON file with the new index's settings and mappings (as PUT /<index> takes); default: the projections file's mapping_file, else the current index's." type:"existingfile" placeholder:"FILE"`
	EmitOutbox   bool          `name:"emit-outbox" help:"Enqueue an upsert event per source row for the leader to project, instead of bulk-loading (run as a role that may insert events)."`
	EmitRate     int           `help:"--emit-outbox: rows enqueued per second at most (unset: see below)." field:"EmitRate"`
	EmitBacklog  int           `help:"--emit-outbox: enqueue only while at most this many events of the projection are pending (unset: see below)." field:"EmitBacklog"`
	BulkSize     int           `help:"Rows per bulk request, as the daemon's [${bulk_size_range}]." default:"${bulk_size}" field:"BulkSize"`
	Concurrency  int           `help:"Bulk requests in flight, as the daemon's [${concurrency_range}]." default:"${concurrency}" field:"Concurrency"`
	MaxPayload   int           `name:"max-payload-bytes" help:"Largest doc loaded; larger ones are refused as payload_invalid, as the daemon does." env:"OUTBOX_MAX_PAYLOAD_BYTES" default:"${max_payload_bytes}" field:"MaxPayloadBytes"`
	Confirm      time.Duration `name:"confirm-timeout" help:"How long to wait for the leader to confirm it writes to the new index too (unset: see below)." field:"ConfirmTimeout"`
	AllowRefused bool          `name:"allow-refused" help:"Swap even though the new index lacks documents the old one has because their rows were refused (the new mapping, a payload over the limit, a failed emitted event); the swap's audit row names them." field:"AllowRefused"`
	DryRun       bool          `name:"dry-run" help:"Check the source table, the mapping and the alias, say what would happen, change nothing."`
	Cleanup      bool          `help:"Delete the indexes that finished rebuilds replaced (and that aborted ones built)."`
	Abort        bool          `help:"Close the open rebuild without swapping; --cleanup deletes its index later."`
	Rollback     bool          `help:"Move the alias back to the index the newest rebuild replaced (the leader kept writing it since the swap); --cleanup deletes the rebuild's index later."`
	Progress     string        `help:"Progress display: a bar on a terminal, JSON lines otherwise." enum:"auto,bar,json" default:"auto"`
	By           string        `help:"Who is rebuilding; recorded in the audit. Required." placeholder:"WHO" field:"By"`
	Why          string        `help:"Why, e.g. the mapping change or the ticket; recorded in the audit. Required." placeholder:"TEXT" field:"Why"`
}

func (c *rebuildCmd) Help() string {
	return "Builds a new index named <ELASTIC_INDEX>-<UTC time> from --from-table, while the leader writes live events to " +
		"both indexes, then swaps the alias ELASTIC_INDEX to it in one _aliases call; the old index stays, and the leader keeps writing it " +
		"for a rollback (--rollback), until --cleanup. " +
		"Interrupted, it leaves the alias as it was; the same command resumes it. " +
		"A source row older than a live version the ledger applied is replaced by the old index's copy of that version (reported as behind). " +
		"The swap is refused while the new index lacks a document the old one has because its row was refused, unless --allow-refused. " +
		"Exit codes: 0 done, 1 error or stopped (resumable), 2 bad input, 3 refused (busy, nothing to clean, nothing to roll back to, " +
		"another rebuild open, a swap that would lose documents: the rebuild stays open and resumable); " +
		"bad input and refusals change nothing. " + fmt.Sprintf("Unset, --emit-rate is %d rows/s, --emit-backlog %d events, "+
		"--confirm-timeout %s.", rebuild.EmitRateDefault, rebuild.EmitBacklogDefault, rebuild.ConfirmTimeoutDefault)
}

func (c *rebuildCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(g.context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, pool, err := c.config(ctx)
	if err != nil {
		return commandError(c, err)
	}
	defer pool.Close()
	out := newRebuildOutput(g.stdout, c.Progress, c.Cleanup || c.Abort || c.Rollback)
	cfg.Progress, cfg.OnRefused = out, out.refused
	switch {
	case c.Cleanup:
		cleaned, err := rebuild.Cleanup(ctx, cfg)
		out.cleaned(cleaned)
		return commandError(c, err)
	case c.Abort:
		row, err := rebuild.Abort(ctx, cfg)
		if err == nil {
			out.aborted(row)
		}
		return commandError(c, err)
	case c.Rollback:
		row, err := rebuild.Rollback(ctx, cfg)
		if err == nil {
			out.rolledBack(row)
		}
		return commandError(c, err)
	case c.DryRun:
		plan, err := rebuild.DryRun(ctx, cfg)
		if err == nil {
			out.plan(plan)
		}
		return commandError(c, err)
	}
	rep, err := rebuild.Run(ctx, cfg)
	out.done(rep, err)
	return commandError(c, err)
}

// config checks the flags and connects; nothing is read yet.
func (c *rebuildCmd) config(ctx context.Context) (rebuild.Config, *pgxpool.Pool, error) {
	switch {
	case btoi(c.Cleanup)+btoi(c.Abort)+btoi(c.Rollback) > 1,
		(c.Cleanup || c.Abort || c.Rollback) && (c.DryRun || c.EmitOutbox || c.AllowRefused || c.FromTable != "" || c.Mapping != ""):
		return rebuild.Config{}, nil, usagef("--cleanup, --abort and --rollback take no other action flag")
	case strings.TrimSpace(c.By) == "" || strings.TrimSpace(c.Why) == "":
		return rebuild.Config{}, nil, usagef("--by and --why are required: say who is rebuilding and why")
	}
	target, err := c.target(c.Projection, searchTarget{Engine: c.options(), Alias: c.ElasticIndex, SourceTable: c.FromTable,
		MaxPayloadBytes: c.MaxPayload, MappingFile: c.Mapping})
	if err != nil {
		return rebuild.Config{}, nil, err
	}
	if !c.Cleanup && !c.Abort && !c.Rollback && target.SourceTable == "" {
		return rebuild.Config{}, nil, usagef("--from-table is required: the source-of-truth table to rebuild from")
	}
	// kong applied the flags' defaults: a zero here is the operator's.
	if err := bounds.First(bounds.Check("BulkSize", c.BulkSize, projection.BulkSizeRange),
		bounds.Check("Concurrency", c.Concurrency, projection.ConcurrencyRange)); err != nil {
		return rebuild.Config{}, nil, err
	}
	cfg := rebuild.Config{Projection: c.Projection, Alias: target.Alias, SourceTable: target.SourceTable,
		EmitOutbox: c.EmitOutbox, EmitRate: c.EmitRate, EmitBacklog: c.EmitBacklog, BulkSize: c.BulkSize,
		Concurrency: c.Concurrency, MaxPayloadBytes: target.MaxPayloadBytes, ConfirmTimeout: c.Confirm, AllowRefused: c.AllowRefused,
		By: c.By, Why: c.Why}
	// The projections file's mapping_file, when --mapping names none: an
	// edited mapping file takes effect with the next rebuild.
	if target.MappingFile != "" {
		if cfg.Mapping, err = os.ReadFile(target.MappingFile); err != nil {
			return cfg, nil, usagef("--mapping: %v", err)
		}
		cfg.MappingFile = target.MappingFile
	}
	if cfg.Client, err = projection.NewElasticClient(target.Engine); err != nil {
		return cfg, nil, err
	}
	cfg.Pool, err = pgpool.Open(ctx, c.DatabaseURL, c.Concurrency+4, "wlproj-rebuild:"+c.By)
	return cfg, cfg.Pool, err
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
