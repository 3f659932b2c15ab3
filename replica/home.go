package replica

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/internal/startstop"
	"github.com/wlproj/wlproj/outbox"
)

// homeCheckInterval is how often a replica reads where the queue's
// positions belong (outbox.CheckHome): a database moves while its replicas
// are stopped or reconnect, and each term starts from a fresh campaign.
const homeCheckInterval = 10 * time.Second

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_queue_home_mismatch": "1 while this replica refuses to lead because the queue's saved positions belong to " +
			"another Postgres cluster, or lie ahead of this one's transaction counter (a database restored or copied " +
			"elsewhere): run wlproj queue rebase (runbook: Moving the database to another cluster).",
	})
}

var homeMismatch = metrics.NewGauge("outbox_queue_home_mismatch", nil)

// homeGate keeps the verdict of outbox.CheckHome: a replica leads only on
// the cluster the queue's positions belong to. Until the first read it may
// not lead; a failed read keeps the last verdict.
type homeGate struct {
	pool    *pgxpool.Pool
	log     zerolog.Logger
	problem atomic.Pointer[string]
	runner  startstop.Runner
}

// OK reports whether the last read found the positions at home.
func (g *homeGate) OK() bool {
	p := g.problem.Load()
	return p != nil && *p == ""
}

// Problem is why this replica may not lead, "" when it may.
func (g *homeGate) Problem() string {
	if p := g.problem.Load(); p != nil {
		return *p
	}
	return "not read yet: where the queue's positions belong (outbox_queue_home)"
}

// Start reads now, so the elector's first look finds a verdict (a
// database not up yet leaves none: the replica waits as it does for the
// database anyway), and every homeCheckInterval until Stop or ctx ends.
func (g *homeGate) Start(ctx context.Context) error {
	g.read(ctx)
	g.runner.Run(ctx, func(ctx context.Context) {
		for {
			wait := homeCheckInterval
			if g.problem.Load() == nil {
				wait = time.Second // never read yet: the database is coming up
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			g.read(ctx)
		}
	})
	return nil
}

func (g *homeGate) Stop() { g.runner.Stop() }

func (g *homeGate) read(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	home, err := outbox.CheckHome(rctx, g.pool)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn().Err(err).Msg("cannot read where the queue's positions belong; keeping the last verdict")
		}
		return
	}
	problem := home.Problem()
	prev := g.problem.Swap(&problem)
	switch {
	case problem != "" && (prev == nil || *prev != problem):
		g.log.Error().Int64("recorded_cluster", home.Recorded).Int64("this_cluster", home.Here).
			Msg("refusing to lead: " + problem)
	case problem == "" && prev != nil && *prev != "":
		g.log.Info().Msg("the queue's positions belong to this cluster now: campaigning for leadership again")
	case home.Unchecked && prev == nil:
		g.log.Warn().Msg("schema before 23: no record of the cluster the queue's positions belong to, so a database " +
			"moved to another cluster goes unnoticed; run wlproj migrate")
	}
	homeMismatch.Set(map[bool]float64{true: 1}[problem != ""])
}
