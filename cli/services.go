package cli

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

// projections is every projection this binary knows, by the name producers
// write in outbox_events.projection, with how to build its handler. A new
// projection is its file in projection/ and one line here; the loop, the
// CLI (pause, resume, status) and the gauges take their names from here.
var projections = map[string]func(c *runCmd, d projectionDeps) (projection.Handler, error){
	"search": func(c *runCmd, d projectionDeps) (projection.Handler, error) {
		return projection.NewSearch(projection.SearchConfig{Client: d.es, Index: c.ElasticIndex, MaxPayloadBytes: c.MaxPayloadBytes})
	},
	"chronicle": func(c *runCmd, d projectionDeps) (projection.Handler, error) {
		return projection.NewChronicle(projection.ChronicleConfig{Pool: d.pool, MaxPayloadBytes: c.ChronicleMaxPayloadBytes})
	},
}

// projectionDeps is what the projections' constructors draw on.
type projectionDeps struct {
	es   *elastic.Client
	pool *pgxpool.Pool
}

// projectionNames lists the known projections, sorted.
func projectionNames() []string { return slices.Sorted(maps.Keys(projections)) }

// newRegistry builds every known projection's handler.
func newRegistry(c *runCmd, d projectionDeps) (projection.Registry, error) {
	reg := projection.Registry{}
	for name, build := range projections {
		h, err := build(c, d)
		if err != nil {
			return nil, fmt.Errorf("%s projection: %w", name, err)
		}
		reg[name] = h
	}
	return reg, nil
}

// daemonParts is what a replica runs: the leader's services and the engine
// check that health and auto-replay share.
type daemonParts struct {
	services []leader.Service
	pingES   func(ctx context.Context) error
	// engine logs the engine's name and version once it answers.
	engine *projection.EngineProbe
	// index creates a missing ELASTIC_INDEX behind an alias, or warns that
	// it is concrete.
	index *projection.IndexKeeper
}

// indexFirst runs the consume loop once the index is set up, so that the
// leader's first write does not auto-create ELASTIC_INDEX as a concrete
// index.
type indexFirst struct {
	*consume.Loop
	index *projection.IndexKeeper
}

func (s indexFirst) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	_, _ = s.index.Ensure(ctx)
	s.Loop.Run(ctx, epoch, drain)
}

// newDaemon builds the projections and registers every service the leader
// runs. A new leader-only service is added here and nowhere else.
func newDaemon(c *runCmd, pool *pgxpool.Pool, workerID string, log zerolog.Logger) (daemonParts, error) {
	es, err := projection.NewElasticClient(projection.ElasticOptions{
		URL: c.ElasticURL, Username: c.ElasticUsername, Password: c.ElasticPassword,
		CAFile: c.ElasticCAFile, Timeout: seconds(c.ElasticTimeout),
	})
	if err != nil {
		return daemonParts{}, fmt.Errorf("engine client: %w", err)
	}
	registry, err := newRegistry(c, projectionDeps{es: es, pool: pool})
	if err != nil {
		return daemonParts{}, err
	}
	probe := projection.NewEngineProbe(es, c.ElasticURL)
	d := daemonParts{pingES: probe.Ping, engine: probe, index: projection.NewIndexKeeper(es, c.ElasticIndex, log)}

	store := &outbox.Store{Pool: pool, Owner: workerID, LeaderName: c.LeaderName}
	loop, err := consume.NewLoop(c.consumeConfig(), store, registry, log)
	if err != nil {
		return daemonParts{}, err
	}
	pruner, err := consume.NewPruner(consume.PrunerConfig{Retention: c.Retention, TombstoneRetention: c.LedgerTombstoneRetention}, store, log)
	if err != nil {
		return daemonParts{}, err
	}
	d.services = []leader.Service{indexFirst{loop, d.index}, consume.NewReclaimer(loop.Config(), store, log), pruner}
	d.services = append(d.services, rebuild.NewDualWrite(pool, rebuild.Projection, registry[rebuild.Projection].(*projection.Search), workerID, c.LeaderName, log))
	if c.AutoReplay {
		auto, err := replay.NewAutoReplayer(pool, replay.AutoReplayerConfig{PerMinute: c.AutoReplayPerMinute},
			func(ctx context.Context) bool { return d.pingES(ctx) == nil }, log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, auto)
	}
	if c.FailedArchiveAfter > 0 {
		archiver, err := replay.NewAutoArchiver(pool, c.FailedArchiveAfter, log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, archiver)
	}
	if c.VerifyInterval > 0 {
		v, err := verify.NewService(c.verifyConfig(), pool, es, registry[rebuild.Projection].(*projection.Search), log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, v)
	}
	return d, nil
}
