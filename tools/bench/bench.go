package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// Config is what one bench run measures and how.
type Config struct {
	AdminURL, ElasticURL string
	// Command is how the run was started (Report.Command).
	Command string

	Docs, DocBytes     int
	Batch, Concurrency int
	BareBatch          int
	Rate               int
	Duration           time.Duration
	Failovers          int
	FailoverRate       int
	DoneRows           int
	FailedRows         int
	// ParkedRows is the paused projection's pending rows, and then the rows
	// waiting out a backoff, that the claim cost step claims beside.
	ParkedRows int
	// ScaleRows is the done history the sql-at-scale step runs every
	// scheduled and per-batch statement next to.
	ScaleRows    int
	ClaimSamples int
	PGRounds     int
	// Pairs is the raw/end-to-end pairs of the comparison step.
	Pairs          int
	RebuildRows    int
	ConsoleRows    int
	ConsoleSamples int

	RetentionRate     int
	RetentionDuration time.Duration
	Retention         time.Duration
	RetentionSample   time.Duration
	RetentionDocs     int
	RetentionSeed     int

	// SustainedRates are the steady rates of the sustained step, each run
	// in both table states.
	SustainedRates    []int
	SustainedDuration time.Duration
	SustainedHistory  int

	Verify   VerifyConfig
	NetDelay NetDelayConfig
	River    RiverConfig
	Soak     SoakConfig

	// Pin runs the pairs step with the engine on one core and everything
	// else on the other.
	Pin bool
	// ReplicaSettings are KEY=VALUE settings every replica the bench starts
	// gets after its own, to compare a setting's values in one sitting.
	ReplicaSettings []string
	// Steps names the steps to run; empty runs all of them.
	Steps      []string
	Out        string
	CPUProfile string
	// LoopCPUProfile, if set, profiles the loop of steps 3 and 16, which
	// runs in the bench's own process (-loop-cpuprofile).
	LoopCPUProfile string
	Bin            string
	Smoke          bool
	Verbose        bool
	Log            io.Writer
}

func defaultConfig() Config {
	return Config{
		Docs: 200_000, DocBytes: 1024, Batch: 500, Concurrency: 2, BareBatch: 1000,
		Rate: 1000, Duration: 30 * time.Second, Failovers: 100, FailoverRate: 200,
		DoneRows: 1_000_000, FailedRows: 10_000, ParkedRows: 300_000, ScaleRows: 10_000_000, ClaimSamples: 100, PGRounds: 2,
		Pairs: 3, Pin: true, RebuildRows: 200_000, ConsoleRows: 100_000, ConsoleSamples: 20,
		RetentionRate: 1000, RetentionDuration: 5 * time.Minute, Retention: time.Minute,
		RetentionSample: 10 * time.Second, RetentionDocs: 20_000,
		SustainedRates: []int{2000, 500}, SustainedDuration: 10 * time.Minute, SustainedHistory: 1_000_000,
		Out: "tools/bench/results/results.json", CPUProfile: "tools/bench/results/leader-cpu.pprof", Verify: defaultVerifyConfig(),
		NetDelay: defaultNetDelayConfig(), River: defaultRiverConfig(), Soak: defaultSoakConfig(),
	}
}

// smoke shrinks every step so the whole run takes well under a minute.
func (c Config) smoke() Config {
	c.Smoke = true
	c.Docs, c.Rate, c.Duration = 3000, 200, 3*time.Second
	c.Failovers, c.FailoverRate = 2, 200
	c.DoneRows, c.FailedRows, c.ClaimSamples = 20_000, 200, 20
	c.ParkedRows, c.ScaleRows = 5_000, 100_000
	// The pruner runs at the start of a term, then every 10 s: the smoke
	// run is shorter, so done rows older than the retention are written
	// before the leader starts, for its first round to delete.
	c.RetentionRate, c.RetentionDuration, c.Retention = 200, 4*time.Second, 2*time.Second
	c.RetentionSample, c.RetentionDocs, c.RetentionSeed = time.Second, 300, 2000
	c.Pairs, c.RebuildRows, c.ConsoleRows, c.ConsoleSamples = 2, 3000, 2000, 3
	c.SustainedRates, c.SustainedDuration, c.SustainedHistory = []int{200}, 3*time.Second, 5000
	c.CPUProfile, c.Pin = "", false
	c.Verify = c.Verify.smoke()
	c.NetDelay = c.NetDelay.smoke()
	c.River = c.River.smoke()
	c.Soak = c.Soak.smoke()
	return c
}

func (c Config) validate() error {
	for _, f := range []struct {
		name      string
		v, lo, hi int
	}{
		{"-n", c.Docs, 1, 100_000_000}, {"-doc-bytes", c.DocBytes, 64, 1 << 20},
		{"-batch", c.Batch, 1, 10_000}, {"-concurrency", c.Concurrency, 1, 64},
		{"-bare-batch", c.BareBatch, 1, 10_000}, {"-rate", c.Rate, 1, 100_000},
		{"-failovers", c.Failovers, 1, 1000}, {"-failover-rate", c.FailoverRate, 1, 100_000},
		{"-done-rows", c.DoneRows, 0, 100_000_000}, {"-failed-rows", c.FailedRows, 0, 100_000_000},
		{"-parked-rows", c.ParkedRows, 0, 100_000_000}, {"-scale-rows", c.ScaleRows, 1, 100_000_000},
		{"-claim-samples", c.ClaimSamples, 1, 100_000}, {"-pg-rounds", c.PGRounds, 1, 100},
		{"-retention-rate", c.RetentionRate, 1, 100_000}, {"-retention-docs", c.RetentionDocs, 1, 100_000_000},
		{"-retention-seed", c.RetentionSeed, 0, 100_000_000},
		{"-pairs", c.Pairs, 1, 100}, {"-rebuild-rows", c.RebuildRows, 1, 100_000_000},
		{"-console-rows", c.ConsoleRows, 1, 100_000_000}, {"-console-samples", c.ConsoleSamples, 1, 10_000},
		{"-sustained-history", c.SustainedHistory, 0, 100_000_000},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("%s=%d is out of range [%d, %d]", f.name, f.v, f.lo, f.hi)
		}
	}
	for _, step := range []func() error{c.Verify.validate, c.NetDelay.validate, c.River.validate, c.Soak.validate} {
		if err := step(); err != nil {
			return err
		}
	}
	switch {
	case c.Duration < 100*time.Millisecond:
		return fmt.Errorf("-duration=%s is below 100ms", c.Duration)
	case c.SustainedDuration < time.Second:
		return fmt.Errorf("-sustained-duration=%s is below 1s", c.SustainedDuration)
	case c.Retention < time.Second:
		return fmt.Errorf("-retention=%s is below 1s, the daemon's minimum", c.Retention)
	case c.RetentionSample < 100*time.Millisecond:
		return fmt.Errorf("-retention-sample=%s is below 100ms", c.RetentionSample)
	case c.RetentionSample*2 > c.Retention:
		// At least two samples per retention, so that the rows' plateau
		// shows between two prune rounds.
		return fmt.Errorf("-retention-sample=%s is over half of -retention=%s", c.RetentionSample, c.Retention)
	case c.RetentionDuration < 3*c.RetentionSample:
		return fmt.Errorf("-retention-duration=%s is under 3 samples of -retention-sample=%s", c.RetentionDuration, c.RetentionSample)
	case c.AdminURL == "":
		return errors.New("DATABASE_URL is not set: run `make bench` (it starts the local stack) or source .stack/env")
	case c.ElasticURL == "":
		return errors.New("ELASTIC_URL is not set: run `make bench` (it starts the local stack) or source .stack/env")
	case c.Out == "":
		return errors.New("-out is empty")
	}
	return c.validateLists()
}

// validateLists checks the settings that are lists: steps, rates, the
// replicas' settings.
func (c Config) validateLists() error {
	known := []string{}
	for _, s := range (&bench{}).steps() {
		known = append(known, s.flag)
	}
	for _, s := range c.Steps {
		if !slices.Contains(known, s) {
			return fmt.Errorf("-steps: unknown step %q (known: %s)", s, strings.Join(known, ","))
		}
	}
	if len(c.SustainedRates) == 0 {
		return errors.New("-sustained-rate names no rate")
	}
	for _, r := range c.SustainedRates {
		if r < 1 || r > 100_000 {
			return fmt.Errorf("-sustained-rate=%d is outside 1..100000", r)
		}
	}
	for _, kv := range c.ReplicaSettings {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("-replica-env: %q is not KEY=VALUE", kv)
		}
	}
	return nil
}

// bench holds what the steps share: one database and the wlproj binary.
type bench struct {
	cfg  Config
	rep  *Report
	s    *harness.Session
	pool *pgxpool.Pool
	// index is written by the daemon; the raw baseline has its own.
	index string

	replicas []*harness.Replica
	// health samples the database during a step under load.
	health *harness.HealthWatch
	// healthPool is the health sampler's, apart from pool.
	healthPool *pgxpool.Pool
	// loopProfiles counts the loop's CPU profiles written so far.
	loopProfiles int
}

// stepTimeout bounds every wait for one thing to happen: a leader, a
// standby, an ack.
const stepTimeout = 30 * time.Second

// Run sets up, runs the steps and writes the report. The database, the
// indices and every process it started are gone when it returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, rep: newReport(cfg)}
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	defer b.s.Close()
	for _, s := range b.steps() {
		if len(cfg.Steps) > 0 && !slices.Contains(cfg.Steps, s.flag) {
			continue
		}
		if err := b.quiesce(ctx); err != nil {
			return b.rep, err
		}
		start := time.Now()
		b.say("step: %s", s.name)
		if err := b.watchHealth(ctx, s); err != nil {
			return b.rep, err
		}
		err := s.run(ctx)
		b.recordHealth(s)
		if err != nil {
			return b.rep, fmt.Errorf("%s: %w", s.name, err)
		}
		b.say("step: %s took %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	b.rep.finish()
	if err := harness.WriteJSON(cfg.Out, b.rep); err != nil {
		return b.rep, err
	}
	return b.rep, nil
}

type step struct {
	flag, name string
	run        func(context.Context) error
	// load: the step runs wlproj under load, and the database's health is
	// sampled (health.go) and reported beside its figures.
	load bool
}

// steps are every step in order. Those without load measure no wlproj
// under load: raw bulk runs none, claim cost and the console time single
// statements on a table at rest, sqlscale runs go test.
func (b *bench) steps() []step {
	return []step{
		{"raw", "raw bulk", b.rawBulk, false},
		{"e2e", "end to end", b.endToEnd, true},
		{"pg", "postgres path", b.postgresPath, true},
		{"latency", "latency", b.latency, true},
		{"failover", "failover", b.failover, true},
		{"claim", "claim cost", b.claimCost, false},
		{"retention", "retention", b.retention, true},
		{"pairs", "raw and end to end in turn", b.pairs, true},
		{"rebuild", "rebuild", b.rebuild, true},
		{"console", "console", b.console, false},
		{"sustained", "sustained live load", b.sustained, true},
		{"verify", "verify", b.verifyStep, true},
		{"sqlscale", "statements at scale", b.sqlScale, false},
		{"netdelay", "end to end through network delay", b.netDelay, true},
		{"river", "postgres path next to River", b.river, true},
		{"projections", "two search projections against one", b.twoProjections, true},
		{"soak", "soak", b.soak, true},
	}
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.cfg.Log, "bench: "+format+"\n", args...)
}

func (b *bench) setup(ctx context.Context) error {
	s, err := harness.Open(ctx, harness.SessionConfig{AdminURL: b.cfg.AdminURL, ElasticURL: b.cfg.ElasticURL,
		Name: "bench", Bin: b.cfg.Bin, PoolSize: int32(2*b.cfg.Concurrency + 6 + b.cfg.Soak.Writers), Log: b.say})
	if err != nil {
		return err
	}
	b.s, b.pool, b.index = s, s.DB.Pool, s.Index
	b.rep.Versions, b.rep.Database, b.rep.Index = s.Versions, s.DB.Name, s.Index
	b.rep.Engine = Engine{Name: s.Engine.Name, Distribution: s.Engine.Distribution, Version: s.Engine.Version}
	s.OnClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		defer cancel()
		_ = harness.DeleteIndex(ctx, b.cfg.ElasticURL, b.index+"-raw", b.index+"-warmup")
	})
	s.OnClose(b.stopReplicas)
	return nil
}

func (b *bench) stopReplicas() {
	for _, r := range b.replicas {
		r.Stop(30 * time.Second)
	}
	b.replicas = nil
}

// startReplica runs `wlproj run` against the bench database and index.
func (b *bench) startReplica(ctx context.Context, name string, extra ...string) (*harness.Replica, error) {
	r, err := b.launch(name, extra...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	return r, r.WaitHealthy(wctx)
}

// launch starts `wlproj run` and returns at once.
func (b *bench) launch(name string, extra ...string) (*harness.Replica, error) {
	env := harness.ReplicaEnv(b.s.DB.URL, b.cfg.ElasticURL, b.index, slices.Concat([]string{
		fmt.Sprintf("OUTBOX_BULK_SIZE=%d", b.cfg.Batch), fmt.Sprintf("OUTBOX_CONCURRENCY=%d", b.cfg.Concurrency),
	}, extra, b.cfg.ReplicaSettings)...)
	var tee io.Writer
	if b.cfg.Verbose {
		tee = os.Stderr
	}
	r, err := harness.Start(b.s.Bin, name, env, tee)
	if err != nil {
		return nil, err
	}
	b.replicas = append(b.replicas, r)
	return r, nil
}

// startPair runs the deployment the README documents: two replicas,
// name-a and name-b, with the same settings, started at once as an
// operator's two units are. It returns the leader once the other is a
// ready standby, waiting for the lock in pg_stat_activity: every step that
// runs the leader under load runs its standby too, since how a standby
// waits is the database's business as much as the leader's work is.
func (b *bench) startPair(ctx context.Context, name string, extra ...string) (*harness.Replica, error) {
	var pair []*harness.Replica
	for _, n := range []string{name + "-a", name + "-b"} {
		r, err := b.launch(n, extra...)
		if err != nil {
			return nil, err
		}
		pair = append(pair, r)
	}
	wctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	for _, r := range pair {
		if err := r.WaitHealthy(wctx); err != nil {
			return nil, err
		}
	}
	l, err := waitLeader(ctx, pair...)
	if err != nil {
		return nil, err
	}
	return l, b.waitStandby(ctx, pair[1-slices.Index(pair, l)])
}

// standBy runs one replica as the standby of a leader the bench plays: it
// holds the lock of the index's leader name on a session of its own, as
// the in-process loop of steps 3 and 16 would if it ran the elector, and
// the replica waits for it as a standby of the pair does. The returned
// stop ends the replica before it releases the lock: given the lock, the
// replica would drain the outbox beside the loop.
func (b *bench) standBy(ctx context.Context, name string) (stop func(), err error) {
	conn, err := pgx.Connect(ctx, b.s.DB.URL)
	if err != nil {
		return nil, err
	}
	stop = func() {
		b.stopReplicas()
		_ = conn.Close(context.WithoutCancel(ctx))
	}
	if _, err := conn.Exec(ctx, outbox.LockSQL, b.index); err != nil {
		stop()
		return nil, fmt.Errorf("take the leader lock: %w", err)
	}
	r, err := b.startReplica(ctx, name)
	if err == nil {
		err = b.waitStandby(ctx, r)
	}
	if err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// waitLeader waits until exactly one live replica of rs says leader.
func waitLeader(ctx context.Context, rs ...*harness.Replica) (*harness.Replica, error) {
	l, _, err := harness.WaitLeader(ctx, stepTimeout, 0, rs...)
	return l, err
}

// waitStandby waits until r is a ready standby.
func (b *bench) waitStandby(ctx context.Context, r *harness.Replica) error {
	return harness.WaitStandby(ctx, stepTimeout, b.pool, r, leader.LockSessionName(r.Name))
}

// quiesce waits until the engine and Postgres are idle (below a quarter
// of a core over a second), so that a step does not pay for the merges or
// the autovacuum of the one before; at most a minute. Smoke mode does not
// wait: its figures are not judged, and on a machine shared with other work
// the engine may never go idle.
func (b *bench) quiesce(ctx context.Context) error {
	if b.cfg.Smoke {
		return nil
	}
	start := time.Now()
	for time.Since(start) < time.Minute {
		before := sampleCPU(nil)
		if err := harness.Sleep(ctx, time.Second); err != nil {
			return err
		}
		busy := sampleCPU(nil).since(before)
		if busy["engine"]+busy["postgres"] < 0.25 {
			break
		}
	}
	b.rep.QuiesceSeconds += harness.Elapsed(start)
	return nil
}

// reset empties every table of the schema but goose's between steps: the
// outbox, the leader, the audit, and whatever a later migration adds beside
// them (a ledger left full would make the next step's events no-ops). The
// queue's origin stays: migration 00018 wrote it once, no queued row is
// visible in it, and a leader reads no queued row without it; so does the
// record of the cluster it belongs to (00023), without which no replica
// leads; so does the
// ledger's rotation, whose one row names the partition entries go to. The outbox
// is locked first: a reader of it and the positions (the health sampler's
// backlog, through outbox_queue_backlog) locks it first too, and a
// TRUNCATE that held the positions while waiting for it deadlocked with
// one.
func (b *bench) reset(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `
		DO $$ BEGIN
		  EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I', tablename), ', '
		                                            ORDER BY tablename <> 'outbox_events', tablename) || ' RESTART IDENTITY'
		             FROM pg_tables WHERE schemaname = current_schema()
		              AND tablename NOT IN ('goose_db_version', 'outbox_queue_origin', 'outbox_queue_home', 'outbox_ledger_rotation', 'outbox_events_rotation'));
		END $$`)
	return err
}

// vacuum is what autovacuum would have done by the time a real backlog is
// drained: fresh statistics and a visibility map.
func (b *bench) vacuum(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE outbox_events`)
	return err
}

// waitDrained waits until no row is pending or processing, queued ones
// included, and returns when the last event was acked (lastAck: queued rows
// have no processed_at) and the count of failed rows.
func (b *bench) waitDrained(ctx context.Context, timeout time.Duration) (last time.Time, failed int, err error) {
	if err := harness.WaitDrained(ctx, timeout, b.pool); err != nil {
		return last, 0, err
	}
	if last, err = b.lastAck(ctx); err != nil {
		return last, 0, err
	}
	err = b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status = 'failed'`).Scan(&failed)
	return last, failed, err
}

// drained waits for the outbox to drain the n events produced, and fails
// if any of them failed, with their reasons.
func (b *bench) drained(ctx context.Context, n int) error {
	_, failed, err := b.waitDrained(ctx, b.drainTimeout(n))
	if err != nil || failed == 0 {
		return err
	}
	var reasons string
	_ = b.pool.QueryRow(ctx, `SELECT string_agg(DISTINCT error_reason || ': ' || left(last_error, 200), '; ')
		FROM outbox_events WHERE status = 'failed'`).Scan(&reasons)
	return fmt.Errorf("%d events failed: %s", failed, reasons)
}

func (b *bench) createIndex(ctx context.Context, name string) error {
	return harness.CreateIndex(ctx, b.cfg.ElasticURL, name)
}

func (b *bench) deleteIndex(ctx context.Context, name string) error {
	return harness.DeleteIndex(ctx, b.cfg.ElasticURL, name)
}

// 10. The rebuild's bulk load next to raw _bulk, under live events.
func (b *bench) rebuild(ctx context.Context) error {
	res, err := b.rebuildStep(ctx)
	if res != nil && res.RowsPerSec > 0 {
		b.rep.Rebuild = res
	}
	if err != nil {
		return err
	}
	return b.reset(ctx)
}

// 11. The console's failed page on a large failed set; the rows go after.
func (b *bench) console(ctx context.Context) error {
	rep, err := benchConsole(ctx, b.pool, ConsoleBenchConfig{Rows: b.cfg.ConsoleRows, Samples: b.cfg.ConsoleSamples})
	if err != nil {
		return err
	}
	b.rep.Console = rep
	first := rep.Pages["first_screen"]
	b.say("console: %d failed rows, first screen p95 %.1f ms, worst filter p95 %.1f ms", rep.FailedRows, first.P95Ms, worstFilter(rep))
	return b.reset(ctx)
}

// drainTimeout is generous: a machine slower than 200 events/s is broken,
// not slow.
func (b *bench) drainTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*5*time.Millisecond
}
