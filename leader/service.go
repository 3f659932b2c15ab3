package leader

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Service is one piece of work only the leader does: the consume loop, the
// reclaimer, auto-replay. The elector starts every registered service when
// the replica wins the lock and waits for all of them before it lets the
// lock go, so at most one replica runs any of them at a time.
type Service interface {
	// Name labels the service in logs ("service" field).
	Name() string
	// Run works as leader of epoch. It returns at once when ctx is
	// cancelled (leadership lost: write nothing more), and when drain is
	// closed (shutdown) it stops starting work, lets in-flight work finish
	// within the grace period and returns.
	Run(ctx context.Context, epoch int64, drain <-chan struct{})
}

// runAll runs every service for one term and returns when all have returned.
func runAll(ctx context.Context, epoch int64, drain <-chan struct{}, services []Service) {
	var wg sync.WaitGroup
	for _, s := range services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Run(ctx, epoch, drain)
		}()
	}
	wg.Wait()
}

// Periodic is a Service that calls Once at the start of the term and then
// every Interval. A drain cancels a running Once like a lost leadership
// does: Once works in short transactions, so stopping one loses nothing.
type Periodic struct {
	// ServiceName labels the service in logs.
	ServiceName string
	// Interval is the pause between two calls of Once.
	Interval time.Duration
	// Once does one round of work for the term of epoch; an error is logged
	// and the next round comes as usual.
	Once func(ctx context.Context, epoch int64) error
	// Log receives the errors of Once.
	Log zerolog.Logger
}

// Name implements Service.
func (p *Periodic) Name() string { return p.ServiceName }

// Run implements Service.
func (p *Periodic) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	log := p.Log.With().Str("service", p.ServiceName).Logger()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-drain:
			cancel()
		case <-ctx.Done():
		}
	}()
	ticker := time.NewTicker(p.Interval)
	defer ticker.Stop()
	for {
		if err := p.Once(ctx, epoch); err != nil && ctx.Err() == nil {
			log.Error().Err(err).Msg("round failed; trying again next interval")
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// ServiceFunc adapts run to a Service named name.
func ServiceFunc(name string, run func(ctx context.Context, epoch int64, drain <-chan struct{})) Service {
	return funcService{name: name, run: run}
}

type funcService struct {
	name string
	run  func(ctx context.Context, epoch int64, drain <-chan struct{})
}

func (f funcService) Name() string { return f.name }

func (f funcService) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	f.run(ctx, epoch, drain)
}
