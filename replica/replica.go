package replica

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/health"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/startstop"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// Replica is one wlproj process: built by New, run by Run.
type Replica struct {
	cfg     Config
	log     zerolog.Logger
	pool    *pgxpool.Pool
	parts   daemonParts
	elector *leader.Elector
	console *console.Console // nil when off
	health  *health.Server
	// home says whether the queue's positions belong to this cluster.
	home     *homeGate
	draining atomic.Bool
}

// New opens the pool and builds everything the replica runs, binding its
// listeners so that a taken port fails here; nothing runs yet. An error
// from a package's Config is a *bounds.FieldError naming the Go field.
func New(ctx context.Context, cfg Config, log zerolog.Logger) (*Replica, error) {
	fromFile := cfg.Projections != nil
	cfg = cfg.withDefaults()
	r := &Replica{cfg: cfg, log: log}
	var err error
	// A connection for each batch acking at once (the loop's lanes: twice
	// the bulks in flight) and six for the claim, the listener, the
	// checkpoint, the elector's work, health and the console.
	if r.pool, err = pgpool.Open(ctx, cfg.DatabaseURL, 2*cfg.Consume.Concurrency+6, "wlproj:"+cfg.WorkerID); err != nil {
		return nil, err
	}
	// The tables a projections file names; those of the environment's
	// defaults are the migrations' (chronicle_events) or checked by verify.
	if err := checkTables(ctx, r.pool, cfg.Projections, fromFile, log); err != nil {
		r.close()
		return nil, err
	}
	if err := r.build(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *Replica) build() error {
	var err error
	if r.parts, err = newDaemon(r.cfg, r.pool, r.log); err != nil {
		return err
	}
	if r.elector, err = leader.New(r.cfg.Leader, r.log, r.parts.services...); err != nil {
		return err
	}
	r.elector.OnTick = watchdogPing()
	// One watch of the vacuum horizon for the gauges and the console, so
	// both count an age Postgres does not show from the same first sight.
	horizon := &outbox.HorizonWatch{}
	if r.cfg.Console.On() {
		r.console, err = console.New(r.cfg.Console, console.Deps{Pool: r.pool, State: r.elector.State,
			LeaderName: r.cfg.Leader.Name, Projections: r.cfg.Projections.Names(), Log: r.log, Horizon: horizon,
			ProjectionSpecs: consoleSpecs(r.cfg.Projections), ProjectionsHash: r.cfg.Projections.Hash(), Waiting: r.parts.waiting,
			Masks: r.cfg.Projections.Masks()})
		if err != nil {
			return err
		}
	}
	r.home = &homeGate{pool: r.pool, log: r.log}
	r.health, err = health.New(r.cfg.Health, health.Deps{Pool: r.pool, Elector: r.elector, PingES: r.parts.pingES,
		Draining: &r.draining, Log: r.log, Projections: r.cfg.Projections.Names(),
		Gates: map[string]func() string{"queue_home": r.home.Problem}, Waiting: r.parts.waiting,
		ProjectionsHash: r.cfg.Projections.Hash(), LeaderName: r.cfg.Leader.Name, Routes: r.consoleRoutes(), Horizon: horizon})
	if err != nil {
		return err
	}
	// A replica on a schema older than its binary needs stands aside: its
	// claims would fail or walk a missing index, and the other replica,
	// or this one after wlproj migrate, leads instead.
	// Nor does one on a database whose queue positions count another
	// cluster's transactions (restored or copied elsewhere): it would pass
	// every new event unread.
	r.elector.CanLead = func() bool { return r.health.SchemaOK() && r.home.OK() }
	// A replica whose pool reaches another server than its lock
	// connection (an old primary back as a primary) does not lead.
	r.elector.PoolServers = leader.PoolServers(r.pool)
	return nil
}

// consoleSpecs is what the console's overview lists of each projection:
// where it writes and reads, none of its secrets or their sources.
func consoleSpecs(specs Specs) []console.ProjectionInfo {
	out := make([]console.ProjectionInfo, 0, len(specs))
	for _, s := range specs {
		p := console.ProjectionInfo{Name: s.Name, Kind: s.Kind}
		switch {
		case s.Search != nil:
			p.Alias, p.Nodes, p.SourceTable = s.Search.Index, s.Search.URLs, s.Search.SourceTable
		case s.Kind == KindChronicle:
			p.SourceTable = s.Chronicle.TableName()
		}
		out = append(out, p)
	}
	return out
}

// consoleRoutes are what the console adds to the HTTP listener: nothing
// when it is off or has its own port.
func (r *Replica) consoleRoutes() map[string]http.Handler {
	if r.console == nil || r.console.Addr() != "" {
		return nil
	}
	return map[string]http.Handler{console.Prefix: r.console.Handler()}
}

// Run serves health, metrics and the console and races for leadership
// until ctx ends; then it drains the leader's services (readiness fails
// meanwhile), stops the servers and closes the pool. Each piece has the one
// Start/Stop shape (startstop.Service): started in order, stopped last
// first.
func (r *Replica) Run(ctx context.Context) {
	defer r.pool.Close()
	go func() {
		<-ctx.Done()
		r.draining.Store(true)
		notifyStopping()
	}()
	// The servers outlive ctx: readiness says "draining" until the
	// leader's services have stopped.
	servers := r.servers()
	_ = startstop.StartAll(context.WithoutCancel(ctx), servers...)
	defer startstop.StopAll(servers...)
	r.logConsole()
	notifyReady()
	r.log.Info().Str("addr", r.cfg.Health.Addr).Int("http_port", r.cfg.Health.HTTPPort).Str("leader_name", r.cfg.Leader.Name).
		Msg("replica started")
	for _, s := range r.parts.searches {
		go func() {
			log := r.log.With().Str("projection", s.spec.Name).Logger()
			go s.probe.Announce(ctx, log)
			if !r.untilMigrated(ctx) {
				return
			}
			// Until the index is set up, the projection's events wait.
			s.index.Keep(ctx)
			s.probe.WarnGCDeletes(ctx, log, s.spec.Search.Index, projection.WriteLifetime(s.timeout))
		}()
	}
	go r.keepWarm(ctx)
	_ = r.elector.Start(ctx)
	<-ctx.Done()
	r.elector.Stop()
}

// untilMigrated returns once the schema is what this binary needs (false
// if ctx ends first). An index made before `wlproj migrate` ran is one the
// operator has not asked for yet, and a replica that may not lead has no
// write to make into it.
func (r *Replica) untilMigrated(ctx context.Context) bool {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for !r.health.SchemaOK() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// servers are the replica's listeners: the console's, if it is on, then
// health and metrics.
func (r *Replica) servers() []startstop.Service {
	if r.console == nil {
		return []startstop.Service{r.home, r.health}
	}
	return []startstop.Service{r.home, r.console, r.health}
}

func (r *Replica) logConsole() {
	if r.console == nil {
		return
	}
	where := "http://" + r.cfg.Health.Addr + ":" + strconv.Itoa(r.cfg.Health.HTTPPort) + console.Prefix
	if addr := r.console.Addr(); addr != "" {
		where = addr
	}
	r.log.Info().Str("console", where).Msg("operator console on")
}

// close releases what New built when New fails: a health server or console
// that never started only holds a listener.
func (r *Replica) close() {
	if r.health != nil {
		r.health.Stop()
	}
	if r.console != nil {
		r.console.Stop()
	}
	r.pool.Close()
}
