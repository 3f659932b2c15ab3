package replica

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/rebuild"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

// daemonParts is what a replica runs: the leader's services and the engine
// check that health and auto-replay share.
type daemonParts struct {
	services []leader.Service
	// pingES is nil when every search projection's engine answers.
	pingES func(ctx context.Context) error
	// searches are the search projections, each with its engine probe
	// (which logs the engine's name and version once it answers) and its
	// index keeper (which creates a missing alias, or warns that it is a
	// concrete index).
	searches []*searchParts
}

// indexFirst runs the consume loop once the indexes are set up, so that
// the leader's first write does not auto-create an alias as a concrete
// index.
type indexFirst struct {
	*consume.Loop
	searches []*searchParts
}

func (s indexFirst) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	for _, p := range s.searches {
		_, _ = p.index.Ensure(ctx)
	}
	s.Loop.Run(ctx, epoch, drain)
}

// newDaemon builds the projections and registers every service the leader
// runs. A new leader-only service is added here and nowhere else.
func newDaemon(cfg Config, pool *pgxpool.Pool, log zerolog.Logger) (daemonParts, error) {
	b := &builder{cfg: cfg, pool: pool, log: log}
	registry, err := b.registry(cfg.Projections)
	if err != nil {
		return daemonParts{}, err
	}
	d := daemonParts{pingES: b.pingAll, searches: b.searches}
	store := &outbox.Store{Pool: pool, Owner: cfg.WorkerID, LeaderName: cfg.Leader.Name}
	loop, err := consume.NewLoop(cfg.Consume, store, registry, log)
	if err != nil {
		return daemonParts{}, err
	}
	pruner, err := consume.NewPruner(cfg.Pruner, store, log)
	if err != nil {
		return daemonParts{}, err
	}
	d.services = []leader.Service{indexFirst{loop, b.searches}, consume.NewReclaimer(loop.Config(), store, log), pruner}
	for _, s := range b.searches {
		d.services = append(d.services, rebuild.NewDualWrite(pool, s.spec.Name, s.search, cfg.WorkerID, cfg.Leader.Name, log))
	}
	more, err := optionalServices(cfg, pool, d.pingES, b.searches, log)
	d.services = append(d.services, more...)
	return d, err
}

// optionalServices are the leader's services that settings turn on:
// auto-replay, auto-archive and each search projection's scheduled verify.
func optionalServices(cfg Config, pool *pgxpool.Pool, ping func(context.Context) error, searches []*searchParts, log zerolog.Logger) ([]leader.Service, error) {
	var services []leader.Service
	if cfg.AutoReplay {
		auto, err := replay.NewAutoReplayer(pool, cfg.AutoReplayer, func(ctx context.Context) bool { return ping(ctx) == nil }, log)
		if err != nil {
			return nil, err
		}
		services = append(services, auto)
	}
	if cfg.FailedArchiveAfter > 0 {
		archiver, err := replay.NewAutoArchiver(pool, cfg.FailedArchiveAfter, log)
		if err != nil {
			return nil, err
		}
		services = append(services, archiver)
	}
	if cfg.Verify.Interval == 0 {
		return services, nil
	}
	for _, s := range searches {
		vc := cfg.Verify
		vc.Projection, vc.Index, vc.SourceTable = s.spec.Name, s.spec.Search.Index, s.spec.Search.SourceTable
		v, err := verify.NewService(vc, pool, s.es, s.search, log.With().Str("projection", s.spec.Name).Logger())
		if err != nil {
			return nil, fmt.Errorf("%s projection's verify: %w", s.spec.Name, err)
		}
		services = append(services, v)
	}
	return services, nil
}
