// Package startstop is the one shape of what a replica runs for its whole
// life (the elector, the health server, the console): Start returns once
// the service runs in the background, Stop ends it and returns once it has
// stopped. River's startstop, cut to what wlproj needs.
package startstop

import (
	"context"
	"sync"
)

// Service is started once and stopped once.
type Service interface {
	// Start starts the service in the background under ctx; when ctx ends,
	// the service stops as if Stop were called.
	Start(ctx context.Context) error
	// Stop stops the service and returns once it has; it does nothing for
	// a service that is not running.
	Stop()
}

// Runner gives a blocking function the Service shape: embed it, and call
// Run from Start.
type Runner struct {
	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped chan struct{}
}

// Run runs run in a goroutine under a context that Stop cancels.
func (r *Runner) Run(ctx context.Context, run func(ctx context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, r.cancel = context.WithCancel(ctx)
	r.stopped = make(chan struct{})
	go func(stopped chan struct{}) {
		defer close(stopped)
		run(ctx)
	}(r.stopped)
}

// Running reports whether Run was called and Stop was not.
func (r *Runner) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancel != nil
}

// Stop cancels run's context and waits for it to return.
func (r *Runner) Stop() {
	r.mu.Lock()
	cancel, stopped := r.cancel, r.stopped
	r.cancel, r.stopped = nil, nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-stopped
}

// StartAll starts services in order; if one fails to start, it stops those
// already started, last first, and returns the error.
func StartAll(ctx context.Context, services ...Service) error {
	for i, s := range services {
		if err := s.Start(ctx); err != nil {
			StopAll(services[:i]...)
			return err
		}
	}
	return nil
}

// StopAll stops services, last first.
func StopAll(services ...Service) {
	for i := len(services) - 1; i >= 0; i-- {
		services[i].Stop()
	}
}
