package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/wlproj/wlproj/internal/faultproxy"
	"github.com/wlproj/wlproj/internal/rig"
	"github.com/wlproj/wlproj/internal/verify"
)

// catchUpTimeout bounds how long the backlog of an outage may take to drain.
const catchUpTimeout = 3 * time.Minute

// run plays the scenarios in order. A failed scenario is recorded and the
// next one starts from a repaired cluster, so one failure does not hide the
// others.
func (d *drill) run(ctx context.Context) {
	steps := []struct {
		name string
		skip bool
		fn   func(context.Context, *Scenario) error
	}{
		{"kill-9", d.cfg.Kills == 0, d.kill9},
		{"engine-down", false, d.engineDown},
		{"postgres-restart", !d.cfg.PGRestart, d.pgRestart},
		{"network-cut", false, d.networkCut},
		{"rolling-sigterm", false, d.rollingSigterm},
	}
	for _, st := range steps {
		if st.skip || ctx.Err() != nil {
			continue
		}
		sc := &Scenario{Name: st.name}
		d.rep.Scenarios = append(d.rep.Scenarios, sc)
		start := time.Now()
		err := d.repair(ctx)
		if err == nil {
			d.say("%s: start", st.name)
			err = st.fn(ctx, sc)
		}
		sc.DurationSeconds = rig.Round3(time.Since(start).Seconds())
		sc.Takeover = rig.NewStats(sc.takeovers)
		sc.OK = err == nil
		if err != nil {
			sc.Error = err.Error()
			d.problem(fmt.Sprintf("scenario %s: %v", st.name, err))
			d.say("%s: FAILED: %v", st.name, err)
		} else {
			d.say("%s: ok", st.name)
		}
	}
}

// repair brings the cluster back to two live replicas, one leader and one
// ready standby, with every path open.
func (d *drill) repair(ctx context.Context) error {
	d.engine.Clear()
	for _, s := range d.slots {
		s.proxy.Restore()
		if !s.cur.alive() {
			if err := d.startProc(ctx, s); err != nil {
				return err
			}
		}
	}
	l, _, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	return d.waitStandby(ctx, d.other(l))
}

// takeover records fault → first ack by the new leader after after.
func (d *drill) takeover(ctx context.Context, sc *Scenario, fault, after time.Time, by *slot) (float64, error) {
	ack, err := d.firstAck(ctx, after, by.name)
	if err != nil {
		return 0, fmt.Errorf("first ack by %s: %w", by.name, err)
	}
	secs := rig.Round3(ack.Sub(fault).Seconds())
	sc.takeovers = append(sc.takeovers, secs)
	sc.Leaders = append(sc.Leaders, by.name)
	return secs, nil
}

func (d *drill) kill9(ctx context.Context, sc *Scenario) error {
	for i := 1; i <= d.cfg.Kills; i++ {
		if err := pause(ctx, d.cfg.Settle); err != nil {
			return err
		}
		old, epoch, err := d.waitLeader(ctx, 0)
		if err != nil {
			return err
		}
		old.cur.scrape()
		t0, err := d.dbNow(ctx)
		if err != nil {
			return err
		}
		old.cur.r.Kill()
		next, nextEpoch, err := d.waitLeader(ctx, epoch+1)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		secs, err := d.takeover(ctx, sc, t0, t0, next)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		d.say("kill-9 %d/%d: killed %s (epoch %d); %s led at epoch %d and acked %.3f s after the kill",
			i, d.cfg.Kills, old.name, epoch, next.name, nextEpoch, secs)
		if err := d.startProc(ctx, old); err != nil {
			return err
		}
		if err := d.waitStandby(ctx, old); err != nil {
			return err
		}
	}
	return nil
}

func (d *drill) engineDown(ctx context.Context, sc *Scenario) error {
	if err := pause(ctx, d.cfg.Settle); err != nil {
		return err
	}
	var before int64
	for range 10 {
		n, err := d.backlog(ctx)
		if err != nil {
			return err
		}
		before = max(before, n)
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	sc.BacklogBefore = ptr(before)
	peak := before
	sample := func() (int64, error) {
		n, err := d.backlog(ctx)
		peak = max(peak, n)
		return n, err
	}

	d.engine.Set(faultproxy.Fault{Refuse: true})
	d.say("engine-down: the engine refuses connections for %s", d.cfg.Outage)
	for end := time.Now().Add(d.cfg.Outage); time.Now().Before(end); {
		if _, err := sample(); err != nil {
			return err
		}
		if err := pause(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	t0, err := d.dbNow(ctx)
	if err != nil {
		return err
	}
	d.engine.Clear()
	back := time.Now()
	d.say("engine-down: engine back; backlog peaked at %d", peak)

	// Caught up: every event written before the engine came back is out of
	// the backlog. Comparing the backlog with its level before the outage
	// would instead measure the steady-state lag, which a loaded machine
	// raises.
	var lastID int64
	if err := d.admin.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox_events`).Scan(&lastID); err != nil {
		return err
	}
	var firstAck *time.Time
	for {
		if _, err := sample(); err != nil {
			return err
		}
		var n int64
		if err := d.admin.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE id <= $1 AND status IN ('pending', 'processing')`, lastID).Scan(&n); err != nil {
			return err
		}
		if firstAck == nil {
			var at *time.Time
			if err := d.admin.QueryRow(ctx, `SELECT min(processed_at) FROM outbox_events WHERE status = 'done' AND processed_at > $1`, t0).Scan(&at); err == nil && at != nil {
				firstAck = at
				sc.FirstAckSeconds = ptr(rig.Round3(at.Sub(t0).Seconds()))
			}
		}
		if firstAck != nil && n == 0 {
			sc.CatchUpSeconds = ptr(rig.Round3(time.Since(back).Seconds()))
			break
		}
		if time.Since(back) > catchUpTimeout {
			return fmt.Errorf("%d events from before the engine came back still not done after %s", n, catchUpTimeout)
		}
		if err := pause(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	sc.BacklogPeak = ptr(peak)
	var maxAttempts, failed int64
	if err := d.admin.QueryRow(ctx, `SELECT coalesce(max(attempts), 0), count(*) FILTER (WHERE status = 'failed') FROM outbox_events`).Scan(&maxAttempts, &failed); err != nil {
		return err
	}
	sc.MaxAttempts = ptr(maxAttempts)
	d.say("engine-down: caught up %.1f s after the engine came back (max attempts %d)", *sc.CatchUpSeconds, maxAttempts)
	if failed > 0 {
		return fmt.Errorf("%d events failed: the outage outlasted OUTBOX_MAX_ATTEMPTS=%d", failed, d.cfg.MaxAttempts)
	}
	return nil
}

func (d *drill) pgRestart(ctx context.Context, sc *Scenario) error {
	if err := pause(ctx, d.cfg.Settle); err != nil {
		return err
	}
	_, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	t0, err := d.dbNow(ctx)
	if err != nil {
		return err
	}
	d.say("postgres-restart: pg_ctl restart -m fast")
	d.pgRestarted = true
	start := time.Now()
	if err := d.cfg.PG.restart(); err != nil {
		return err
	}
	sc.PGDownSeconds = ptr(rig.Round3(time.Since(start).Seconds()))
	var started time.Time
	if err := d.poll(ctx, "Postgres back", func(ctx context.Context) (bool, error) {
		err := d.admin.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started)
		return err == nil, err
	}); err != nil {
		return err
	}
	next, nextEpoch, err := d.waitLeader(ctx, epoch+1)
	if err != nil {
		return err
	}
	secs, err := d.takeover(ctx, sc, t0, started, next)
	if err != nil {
		return err
	}
	d.say("postgres-restart: %s led at epoch %d and acked %.3f s after the restart began", next.name, nextEpoch, secs)
	// Both replicas must find their way back without help.
	return d.waitStandby(ctx, d.other(next))
}

func (d *drill) networkCut(ctx context.Context, sc *Scenario) error {
	if err := pause(ctx, d.cfg.Settle); err != nil {
		return err
	}
	old, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	t0, err := d.dbNow(ctx)
	if err != nil {
		return err
	}
	old.proxy.Blackhole()
	cut := time.Now()
	d.say("network-cut: %s's path to Postgres blackholed; resetting the server side in %s", old.name, keepaliveWindow)
	if err := pause(ctx, time.Until(cut.Add(keepaliveWindow))); err != nil {
		return err
	}
	// Postgres' keepalive would now give up on the session and free the lock.
	old.proxy.DropUpstream()
	next, nextEpoch, err := d.waitLeader(ctx, epoch+1)
	if err != nil {
		return err
	}
	if next == old {
		return fmt.Errorf("%s still leads though cut off", old.name)
	}
	secs, err := d.takeover(ctx, sc, t0, t0, next)
	if err != nil {
		return err
	}
	lost, ok := old.cur.watch.after(msgLostLeadership, cut)
	if !ok {
		return fmt.Errorf("the cut leader %s never logged %q", old.name, msgLostLeadership)
	}
	sc.StopWritingSeconds = ptr(rig.Round3(lost.Sub(cut).Seconds()))
	d.say("network-cut: %s stopped writing %.3f s after the cut; %s led at epoch %d and acked %.3f s after it",
		old.name, *sc.StopWritingSeconds, next.name, nextEpoch, secs)
	old.proxy.Restore()
	return d.waitStandby(ctx, old)
}

func (d *drill) rollingSigterm(ctx context.Context, sc *Scenario) error {
	if err := pause(ctx, d.cfg.Settle); err != nil {
		return err
	}
	l, _, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	// Standby first, as an operator would: the leader moves only once.
	for _, s := range []*slot{d.other(l), l} {
		_, epoch, err := d.waitLeader(ctx, 0)
		if err != nil {
			return err
		}
		p := s.cur
		p.scrape()
		t0, err := d.dbNow(ctx)
		if err != nil {
			return err
		}
		if err := p.r.Signal(syscall.SIGTERM); err != nil {
			return err
		}
		code, err := p.r.ExitCode(shutdownGrace + 20*time.Second)
		sc.ExitCodes = append(sc.ExitCodes, code)
		if err != nil {
			p.r.Kill()
			return err
		}
		if code != 0 {
			return fmt.Errorf("%s exited %d on SIGTERM", s.name, code)
		}
		if s == l {
			next, _, err := d.waitLeader(ctx, epoch+1)
			if err != nil {
				return err
			}
			secs, err := d.takeover(ctx, sc, t0, t0, next)
			if err != nil {
				return err
			}
			d.say("rolling-sigterm: leader %s exited 0; %s acked %.3f s after the SIGTERM", s.name, next.name, secs)
		} else {
			d.say("rolling-sigterm: standby %s exited 0", s.name)
		}
		if err := d.startProc(ctx, s); err != nil {
			return err
		}
		if err := d.waitStandby(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// finish stops the producer, waits for the drain and checks every event.
func (d *drill) finish(ctx context.Context) {
	d.prod.stop()
	d.say("producer stopped; draining")
	if err := d.repair(ctx); err != nil {
		d.problem("before the drain: " + err.Error())
	}
	deadline := time.Now().Add(d.cfg.DrainTimeout)
	for {
		n, err := d.backlog(ctx)
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			d.problem(fmt.Sprintf("the outbox did not drain within %s (backlog %d, %v)", d.cfg.DrainTimeout, n, err))
			break
		}
		if pause(ctx, 200*time.Millisecond) != nil {
			d.problem("interrupted during the drain")
			return
		}
	}

	rep, err := verify.Check(ctx, d.admin, d.cfg.ElasticURL, d.index)
	if err != nil {
		d.problem("verify: " + err.Error())
		return
	}
	d.rep.Events = Events{Produced: rep.Events, Done: rep.Done, Failed: rep.Failed,
		FailedWithoutReason: rep.FailedWithoutReason, Lost: rep.Lost,
		ProducerCommitted: d.prod.committed.Load(), ProducerErrors: d.prod.errors.Load()}
	d.rep.Entities = rep.Entities
	d.rep.Regressed, d.rep.Missing, d.rep.Resurrected = len(rep.Regressed), len(rep.Missing), len(rep.Resurrected)
	for _, list := range [][]string{rep.Regressed, rep.Missing, rep.Resurrected} {
		d.rep.BadSamples = append(d.rep.BadSamples, list[:min(len(list), 5)]...)
	}
	if !rep.OK() {
		d.problem("verify: " + rep.String())
	}
	if rep.Events == 0 {
		d.problem("no events were produced")
	}

	if err := d.admin.QueryRow(ctx, `
		SELECT count(*) FROM outbox_events WHERE error_history @> '[{"event": "stuck_reclaimed"}]'`).Scan(&d.rep.DuplicateSends); err != nil {
		d.problem("count duplicate sends: " + err.Error())
	}
	for _, s := range d.slots {
		if s.cur.alive() {
			s.cur.scrape()
		}
	}
	d.procsMu.Lock()
	for _, p := range d.procs {
		fenced, perm := p.watch.counts()
		d.rep.FencedAcks.Logs += fenced
		d.rep.FencedAcks.Metrics += p.fencedMetric
		d.rep.PermissionErrors += perm
	}
	d.procsMu.Unlock()
	if d.rep.PermissionErrors > 0 {
		d.problem(fmt.Sprintf("%d replica log lines say permission denied: roles.sql misses a grant", d.rep.PermissionErrors))
	}
}
