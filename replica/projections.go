package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

// builtin names the projections a binary without a projections file
// knows (DefaultSpecs): the CLI's commands that run without the file
// (pause, status) accept them.
var builtin = []string{projection.ChronicleName, projection.SearchName}

// ProjectionNames lists the built-in projections, sorted.
func ProjectionNames() []string { return append([]string{}, builtin...) }

// searchParts is one search projection as a replica runs it: its engine's
// client, the handler (kept typed: the rebuild's dual-write and the
// scheduled verify write through it), the engine check and the index
// keeper.
type searchParts struct {
	spec   Spec
	es     *elastic.Client
	search *projection.Search
	probe  *projection.EngineProbe
	index  *projection.IndexKeeper
	// timeout is the engine's request timeout, which sets the index's
	// write lifetime.
	timeout time.Duration
	// dualWrite is the leader's view of the projection's rebuild, which
	// each bulk reads (newDaemon sets it).
	dualWrite *rebuild.DualWrite
}

// builder is what the projections' constructors draw on.
type builder struct {
	cfg      Config
	pool     *pgxpool.Pool
	log      zerolog.Logger
	searches []*searchParts
}

func (b *builder) buildSearch(spec Spec) (*projection.Search, error) {
	opts := spec.Search.Engine
	opts.Timeout = b.timeoutOf(spec)
	es, err := projection.NewElasticClient(opts)
	if err != nil {
		return nil, fmt.Errorf("engine client: %w", err)
	}
	bulk := spec.Search.Bulk
	search, err := projection.NewSearch(projection.SearchConfig{Client: es, Index: spec.Search.Index, MaxPayloadBytes: spec.Search.MaxPayloadBytes,
		BulkActions: bulk.Actions, BulkBytes: bulk.Bytes, BulkConcurrency: bulk.Concurrency})
	if err != nil {
		return nil, err
	}
	log := b.log.With().Str("projection", spec.Name).Logger()
	index := projection.NewIndexKeeper(es, spec.Search.Index, spec.Search.Mapping, log)
	search.WaitFor(index.Waiting)
	b.searches = append(b.searches, &searchParts{spec: spec, es: es, search: search, timeout: opts.Timeout,
		probe: projection.NewEngineProbe(es, opts.URL), index: index})
	return search, nil
}

// timeoutOf is spec's engine.timeout, else ELASTIC_TIMEOUT_SECONDS.
func (b *builder) timeoutOf(spec Spec) time.Duration {
	return cmp.Or(spec.Search.Timeout, b.cfg.Elastic.Timeout)
}

// registry builds every configured projection's handler.
func (b *builder) registry(specs Specs) (projection.Registry, error) {
	reg := projection.Registry{}
	for _, spec := range specs {
		var h projection.Handler
		var err error
		switch spec.Kind {
		case KindSearch:
			h, err = b.buildSearch(spec)
		case KindChronicle:
			h, err = projection.NewChronicle(projection.ChronicleConfig{Pool: b.pool, MaxPayloadBytes: b.cfg.ChronicleMaxPayloadBytes,
				Table: spec.Chronicle.TableName()})
		}
		if err != nil {
			return nil, fmt.Errorf("%s projection: %w", spec.Name, err)
		}
		reg[spec.Name] = h
	}
	return reg, nil
}

// pingAll is nil when every search projection's engine answers; an
// error names the projection when there are several.
func (b *builder) pingAll(ctx context.Context) error {
	var errs []error
	for _, s := range b.searches {
		err := s.probe.Ping(ctx)
		if err != nil && len(b.searches) > 1 {
			err = fmt.Errorf("%s: %w", s.spec.Name, err)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Known reports whether name is a built-in projection.
func Known(name string) bool { return slices.Contains(builtin, name) }
