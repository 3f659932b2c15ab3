package replica

import (
	"context"
	"fmt"
	"sync"
	"time"

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

// waiting says, for each search projection whose events wait for its index
// (projection.IndexKeeper.Waiting), why.
func (d daemonParts) waiting() map[string]string {
	out := map[string]string{}
	for _, s := range d.searches {
		if why := s.index.Waiting(); why != "" {
			out[s.spec.Name] = why
		}
	}
	return out
}

// indexFirst runs the consume loop with the indexes set up before its
// first write, so that the leader's first write does not auto-create an
// alias as a concrete index. The set-up (a round trip to each engine, and
// a read of each projection's rebuild, which the first bulk would make
// otherwise) runs beside the loop's first reads, not before them: a
// takeover waits for the longer of the two.
type indexFirst struct {
	*consume.Loop
	searches []*searchParts
	head     *headStart
}

func (s indexFirst) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	s.Loop.RunWith(ctx, epoch, drain, consume.TermStart{Started: func() { s.head.open(epoch) }, Prepare: func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, p := range s.searches {
			wg.Go(func() { _, _ = p.index.Ensure(ctx) })
			// The view of a rebuild a first bulk reads: read now, it is
			// fresh then (a failure leaves the bulk to read it, as before).
			if p.dualWrite != nil {
				wg.Go(func() { _, _ = p.dualWrite.RebuildIndexes(ctx) })
			}
		}
		wg.Wait()
	}})
}

// headStartAtMost bounds the head start: a first batch that waits for an
// engine that does not answer does not hold the reclaimer and the rest.
const headStartAtMost = time.Second

// headStart gives the consume loop the first moments of each term: the
// leader's other services (the reclaimer, the rotations, the rebuild's
// dual write) start once the loop's first batch has been processed, or
// its first claim found nothing, and headStartAtMost after the term began
// at the latest. Started with the term, their first rounds ran beside the
// loop's first reads on a two-core machine and made a takeover's first
// event later by a few to tens of milliseconds; none of them is urgent to
// the millisecond (the reclaimer takes back an earlier leader's claimed
// rows, which the loop claims at its next claim from the head anyway).
type headStart struct {
	mu    sync.Mutex
	epoch int64
	gate  chan struct{}
	once  *sync.Once
}

// opened is the channel closed once epoch's head start is over.
func (h *headStart) opened(epoch int64) (chan struct{}, *sync.Once) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate == nil || h.epoch != epoch {
		h.epoch, h.gate, h.once = epoch, make(chan struct{}), &sync.Once{}
	}
	return h.gate, h.once
}

// open ends epoch's head start.
func (h *headStart) open(epoch int64) {
	gate, once := h.opened(epoch)
	once.Do(func() { close(gate) })
}

// afterHeadStart runs a leader service once the term's head start is over.
type afterHeadStart struct {
	leader.Service
	head *headStart
}

func (s afterHeadStart) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	gate, _ := s.head.opened(epoch)
	limit := time.NewTimer(headStartAtMost)
	defer limit.Stop()
	select {
	case <-gate:
	case <-limit.C:
	case <-ctx.Done():
		return
	case <-drain:
		return
	}
	s.Service.Run(ctx, epoch, drain)
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
	consumeCfg := cfg.Consume
	consumeCfg.Masks = cfg.Projections.Masks()
	loop, err := consume.NewLoop(consumeCfg, store, registry, log)
	if err != nil {
		return daemonParts{}, err
	}
	pruner, err := consume.NewPruner(cfg.Pruner, store, log)
	if err != nil {
		return daemonParts{}, err
	}
	others := []leader.Service{consume.NewReclaimer(loop.Config(), store, log), pruner}
	for _, s := range b.searches {
		s.dualWrite = rebuild.NewDualWrite(pool, s.spec.Name, s.search, cfg.WorkerID, cfg.Leader.Name, log)
		others = append(others, s.dualWrite)
	}
	more, err := optionalServices(cfg, pool, d.pingES, b.searches, log)
	head := &headStart{}
	d.services = []leader.Service{indexFirst{loop, b.searches, head}}
	for _, s := range append(others, more...) {
		d.services = append(d.services, afterHeadStart{s, head})
	}
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
