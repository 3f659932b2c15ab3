package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/replica"
	"github.com/wlproj/wlproj/internal/rig"
)

// Config is what one bench run measures and how.
type Config struct {
	AdminURL, ElasticURL string

	Docs, DocBytes     int
	Batch, Concurrency int
	BareBatch          int
	Rate               int
	Duration           time.Duration
	Failovers          int
	FailoverRate       int
	DoneRows           int
	FailedRows         int
	ClaimSamples       int

	// Steps names the steps to run; empty runs all of them.
	Steps      []string
	Out        string
	CPUProfile string
	Bin        string
	Smoke      bool
	Verbose    bool
	Log        io.Writer
}

func defaultConfig() Config {
	return Config{
		Docs: 200_000, DocBytes: 1024, Batch: 500, Concurrency: 2, BareBatch: 1000,
		Rate: 1000, Duration: 30 * time.Second, Failovers: 20, FailoverRate: 500,
		DoneRows: 1_000_000, FailedRows: 10_000, ClaimSamples: 100,
		Out: "bench/results.json", CPUProfile: "bench/leader-cpu.pprof",
	}
}

// smoke shrinks every step so the whole run takes well under a minute.
func (c Config) smoke() Config {
	c.Smoke = true
	c.Docs, c.Rate, c.Duration = 3000, 200, 3*time.Second
	c.Failovers, c.FailoverRate = 2, 200
	c.DoneRows, c.FailedRows, c.ClaimSamples = 20_000, 200, 20
	c.CPUProfile = ""
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
		{"-claim-samples", c.ClaimSamples, 1, 100_000},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("%s=%d is out of range [%d, %d]", f.name, f.v, f.lo, f.hi)
		}
	}
	switch {
	case c.Duration < 100*time.Millisecond:
		return fmt.Errorf("-duration=%s is below 100ms", c.Duration)
	case c.AdminURL == "":
		return errors.New("DATABASE_URL is not set: run `make bench` (it starts the local stack) or source .stack/env")
	case c.ElasticURL == "":
		return errors.New("ELASTIC_URL is not set: run `make bench` (it starts the local stack) or source .stack/env")
	case c.Out == "":
		return errors.New("-out is empty")
	}
	known := []string{}
	for _, s := range (&bench{}).steps() {
		known = append(known, s.flag)
	}
	for _, s := range c.Steps {
		if !slices.Contains(known, s) {
			return fmt.Errorf("-steps: unknown step %q (known: %s)", s, strings.Join(known, ","))
		}
	}
	return nil
}

// bench holds what the steps share: one database and the wlproj binary.
type bench struct {
	cfg   Config
	rep   *Report
	root  string
	tmp   string
	bin   string
	admin *pgx.Conn

	dbName, dbURL string
	pool          *pgxpool.Pool
	index         string // written by the daemon; the raw baseline has its own
	mapping       []byte
	leaderName    string

	replicas []*replica.Replica
}

// Run sets up, runs the seven steps and writes the report. The database, the
// indices and every process it started are gone when it returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, rep: newReport(cfg), leaderName: "bench"}
	defer b.cleanup()
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	for _, s := range b.steps() {
		if len(cfg.Steps) > 0 && !slices.Contains(cfg.Steps, s.flag) {
			continue
		}
		if err := b.quiesce(ctx); err != nil {
			return b.rep, err
		}
		start := time.Now()
		b.say("step: %s", s.name)
		if err := s.run(ctx); err != nil {
			return b.rep, fmt.Errorf("%s: %w", s.name, err)
		}
		b.say("step: %s took %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	b.rep.finish()
	if err := b.rep.write(cfg.Out); err != nil {
		return b.rep, err
	}
	return b.rep, nil
}

type step struct {
	flag, name string
	run        func(context.Context) error
}

func (b *bench) steps() []step {
	return []step{
		{"raw", "raw bulk", b.rawBulk},
		{"e2e", "end to end", b.endToEnd},
		{"pg", "postgres path", b.postgresPath},
		{"latency", "latency", b.latency},
		{"failover", "failover", b.failover},
		{"claim", "claim cost", b.claimCost},
	}
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.cfg.Log, "bench: "+format+"\n", args...)
}

func (b *bench) setup(ctx context.Context) error {
	var err error
	if b.root, err = rig.RepoRoot(); err != nil {
		return err
	}
	if b.mapping, err = os.ReadFile(filepath.Join(b.root, "testdata", "mapping.json")); err != nil {
		return err
	}
	if b.tmp, err = os.MkdirTemp("", "wlproj-bench-"); err != nil {
		return err
	}
	b.bin = b.cfg.Bin
	if b.bin == "" {
		b.say("building wlproj")
		if b.bin, err = rig.Build(ctx, b.root, b.tmp); err != nil {
			return err
		}
	}
	if err := b.versions(ctx); err != nil {
		return err
	}

	id := rig.RandomHex(4)
	b.dbName, b.index = "wlproj_bench_"+id, "wlproj-bench-"+id
	b.rep.Database, b.rep.Index = b.dbName, b.index
	if b.admin, err = pgx.Connect(ctx, b.cfg.AdminURL); err != nil {
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	if b.dbURL, err = rig.CreateDatabase(ctx, b.admin, b.cfg.AdminURL, b.dbName); err != nil {
		return err
	}
	poolCfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		return err
	}
	poolCfg.MaxConns = int32(b.cfg.Concurrency + 6)
	if b.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return err
	}
	return b.createIndex(ctx, b.index)
}

func (b *bench) versions(ctx context.Context) error {
	var root struct {
		Version struct {
			Number       string `json:"number"`
			Distribution string `json:"distribution"`
		} `json:"version"`
	}
	if err := b.es(ctx, http.MethodGet, "/", nil, &root); err != nil {
		return fmt.Errorf("engine at ELASTIC_URL: %w", err)
	}
	b.rep.Versions.Engine = "elasticsearch " + root.Version.Number
	if root.Version.Distribution != "" {
		b.rep.Versions.Engine = root.Version.Distribution + " " + root.Version.Number
	}
	conn, err := pgx.Connect(ctx, b.cfg.AdminURL)
	if err != nil {
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&b.rep.Versions.Postgres); err != nil {
		return err
	}
	b.rep.Versions.Go = runtime.Version()
	return nil
}

func (b *bench) cleanup() {
	b.stopReplicas()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.pool != nil {
		b.pool.Close()
	}
	if b.admin != nil {
		if b.dbName != "" {
			if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+b.dbName+" WITH (FORCE)"); err != nil {
				b.say("drop database %s: %v", b.dbName, err)
			}
		}
		b.admin.Close(ctx)
	}
	if b.index != "" {
		_ = b.es(ctx, http.MethodDelete, "/"+b.index+","+b.index+"-raw,"+b.index+"-warmup?ignore_unavailable=true", nil, nil)
	}
	if b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
}

func (b *bench) stopReplicas() {
	for _, r := range b.replicas {
		r.Stop(30 * time.Second)
	}
	b.replicas = nil
}

// startReplica runs `wlproj run` against the bench database and index.
func (b *bench) startReplica(ctx context.Context, name string, extra ...string) (*replica.Replica, error) {
	env := append([]string{
		"DATABASE_URL=" + b.dbURL, "ELASTIC_URL=" + b.cfg.ElasticURL, "ELASTIC_INDEX=" + b.index,
		"OUTBOX_LEADER_NAME=" + b.leaderName,
		fmt.Sprintf("OUTBOX_BULK_SIZE=%d", b.cfg.Batch), fmt.Sprintf("OUTBOX_CONCURRENCY=%d", b.cfg.Concurrency),
		"LOG_LEVEL=info",
	}, extra...)
	var tee io.Writer
	if b.cfg.Verbose {
		tee = os.Stderr
	}
	r, err := replica.Start(b.bin, name, env, tee)
	if err != nil {
		return nil, err
	}
	b.replicas = append(b.replicas, r)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return r, r.WaitHealthy(wctx)
}

// waitLeader waits until one of rs says leader on /healthz.
func waitLeader(ctx context.Context, rs ...*replica.Replica) (*replica.Replica, error) {
	var found *replica.Replica
	err := poll(ctx, 30*time.Second, "a leader", func() (bool, error) {
		for _, r := range rs {
			if r.IsLeader() {
				found = r
				return true, nil
			}
		}
		return false, nil
	})
	return found, err
}

// quiesce waits until the engine and Postgres are idle (below a quarter
// of a core over a second), so that a step does not pay for the merges or
// the autovacuum of the one before; at most a minute.
func (b *bench) quiesce(ctx context.Context) error {
	start := time.Now()
	for time.Since(start) < time.Minute {
		before := sampleCPU()
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
		busy := sampleCPU().since(before)
		if busy["engine"]+busy["postgres"] < 0.25 {
			break
		}
	}
	b.rep.QuiesceSeconds += rig.Round3(time.Since(start).Seconds())
	return nil
}

// reset empties the outbox between steps.
func (b *bench) reset(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `TRUNCATE outbox_events, outbox_leader, outbox_replay_audit RESTART IDENTITY`)
	return err
}

// vacuum is what autovacuum would have done by the time a real backlog is
// drained: fresh statistics and a visibility map.
func (b *bench) vacuum(ctx context.Context) error {
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE outbox_events`)
	return err
}

// dbNow is Postgres' clock, the one created_at and processed_at are on.
func (b *bench) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}

// waitDrained waits until no row is pending or processing and returns the
// newest processed_at and the count of failed rows.
func (b *bench) waitDrained(ctx context.Context, timeout time.Duration) (last time.Time, failed int, err error) {
	err = poll(ctx, timeout, "the outbox to drain", func() (bool, error) {
		var busy bool
		err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_events WHERE status = 'pending')
		                               OR EXISTS (SELECT 1 FROM outbox_events WHERE status = 'processing')`).Scan(&busy)
		return err == nil && !busy, err
	})
	if err != nil {
		return last, 0, err
	}
	var at *time.Time
	err = b.pool.QueryRow(ctx, `SELECT max(processed_at), count(*) FILTER (WHERE status = 'failed') FROM outbox_events`).Scan(&at, &failed)
	if at != nil {
		last = *at
	}
	return last, failed, err
}

func poll(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("timed out after %s waiting for %s: %w", timeout, what, last)
			}
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *bench) createIndex(ctx context.Context, name string) error {
	return b.es(ctx, http.MethodPut, "/"+name, b.mapping, nil)
}

// docCount refreshes the index and counts its documents.
func (b *bench) docCount(ctx context.Context, index string) (int, error) {
	if err := b.es(ctx, http.MethodPost, "/"+index+"/_refresh", nil, nil); err != nil {
		return 0, err
	}
	var c struct {
		Count int `json:"count"`
	}
	err := b.es(ctx, http.MethodGet, "/"+index+"/_count", nil, &c)
	return c.Count, err
}

func (b *bench) es(ctx context.Context, method, path string, body []byte, out any) error {
	return rig.ES(ctx, b.cfg.ElasticURL, method, path, body, out)
}
