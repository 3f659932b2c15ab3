package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// catchUpTimeout bounds how long the backlog of an outage may take to drain.
const catchUpTimeout = 3 * time.Minute

// scenario is one step of the drill: skip says why it does not run.
type scenario struct {
	name string
	skip bool
	fn   func(context.Context, *Scenario) error
}

// scenarios are every scenario, in the order they run.
func (d *drill) scenarios() []scenario {
	return []scenario{
		// First, on a cluster no fault has touched yet: the steady state.
		{"soak", d.cfg.Soak == 0, d.soak},
		{"kill-9", d.cfg.Kills == 0, d.kill9},
		{"engine-down", false, d.engineDown},
		{"postgres-restart", !d.cfg.PGRestart, d.pgRestart},
		{"network-cut", false, d.networkCut},
		{"rolling-sigterm", false, d.rollingSigterm},
		{"replay-after-delete", d.cfg.Replays == 0, d.replayAfterDelete},
		{"deposed-leader-late-write", false, d.deposedLateWrite},
		{"engine-node-loss", !d.cfg.NodeLoss, d.engineNodeLoss},
		// Last: the others restart or use the first host, which this kills.
		{"postgres-failover", !d.cfg.PGFailover, d.pgFailover},
	}
}

// run plays the scenarios in order. A failed scenario is recorded and the
// next one starts from a repaired cluster, so one failure does not hide the
// others. The replay scenario's failed upserts and their deletes are
// written first, so they wait through every other fault. The database is
// sampled all through each scenario (harness.WatchHealth) and its health
// reported beside the scenario's figures.
func (d *drill) run(ctx context.Context) {
	if d.cfg.Replays > 0 && d.cfg.wants("replay-after-delete") {
		if err := d.seed(ctx); err != nil {
			d.rep.Problem("replay seed: " + err.Error())
			d.say("replay seed: FAILED: %v", err)
		}
	}
	for _, st := range d.scenarios() {
		if st.skip || !d.cfg.wants(st.name) || ctx.Err() != nil {
			continue
		}
		sc := &Scenario{Name: st.name}
		d.rep.Scenarios = append(d.rep.Scenarios, sc)
		start := time.Now()
		d.health = harness.WatchHealth(d.s.DB.Pool, d.healthConfig())
		err := d.repair(ctx)
		if err == nil {
			d.say("%s: start", st.name)
			err = st.fn(ctx, sc)
		}
		sc.Database = ptr(harness.Summarize(d.health.Stop()))
		sc.DurationSeconds = harness.Elapsed(start)
		sc.Takeover = harness.NewStats(sc.takeovers)
		sc.OK = err == nil
		if err != nil {
			sc.Error = err.Error()
			d.rep.Problem(fmt.Sprintf("scenario %s: %v", st.name, err))
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
	for _, p := range d.nodeProxies {
		p.Clear()
	}
	for _, s := range d.slots {
		s.proxy.Restore()
		s.engine.Release()
		if s.cur == nil || !s.cur.r.Alive() {
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

// settled pauses before a fault, so the leader is mid-stream, and returns
// the leader, its epoch and the time on Postgres' clock.
func (d *drill) settled(ctx context.Context) (*slot, int64, time.Time, error) {
	if err := harness.Sleep(ctx, d.cfg.Settle); err != nil {
		return nil, 0, time.Time{}, err
	}
	l, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	now, err := harness.Now(ctx, d.s.DB.Pool)
	return l, epoch, now, err
}

// handover is who took over after a fault, and how fast.
type handover struct {
	next  *slot
	epoch int64
	secs  float64
}

// takeover waits for a leader past epoch and records fault → its first ack
// after after.
func (d *drill) takeover(ctx context.Context, sc *Scenario, epoch int64, fault, after time.Time) (handover, error) {
	next, nextEpoch, err := d.waitLeader(ctx, epoch+1)
	if err != nil {
		return handover{}, err
	}
	ack, err := harness.WaitFirstAck(ctx, stepTimeout, d.s.DB.Pool, after, next.name)
	if err != nil {
		return handover{}, fmt.Errorf("first ack by %s: %w", next.name, err)
	}
	// A term that began before the fault would make a takeover of nothing.
	var began time.Time
	if err := d.s.DB.Pool.QueryRow(ctx, `SELECT acquired_at FROM outbox_leader WHERE holder = $1 AND epoch = $2`,
		next.name, nextEpoch).Scan(&began); err != nil {
		return handover{}, fmt.Errorf("the term of %s at epoch %d: %w", next.name, nextEpoch, err)
	}
	if began.Before(fault) {
		return handover{}, fmt.Errorf("%s led at epoch %d from %s, before the fault at %s", next.name, nextEpoch, began, fault)
	}
	h := handover{next: next, epoch: nextEpoch, secs: harness.Round3(ack.Sub(fault).Seconds())}
	sc.takeovers = append(sc.takeovers, h.secs)
	sc.Leaders = append(sc.Leaders, next.name)
	return h, nil
}

// killLeaderNow kills old, the leader at epoch, with SIGKILL (its metrics
// scraped just before: a killed process cannot be read) and waits for the
// next leader's first event applied. The kill's time is read on the
// database's clock after the scrape, right before the kill.
func (d *drill) killLeaderNow(ctx context.Context, sc *Scenario, old *slot, epoch int64) (handover, error) {
	old.cur.scrape()
	t0, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		return handover{}, err
	}
	old.cur.r.Kill()
	return d.takeover(ctx, sc, epoch, t0, t0)
}

func (d *drill) kill9(ctx context.Context, sc *Scenario) error {
	for i := 1; i <= d.cfg.Kills; i++ {
		old, epoch, _, err := d.settled(ctx)
		if err != nil {
			return err
		}
		h, err := d.killLeaderNow(ctx, sc, old, epoch)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		d.say("kill-9 %d/%d: killed %s (epoch %d); %s led at epoch %d and acked %.3f s after the kill",
			i, d.cfg.Kills, old.name, epoch, h.next.name, h.epoch, h.secs)
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
	if err := harness.Sleep(ctx, d.cfg.Settle); err != nil {
		return err
	}
	var before int64
	for range 10 {
		n, err := d.backlog(ctx)
		if err != nil {
			return err
		}
		before = max(before, n)
		if err := harness.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	sc.BacklogBefore, sc.BacklogPeak = ptr(before), ptr(before)

	d.engine.Set(faultproxy.Fault{Refuse: true})
	d.say("engine-down: the engine refuses connections for %s", d.cfg.Outage)
	if err := d.sampleUntil(ctx, sc, time.Now().Add(d.cfg.Outage)); err != nil {
		return err
	}
	t0, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		return err
	}
	d.engine.Clear()
	d.say("engine-down: engine back; backlog peaked at %d", *sc.BacklogPeak)
	if err := d.catchUp(ctx, sc, t0); err != nil {
		return err
	}
	// The replay scenario's upserts failed on purpose, and at once.
	var maxAttempts, failed int64
	if err := d.s.DB.Pool.QueryRow(ctx, `
		SELECT coalesce(max(attempts), 0), count(*) FILTER (WHERE status = 'failed' AND error_class = 'transient')
		  FROM `+harness.ArchivedEventStates).Scan(&maxAttempts, &failed); err != nil {
		return err
	}
	sc.MaxAttempts = ptr(maxAttempts)
	d.say("engine-down: caught up %.1f s after the engine came back (max attempts %d)", *sc.CatchUpSeconds, maxAttempts)
	if failed > 0 {
		return fmt.Errorf("%d events failed: the outage outlasted OUTBOX_MAX_ATTEMPTS=%d", failed, d.cfg.MaxAttempts)
	}
	return nil
}

// sampleBacklog keeps the backlog's peak.
func (d *drill) sampleBacklog(ctx context.Context, sc *Scenario) error {
	n, err := d.backlog(ctx)
	sc.BacklogPeak = ptr(max(*sc.BacklogPeak, n))
	return err
}

// sampleUntil keeps the backlog's peak, sampled every 250 ms, until end:
// while a fault lasts.
func (d *drill) sampleUntil(ctx context.Context, sc *Scenario, end time.Time) error {
	for time.Now().Before(end) {
		if err := d.sampleBacklog(ctx, sc); err != nil {
			return err
		}
		if err := harness.Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// catchUp waits until every event written before the engine came back at
// t0 is out of the backlog. Comparing the backlog with its level before the
// outage would instead measure the steady-state lag, which a loaded machine
// raises.
func (d *drill) catchUp(ctx context.Context, sc *Scenario, t0 time.Time) error {
	back := time.Now()
	err := d.waitWritten(ctx, sc, "the events from before the engine came back to be done", func(ctx context.Context) bool {
		if sc.FirstAckSeconds == nil {
			if at, ok, err := harness.AppliedAfter(ctx, d.s.DB.Pool, t0, ""); err == nil && ok {
				sc.FirstAckSeconds = ptr(harness.Round3(at.Sub(t0).Seconds()))
			}
		}
		return sc.FirstAckSeconds != nil
	})
	if err != nil {
		return err
	}
	sc.CatchUpSeconds = ptr(harness.Elapsed(back))
	return nil
}

// writtenBacklogSQL counts the events up to an id not done or failed yet:
// the claimed ones by their status, the queued ones no position has passed
// (a queued row that succeeds is never written). Both through an index:
// the drill asks every 100 ms of an outbox that grows for its whole run.
const writtenBacklogSQL = `
SELECT (SELECT count(*) FROM outbox_events WHERE id <= $1 AND status IN ('pending', 'processing'))
     + (SELECT count(*) FROM outbox_queue_backlog WHERE id <= $1)`

// waitWritten waits until every event written so far is out of the
// backlog, and also holds if given, for at most catchUpTimeout, keeping
// the backlog's peak meanwhile.
func (d *drill) waitWritten(ctx context.Context, sc *Scenario, what string, also func(context.Context) bool) error {
	var lastID int64
	if err := d.s.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox_events`).Scan(&lastID); err != nil {
		return err
	}
	var n int64
	err := harness.PollAt(ctx, 100*time.Millisecond, catchUpTimeout, what, func(ctx context.Context) (bool, error) {
		if err := d.sampleBacklog(ctx, sc); err != nil {
			return false, harness.Fatal(err)
		}
		if err := d.s.DB.Pool.QueryRow(ctx, writtenBacklogSQL, lastID).Scan(&n); err != nil {
			return false, harness.Fatal(err)
		}
		return (also == nil || also(ctx)) && n == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d events still not done: %w", n, err)
	}
	return nil
}

func (d *drill) pgRestart(ctx context.Context, sc *Scenario) error {
	_, epoch, t0, err := d.settled(ctx)
	if err != nil {
		return err
	}
	d.say("postgres-restart: pg_ctl restart -m fast")
	d.pgRestarted = true
	start := time.Now()
	if err := d.cfg.PG.restart(); err != nil {
		return err
	}
	sc.PGDownSeconds = ptr(harness.Elapsed(start))
	var started time.Time
	if err := d.poll(ctx, "Postgres back", func(ctx context.Context) (bool, error) {
		err := d.s.DB.Pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&started)
		return err == nil, err
	}); err != nil {
		return err
	}
	h, err := d.takeover(ctx, sc, epoch, t0, started)
	if err != nil {
		return err
	}
	d.say("postgres-restart: %s led at epoch %d and acked %.3f s after the restart began", h.next.name, h.epoch, h.secs)
	// Both replicas must find their way back without help.
	return d.waitStandby(ctx, d.other(h.next))
}

func (d *drill) networkCut(ctx context.Context, sc *Scenario) error {
	old, epoch, t0, err := d.settled(ctx)
	if err != nil {
		return err
	}
	old.proxy.Blackhole()
	cut := time.Now()
	stepped := d.stepDown(ctx, old.cur.r)
	d.say("network-cut: %s's path to Postgres blackholed; resetting the server side in %s", old.name, keepaliveWindow)
	if err := harness.Sleep(ctx, time.Until(cut.Add(keepaliveWindow))); err != nil {
		return err
	}
	// Postgres' keepalive would now give up on the session and free the lock.
	old.proxy.DropUpstream()
	h, err := d.takeover(ctx, sc, epoch, t0, t0)
	if err != nil {
		return err
	}
	if h.next == old {
		return fmt.Errorf("%s still leads though cut off", old.name)
	}
	at, ok := <-stepped
	if !ok {
		return fmt.Errorf("the cut leader %s never said standby on /healthz", old.name)
	}
	sc.StopWritingSeconds = ptr(harness.Round3(at.Sub(cut).Seconds()))
	d.say("network-cut: %s stopped writing %.3f s after the cut; %s led at epoch %d and acked %.3f s after it",
		old.name, *sc.StopWritingSeconds, h.next.name, h.epoch, h.secs)
	old.proxy.Restore()
	return d.waitStandby(ctx, old)
}

// stepDown watches a cut leader's /healthz from now on and sends when it
// says standby, which it does once its services have stopped writing; the
// channel is closed without a value if it never does.
func (d *drill) stepDown(ctx context.Context, r *harness.Replica) <-chan time.Time {
	stepped := make(chan time.Time, 1)
	go func() {
		defer close(stepped)
		if r.WaitRole(ctx, keepaliveWindow+stepTimeout, harness.RoleStandby) == nil {
			stepped <- time.Now()
		}
	}()
	return stepped
}

func (d *drill) rollingSigterm(ctx context.Context, sc *Scenario) error {
	l, _, _, err := d.settled(ctx)
	if err != nil {
		return err
	}
	// Standby first, as an operator would: the leader moves only once.
	for _, s := range []*slot{d.other(l), l} {
		if err := d.sigterm(ctx, sc, s, s == l); err != nil {
			return err
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

// sigterm stops s's replica with SIGTERM, which must exit 0; if it led, the
// other takes over.
func (d *drill) sigterm(ctx context.Context, sc *Scenario, s *slot, leads bool) error {
	_, epoch, err := d.waitLeader(ctx, 0)
	if err != nil {
		return err
	}
	p := s.cur
	p.scrape()
	t0, err := harness.Now(ctx, d.s.DB.Pool)
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
	if !leads {
		d.say("rolling-sigterm: standby %s exited 0", s.name)
		return nil
	}
	h, err := d.takeover(ctx, sc, epoch, t0, t0)
	if err != nil {
		return err
	}
	d.say("rolling-sigterm: leader %s exited 0; %s acked %.3f s after the SIGTERM", s.name, h.next.name, h.secs)
	return nil
}

// finish stops the producer, waits for the drain and checks every event.
func (d *drill) finish(ctx context.Context) {
	d.prod.pause()
	d.say("producer stopped; draining")
	if err := d.repair(ctx); err != nil {
		d.rep.Problem("before the drain: " + err.Error())
	}
	if err := harness.WaitDrained(ctx, d.cfg.DrainTimeout, d.s.DB.Pool); err != nil {
		d.rep.Problem("the outbox did not drain: " + err.Error())
		if ctx.Err() != nil {
			return
		}
	}
	v, err := harness.VerifyRotated(ctx, d.s.DB.Pool, d.cfg.ElasticURL, d.s.Index, d.rotation())
	if err != nil {
		d.rep.Problem("verify: " + err.Error())
		return
	}
	committed, unversioned, failedInserts, late := d.prod.counts()
	d.rep.Events = settle(v, committed+d.written)
	d.rep.Events.ProducerCommitted, d.rep.Events.ProducerErrors = committed, failedInserts
	d.rep.Events.DrillWritten, d.rep.Events.Late, d.rep.Events.Unversioned = d.written, late, unversioned
	if e := d.rep.Events; e.Vanished > 0 {
		d.rep.Problem(fmt.Sprintf("%d events lost: %d written, %d in the outbox: rows gone without being counted",
			e.Lost, e.ProducerCommitted+e.DrillWritten, e.Produced))
	}
	if e := d.rep.Events; e.Unaccounted > 0 && e.ProducerErrors == 0 {
		d.rep.Problem(fmt.Sprintf("%d rows in the outbox that no one wrote", e.Unaccounted))
	}
	d.rep.Entities = v.Entities
	d.rep.Regressed, d.rep.Missing, d.rep.Resurrected = len(v.Regressed), len(v.Missing), len(v.Resurrected)
	d.rep.LedgerMismatch = len(v.LedgerMismatch)
	for _, list := range [][]string{v.Regressed, v.Missing, v.Resurrected, v.LedgerMismatch} {
		d.rep.BadSamples = append(d.rep.BadSamples, list[:min(len(list), 5)]...)
	}
	if !v.OK() {
		d.rep.Problem("verify: " + v.String())
	}
	d.verifyIndex(ctx)
	if v.Events == 0 {
		d.rep.Problem("no events were produced")
	}
	if err := d.s.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FROM `+harness.ArchivedEventStates+` WHERE error_history @> '[{"event": "stuck_reclaimed"}]'`).Scan(&d.rep.DuplicateSends); err != nil {
		d.rep.Problem("count duplicate sends: " + err.Error())
	}
	if err := d.s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM `+harness.ArchivedEventStates+` WHERE replay_count > 0`).Scan(&d.rep.ReplayedRows); err != nil {
		d.rep.Problem("count replayed rows: " + err.Error())
	}
	d.countProcs()
	d.countRotations(ctx)
}

// countRotations reads what the archive kept and checks that each table
// rotated at least -min-rotations times by the replicas' counters.
func (d *drill) countRotations(ctx context.Context) {
	var err error
	if d.rep.Rotations.Archive, err = harness.ArchivedTruncations(ctx, d.s.DB.Pool); err != nil {
		d.rep.Problem("read the rotation archive: " + err.Error())
	}
	for _, p := range d.rep.Rotations.check(d.cfg.MinRotations) {
		d.rep.Problem(p)
	}
}

// countProcs adds up what every replica process served and printed.
func (d *drill) countProcs() {
	for _, s := range d.slots {
		if s.cur.r.Alive() {
			s.cur.scrape()
		}
	}
	d.procsMu.Lock()
	defer d.procsMu.Unlock()
	var processed int64
	for _, p := range d.procs {
		d.rep.FencedAcks += int64(p.fenced.Max())
		d.rep.SupersededByLedger += int64(p.ledger.Max())
		processed += int64(p.processed.Max())
		d.rep.Rotations.Events += int64(p.eventsRotations.Max())
		d.rep.Rotations.Ledger += int64(p.ledgerRotations.Max())
		for _, line := range strings.Split(p.r.Logs(), "\n") {
			// Postgres' own words for a missing grant (SQLSTATE 42501).
			if strings.Contains(line, "permission denied") {
				d.rep.PermissionErrors++
			}
		}
	}
	if d.rep.PermissionErrors > 0 {
		d.rep.Problem(fmt.Sprintf("%d replica log lines say permission denied: roles.sql misses a grant", d.rep.PermissionErrors))
	}
	d.rep.ResentAtLeast = max(0, processed-d.rep.Events.Done)
}
