package main

import (
	"context"
	"fmt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

// 9. The throughput comparison repeated: raw bulk and end to end in turn
// (ABAB), -pairs times, after one warm-up, each run into a fresh index
// created with the same settings; the median ratio and its spread, and
// the CPU per event of the daemon and of Postgres for the end-to-end runs.
func (b *bench) pairs(ctx context.Context) error {
	client, err := projection.NewElasticClient(projection.ElasticOptions{URL: b.cfg.ElasticURL})
	if err != nil {
		return err
	}
	c := &Comparison{}
	if b.cfg.Pin {
		pinning, unpin, err := pin()
		if err != nil {
			return err
		}
		defer unpin()
		c.Pinned = pinning
		b.say("pairs: engine on cpu %s, Postgres, the daemon and the bench on cpu %s", pinning.EngineCPUs, pinning.RestCPUs)
	}
	if err := b.warmUp(ctx, client); err != nil {
		return err
	}
	for i := range b.cfg.Pairs {
		raw, err := b.rawRun(ctx, client)
		if err != nil {
			return fmt.Errorf("pair %d, raw: %w", i+1, err)
		}
		e2e, _, err := b.e2eRun(ctx, "")
		if err != nil {
			return fmt.Errorf("pair %d, end to end: %w", i+1, err)
		}
		p := Pair{Raw: raw, EndToEnd: e2e, Ratio: harness.Round3(e2e.EventsPerSec / raw.EventsPerSec),
			WlprojMicrosPerEvent:      perEvent(e2e.CPUSeconds["wlproj"], e2e.Events),
			PostgresMicrosPerEvent:    perEvent(e2e.DatabaseCPUSeconds, e2e.Events),
			PostgresAllMicrosPerEvent: perEvent(e2e.CPUSeconds["postgres"], e2e.Events)}
		c.Pairs = append(c.Pairs, p)
		b.say("pair %d: raw %.0f/s, end to end %.0f/s, ratio %.3f; wlproj %.1f µs/event, its database %.1f µs/event",
			i+1, raw.EventsPerSec, e2e.EventsPerSec, p.Ratio, p.WlprojMicrosPerEvent, p.PostgresMicrosPerEvent)
	}
	b.rep.Comparison = c
	return nil
}
