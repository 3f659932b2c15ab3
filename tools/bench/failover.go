package main

import (
	"context"
	"fmt"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// 5. kill -9 the leader of two replicas under load; time to the first event
// the other applied (harness.WaitFirstAck).
func (b *bench) failover(ctx context.Context) error {
	if err := b.reset(ctx); err != nil {
		return err
	}
	live := map[string]*harness.Replica{}
	for _, name := range []string{"a", "b"} {
		r, err := b.startReplica(ctx, name)
		if err != nil {
			return err
		}
		live[name] = r
	}
	p := b.startProducer(ctx, b.cfg.FailoverRate, b.cfg.Docs, 0)
	defer p.Stop()
	var samples []float64
	for round := range b.cfg.Failovers {
		secs, err := b.failoverRound(ctx, live)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		samples = append(samples, secs)
		b.say("failover %d/%d: first event applied %.1f ms after the kill", round+1, b.cfg.Failovers, secs*1000)
	}
	p.Stop()
	if err := p.Err(); err != nil {
		return err
	}
	produced := p.Committed()
	_, failed, err := b.waitDrained(ctx, b.drainTimeout(int(produced)))
	if err != nil {
		return err
	}
	b.stopReplicas()
	done, err := b.doneRows(ctx)
	if err != nil {
		return err
	}
	if failed > 0 || done != produced {
		return fmt.Errorf("after the failovers %d events done and %d failed, %d produced", done, failed, produced)
	}
	b.rep.Failover = &Failover{Rounds: len(samples), Rate: b.cfg.FailoverRate, Seconds: harness.NewStats(samples)}
	st := b.rep.Failover.Seconds
	b.say("failover: kill -9 to the first event applied: p50 %.0f ms, p99 %.0f ms, max %.0f ms over %d kills at %d/s",
		st.Median*1000, st.P99*1000, st.Max*1000, len(samples), b.cfg.FailoverRate)
	return nil
}

// failoverRound kills the leader once its standby is ready, returns the
// seconds from the kill to the first event the standby applied, and
// restarts the killed one. The bench's projection is a search index: of
// queued rows that is the ledger's applied_at of the standby's first ack,
// written once the engine answered its first bulk (harness.WaitFirstAck),
// not its first checkpoint, which comes up to a second later.
func (b *bench) failoverRound(ctx context.Context, live map[string]*harness.Replica) (float64, error) {
	settle := time.Second
	if b.cfg.Smoke {
		settle = 300 * time.Millisecond
	}
	if err := harness.Sleep(ctx, settle); err != nil {
		return 0, err
	}
	l, err := waitLeader(ctx, live["a"], live["b"])
	if err != nil {
		return 0, err
	}
	other := map[string]*harness.Replica{"a": live["b"], "b": live["a"]}[l.Name]
	if err := b.waitStandby(ctx, other); err != nil {
		return 0, err
	}
	killedAt, err := harness.Now(ctx, b.pool)
	if err != nil {
		return 0, err
	}
	l.Kill()
	at, err := harness.WaitFirstAck(ctx, stepTimeout, b.pool, killedAt, other.Name)
	if err != nil {
		return 0, err
	}
	if live[l.Name], err = b.startReplica(ctx, l.Name); err != nil {
		return 0, err
	}
	return at.Sub(killedAt).Seconds(), nil
}
