package replica

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

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
func newDaemon(cfg Config, pool *pgxpool.Pool, log zerolog.Logger) (daemonParts, error) {
	es, err := projection.NewElasticClient(cfg.Elastic)
	if err != nil {
		return daemonParts{}, fmt.Errorf("engine client: %w", err)
	}
	b := &builder{cfg: cfg, es: es, pool: pool}
	registry, err := b.registry()
	if err != nil {
		return daemonParts{}, err
	}
	probe := projection.NewEngineProbe(es, cfg.Elastic.URL)
	d := daemonParts{pingES: probe.Ping, engine: probe, index: projection.NewIndexKeeper(es, cfg.Index, log)}

	store := &outbox.Store{Pool: pool, Owner: cfg.WorkerID, LeaderName: cfg.Leader.Name}
	loop, err := consume.NewLoop(cfg.Consume, store, registry, log)
	if err != nil {
		return daemonParts{}, err
	}
	pruner, err := consume.NewPruner(cfg.Pruner, store, log)
	if err != nil {
		return daemonParts{}, err
	}
	d.services = []leader.Service{indexFirst{loop, d.index}, consume.NewReclaimer(loop.Config(), store, log), pruner}
	d.services = append(d.services, rebuild.NewDualWrite(pool, projection.SearchName, b.search, cfg.WorkerID, cfg.Leader.Name, log))
	if cfg.AutoReplay {
		auto, err := replay.NewAutoReplayer(pool, cfg.AutoReplayer, func(ctx context.Context) bool { return d.pingES(ctx) == nil }, log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, auto)
	}
	if cfg.FailedArchiveAfter > 0 {
		archiver, err := replay.NewAutoArchiver(pool, cfg.FailedArchiveAfter, log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, archiver)
	}
	if cfg.Verify.Interval > 0 {
		v, err := verify.NewService(cfg.Verify, pool, es, b.search, log)
		if err != nil {
			return daemonParts{}, err
		}
		d.services = append(d.services, v)
	}
	return d, nil
}
