package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
	"github.com/wlproj/wlproj/verify"
)

// exitDrift is verify's exit code when the index differs from the truth;
// the other codes are those of cmd_ops.go.
const exitDrift = 4

type verifyCmd struct {
	dbFlags
	elasticFlags
	ElasticIndex string `help:"The index or alias verified." env:"ELASTIC_INDEX" default:"search"`
	Projection   string `help:"Projection verified (only search has an index)." default:"search"`
	FromTable    string `name:"from-table" help:"The source-of-truth table (entity_type, entity_id, doc, version); without it the index is compared with the applied-version ledger alone." placeholder:"TABLE"`
	JSON         bool   `name:"json" help:"Print one JSON object."`
	Sample       int    `help:"Document ids shown per kind [${verify_sample_range}]." default:"${verify_sample}"`
	Rate         int    `help:"Documents read per second at most, index and database alike; 0: no cap." default:"0"`
}

func (c *verifyCmd) Help() string {
	return "Reads the whole index (a scroll, versions only) and looks each page up in one snapshot of the database; " +
		"a document that differs is checked again as it is now, and one with an event pending or processing is the drain's, not drift. " +
		"Kinds: missing (in the source, or live in the ledger, not in the index), stale (older in the index), " +
		"resurrected (in the index, deleted in the ledger), extra (in the index, not in the source, not deleted in the ledger; " +
		"only with --from-table). " +
		"Exit codes: 0 clean, 4 drift found, 1 error, 2 bad input (nothing read or changed)."
}

// verifyVars fills the ${…} of verify's flags (and of the run command's
// verify settings) from the package's defaults.
func verifyVars(v map[string]string) {
	v["verify_sample"], v["verify_sample_range"] = strconv.Itoa(verify.SampleDefault), rangeText(verify.SampleRange)
}

// verifyFlags names verify.Config's fields by their flags.
var verifyFlags = map[string]string{"Index": "ELASTIC_INDEX", "Sample": "--sample", "Rate": "--rate", "Page": "--page"}

func (c *verifyCmd) Run(g *globals) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, pool, err := c.config(ctx)
	if err != nil {
		return c.exit(err)
	}
	defer pool.Close()
	rep, err := verify.Run(ctx, cfg)
	if err != nil {
		return c.exit(err)
	}
	if c.JSON {
		writeJSON(g.stdout, verifyJSON(rep))
	} else {
		writeVerify(g.stdout, rep, c.FromTable)
	}
	if n := rep.Drift(); n > 0 {
		return &exitError{code: exitDrift, err: fmt.Errorf("drift: %d documents differ from the %s", n, truth(rep))}
	}
	return nil
}

// config checks the flags and connects; nothing is read yet.
func (c *verifyCmd) config(ctx context.Context) (verify.Config, *pgxpool.Pool, error) {
	if err := bounds.First(bounds.Check("Sample", c.Sample, verify.SampleRange),
		bounds.Check("Rate", c.Rate, verify.RateRange)); err != nil {
		return verify.Config{}, nil, err
	}
	if _, ok := projections[c.Projection]; !ok {
		return verify.Config{}, nil, usagef("unknown projection %q (known: %s)", c.Projection, strings.Join(projectionNames(), ", "))
	}
	cfg := verify.Config{Index: c.ElasticIndex, Projection: c.Projection, SourceTable: c.FromTable, Sample: c.Sample, Rate: c.Rate}
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
	poolCfg.MaxConns = 4
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "wlproj-verify"
	cfg.Pool, err = pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return cfg, nil, fmt.Errorf("database: %w", err)
	}
	return cfg, cfg.Pool, nil
}

// exit gives an error its exit code and the operator's words, with the
// credentials scrubbed.
func (c *verifyCmd) exit(err error) error {
	if err == nil {
		return nil
	}
	code := exitFailure
	var input *rebuild.InputError
	var usage usageError
	var field *bounds.FieldError
	if errors.As(err, &input) || errors.As(err, &usage) || errors.As(err, &field) {
		code = exitUsage
	}
	msg := redact(bounds.Rename(err, verifyFlags).Error(), c.DatabaseURL)
	return &exitError{code: code, err: redactedError{msg: msg, err: err}}
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
	InFlight    int64                    `json:"in_flight"`
	Samples     map[verify.Kind][]string `json:"samples"`
	Walked      bool                     `json:"walked"`
	Seconds     float64                  `json:"seconds"`
}

func verifyJSON(rep verify.Report) verifyReportJSON {
	return verifyReportJSON{Projection: rep.Projection, Index: rep.Index, SourceTable: rep.SourceTable, Checked: rep.Checked,
		Missing: rep.Counts[verify.Missing], Stale: rep.Counts[verify.Stale], Extra: rep.Counts[verify.Extra],
		Resurrected: rep.Counts[verify.Resurrected], InFlight: rep.InFlight, Samples: rep.Samples, Walked: rep.Walked,
		Seconds: rep.Took.Seconds()}
}

// writeVerify prints the counts per kind with their samples, and what to
// do about drift.
func writeVerify(w io.Writer, rep verify.Report, fromTable string) {
	fmt.Fprintf(w, "verified %s (projection %s) against the %s: %d documents in %s\n",
		rep.Index, rep.Projection, truth(rep), rep.Checked, formatAge(rep.Took))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range verify.Kinds {
		if k == verify.Extra && rep.SourceTable == "" {
			fmt.Fprintf(tw, "  %s\t-\t(needs --from-table: the ledger forgets live documents after the retention)\n", k)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", k, rep.Counts[k], strings.Join(rep.Samples[k], " "))
	}
	tw.Flush()
	if rep.InFlight > 0 {
		fmt.Fprintf(w, "  %d more differed while an event of theirs was pending or processing: the drain is behind, not drift\n", rep.InFlight)
	}
	if rep.Drift() == 0 {
		fmt.Fprintln(w, "clean: the index holds what the "+truth(rep)+" says")
		return
	}
	fmt.Fprintf(w, "drift: %d documents; see the runbook's SOP \"the index disagrees with the database\"\n", rep.Drift())
}
