package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/alecthomas/kong"

	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replica"
)

// projectionsFlags name the projections file. Without it, ELASTIC_*
// describe the one search projection beside the chronicle, as before the
// file existed.
type projectionsFlags struct {
	ProjectionsFile string `help:"The projections file (YAML): each projection's kind, engine, index alias, mapping and source table; secrets by reference only. Without it ELASTIC_* describe the search projection beside the chronicle." env:"OUTBOX_PROJECTIONS_FILE" placeholder:"PATH"`
}

// specs loads the file with its secrets, or returns nil without a file
// (the replica's defaults then apply).
func (f projectionsFlags) specs() (replica.Specs, error) {
	if f.ProjectionsFile == "" {
		return nil, nil
	}
	return replica.LoadProjections(f.ProjectionsFile, os.Getenv)
}

// names are the configured projections' names, read without the engines'
// secrets; the built-in ones without a file.
func (f projectionsFlags) names() ([]string, error) {
	if f.ProjectionsFile == "" {
		return replica.ProjectionNames(), nil
	}
	return replica.LoadProjectionNames(f.ProjectionsFile)
}

// badFile exits 2: the file, not the machine, is at fault.
func badFile(err error) error { return &exitError{code: exitUsage, err: err} }

type projectionsCmd struct {
	Check projectionsCheckCmd `cmd:"" help:"Check a projections file as run does when it starts, without starting anything: the file, secrets resolved, and with DATABASE_URL the tables it names (a chronicle's table, source_table); exit 2 naming the file, line, projection and key at fault."`
	List  projectionsListCmd  `cmd:"" help:"List the configured projections (the file's, or ELASTIC_*'s without one) and where their secrets come from, never the secrets."`
}

type projectionsCheckCmd struct {
	projectionsFlags
	DatabaseURL string `help:"Postgres connection URL: with it, the tables the file names are checked in the database as run checks them; without it, they are not, and check says so." env:"DATABASE_URL"`
}

// Validate refuses a database URL as every command with one does, before
// anything is read or connects; none is fine (the tables go unchecked).
func (c projectionsCheckCmd) Validate(kctx *kong.Context) error {
	if c.DatabaseURL == "" {
		return nil
	}
	return dbFlags{DatabaseURL: c.DatabaseURL}.Validate(kctx)
}

func (c *projectionsCheckCmd) Run(g *globals) error {
	if c.ProjectionsFile == "" {
		return badFile(fmt.Errorf("--projections-file (OUTBOX_PROJECTIONS_FILE) is required: the file to check"))
	}
	specs, err := c.specs()
	if err != nil {
		return badFile(err)
	}
	fmt.Fprintf(g.stdout, "%s: %d projections (%s), hash %s\n", c.ProjectionsFile, len(specs), strings.Join(specs.Names(), ", "), specs.Hash())
	if c.DatabaseURL == "" {
		fmt.Fprintln(g.stdout, "tables: not checked, no DATABASE_URL given (run checks them when it starts)")
		return nil
	}
	return c.checkTables(g, specs)
}

// checkTables checks the file's tables in the database, as run does.
func (c *projectionsCheckCmd) checkTables(g *globals, specs replica.Specs) error {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeoutDefault)
	defer cancel()
	conn, err := connect(ctx, c.DatabaseURL)
	if err != nil {
		var bad *pgpool.URLError
		if errors.As(err, &bad) {
			return err
		}
		return &exitError{code: exitFailure, err: redactedError{msg: "tables not checked: the database did not answer: " + redact(err.Error()), err: err}}
	}
	defer conn.Close(context.Background())
	n, err := replica.CheckTables(ctx, conn, specs)
	var bad *replica.ProjectionsError
	if errors.As(err, &bad) {
		return badFile(err)
	}
	if err != nil {
		return &exitError{code: exitFailure, err: redactedError{msg: redact(err.Error()), err: err}}
	}
	fmt.Fprintf(g.stdout, "tables: %d checked in the database\n", n)
	return nil
}

type projectionsListCmd struct {
	projectionsFlags
	elasticFlags
	ElasticIndex string `help:"Index the search projection writes to, without a projections file." env:"ELASTIC_INDEX" default:"${elastic_index}"`
	JSON         bool   `name:"json" help:"Print one JSON object per projection."`
}

func (c *projectionsListCmd) Run(g *globals) error {
	var specs replica.Specs
	if c.ProjectionsFile != "" {
		var err error
		if specs, err = replica.LoadProjectionsUnresolved(c.ProjectionsFile); err != nil {
			return badFile(err)
		}
	} else {
		specs = replica.DefaultSpecs(replica.Config{Elastic: c.options(), Index: c.ElasticIndex})
	}
	if c.JSON {
		return writeJSONLines(g.stdout, specs)
	}
	writeProjectionSpecs(g.stdout, specs)
	return nil
}

func writeProjectionSpecs(w io.Writer, specs replica.Specs) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// TABLE: a search projection's source of truth, a chronicle's own.
	fmt.Fprintln(tw, "NAME\tKIND\tINDEX\tENGINE\tAUTH\tMAPPING\tTABLE")
	for _, s := range specs {
		if s.Search == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t%s\n", s.Name, s.Kind, s.Chronicle.TableName())
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, s.Search.Index, strings.Join(s.Search.URLs, ","),
			authOf(s.Search), or(s.Search.MappingFile, "-"), or(s.Search.SourceTable, "-"))
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "hash %s\n", specs.Hash())
}

// authOf says how a search projection authenticates, and where its secret
// comes from, never the secret.
func authOf(s *replica.SearchSpec) string {
	switch {
	case s.APIKeyFrom != "":
		return "api key from " + s.APIKeyFrom
	case s.Username != "" && s.PasswordFrom != "":
		return "basic " + s.Username + ", password from " + s.PasswordFrom
	case s.Username != "":
		return "basic " + s.Username
	}
	return "none"
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// searchTarget is where a search projection's documents are, for rebuild
// and verify: the engine, the alias, the source table and the payload
// limit.
type searchTarget struct {
	Engine          projection.ElasticOptions
	Alias           string
	SourceTable     string
	MaxPayloadBytes int
	// MappingFile is the file's mapping_file: a rebuild's new index's
	// body unless --mapping names another.
	MappingFile string
	// Mask is the file's mask: a rebuild's refused rows' messages are
	// masked with it.
	Mask *mask.Mask
}

// target is the named search projection's target from the projections
// file, or flags (ELASTIC_* and the command's own) without one. The file's
// source table is the default of a --from-table left empty.
func (f projectionsFlags) target(name string, flags searchTarget) (searchTarget, error) {
	if f.ProjectionsFile == "" {
		if !replica.Known(name) {
			return flags, usagef("unknown projection %q (known: %s)", name, strings.Join(replica.ProjectionNames(), ", "))
		}
		return flags, nil
	}
	specs, err := f.specs()
	if err != nil {
		return flags, badFile(err)
	}
	i := slices.IndexFunc(specs, func(s replica.Spec) bool { return s.Name == name })
	if i < 0 || specs[i].Kind != replica.KindSearch {
		return flags, usagef("projection %q is not a search projection of %s (its search projections: %s)", name, f.ProjectionsFile,
			strings.Join(specs.SearchNames(), ", "))
	}
	s := specs[i].Search
	engine := s.Engine
	engine.Timeout = cmp.Or(s.Timeout, flags.Engine.Timeout)
	return searchTarget{Engine: engine, Alias: s.Index, SourceTable: cmp.Or(flags.SourceTable, s.SourceTable),
		MaxPayloadBytes: s.MaxPayloadBytes, MappingFile: cmp.Or(flags.MappingFile, s.MappingFile), Mask: specs.Masks()[name]}, nil
}
