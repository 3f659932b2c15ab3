package replica

import (
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/projection"
)

// projections is every projection this binary knows, by the name producers
// write in outbox_events.projection, with how to build its handler. A new
// projection is its file in projection/ and one line here; the loop, the
// CLI (pause, resume, status), the console and the gauges take their names
// from here.
var projections = map[string]func(b *builder) (projection.Handler, error){
	projection.SearchName: func(b *builder) (projection.Handler, error) { return b.buildSearch() },
	projection.ChronicleName: func(b *builder) (projection.Handler, error) {
		return projection.NewChronicle(projection.ChronicleConfig{Pool: b.pool, MaxPayloadBytes: b.cfg.ChronicleMaxPayloadBytes})
	},
}

// ProjectionNames lists the known projections, sorted.
func ProjectionNames() []string { return slices.Sorted(maps.Keys(projections)) }

// Known reports whether name is a projection this binary knows.
func Known(name string) bool {
	_, ok := projections[name]
	return ok
}

// builder is what the projections' constructors draw on. The search
// handler is kept typed: the rebuild's dual-write and the scheduled verify
// write through it too.
type builder struct {
	cfg    Config
	es     *elastic.Client
	pool   *pgxpool.Pool
	search *projection.Search
}

func (b *builder) buildSearch() (*projection.Search, error) {
	var err error
	b.search, err = projection.NewSearch(projection.SearchConfig{Client: b.es, Index: b.cfg.Index, MaxPayloadBytes: b.cfg.MaxPayloadBytes})
	return b.search, err
}

// registry builds every known projection's handler.
func (b *builder) registry() (projection.Registry, error) {
	reg := projection.Registry{}
	for name, build := range projections {
		h, err := build(b)
		if err != nil {
			return nil, fmt.Errorf("%s projection: %w", name, err)
		}
		reg[name] = h
	}
	return reg, nil
}
