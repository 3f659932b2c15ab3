package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// RiverConfig is the River step's part of Config.
type RiverConfig struct {
	// Jobs is the backlog each run drains, River's and the daemon's alike.
	Jobs int
	// Workers is MaxWorkers of River's default queue.
	Workers int
	// Rounds is how many River and daemon runs, in turn, every other round
	// reversed.
	Rounds            int
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
}

// The defaults are River's best on the machine: 500 workers, a 1 ms
// fetch cooldown; the poll interval is River's own bench's.
func defaultRiverConfig() RiverConfig {
	return RiverConfig{Jobs: 200_000, Workers: 500, Rounds: 3, FetchCooldown: time.Millisecond, FetchPollInterval: 20 * time.Millisecond}
}

func (c RiverConfig) smoke() RiverConfig {
	c.Jobs, c.Rounds = 3000, 1
	return c
}

func (c *RiverConfig) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Jobs, "river-jobs", c.Jobs, "no-op jobs River drains, and events the daemon's Postgres path drains, in each run of the River step")
	fs.IntVar(&c.Workers, "river-workers", c.Workers, "MaxWorkers of River's default queue in the River step")
	fs.IntVar(&c.Rounds, "river-rounds", c.Rounds, "River / daemon pairs of the River step, every other one reversed")
	fs.DurationVar(&c.FetchCooldown, "river-fetch-cooldown", c.FetchCooldown, "River's FetchCooldown in the River step (River's minimum is 1ms)")
	fs.DurationVar(&c.FetchPollInterval, "river-fetch-poll-interval", c.FetchPollInterval, "River's FetchPollInterval in the River step")
}

func (c RiverConfig) validate() error {
	switch {
	case c.Jobs < 1 || c.Jobs > 100_000_000:
		return fmt.Errorf("-river-jobs=%d is out of range [1, 100000000]", c.Jobs)
	case c.Workers < 1 || c.Workers > 10_000:
		return fmt.Errorf("-river-workers=%d is out of range [1, 10000]", c.Workers)
	case c.Rounds < 1 || c.Rounds > 100:
		return fmt.Errorf("-river-rounds=%d is out of range [1, 100]", c.Rounds)
	case c.FetchCooldown < time.Millisecond:
		return fmt.Errorf("-river-fetch-cooldown=%s is below River's minimum of 1ms", c.FetchCooldown)
	case c.FetchPollInterval < c.FetchCooldown:
		return fmt.Errorf("-river-fetch-poll-interval=%s is shorter than -river-fetch-cooldown=%s, which River refuses", c.FetchPollInterval, c.FetchCooldown)
	}
	return nil
}

// RiverRun is one line of riverbench's output: one drain of River's.
type RiverRun struct {
	RiverVersion        string  `json:"river_version"`
	Jobs                int     `json:"jobs"`
	Workers             int     `json:"workers"`
	FetchCooldownMs     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMs float64 `json:"fetch_poll_interval_ms"`
	PoolMaxConns        int     `json:"pool_max_conns"`
	Seconds             float64 `json:"seconds"`
	JobsPerSec          float64 `json:"jobs_per_s"`
	// CPUSeconds is riverbench's, DatabaseCPUSeconds its database's
	// backends', during the drain.
	CPUSeconds         float64 `json:"cpu_seconds"`
	DatabaseCPUSeconds float64 `json:"database_cpu_seconds"`
}

// RiverRound is one River run and one daemon run next to it.
type RiverRound struct {
	RiverJobsPerSec    float64 `json:"river_jobs_per_sec"`
	DaemonEventsPerSec float64 `json:"daemon_events_per_sec"`
	// DaemonToRiver is daemon events/s over River jobs/s.
	DaemonToRiver float64 `json:"daemon_to_river"`
}

// River is step 16: the daemon's Postgres path (step 3's loop, with the
// ledger) and River draining no-op jobs from a database of its own on the
// same server, in turn.
type River struct {
	Version             string  `json:"river_version"`
	Jobs                int     `json:"jobs"`
	Workers             int     `json:"workers"`
	FetchCooldownMs     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMs float64 `json:"fetch_poll_interval_ms"`
	PoolMaxConns        int     `json:"river_pool_max_conns"`
	// Batch and Concurrency are the daemon's (-batch, -concurrency).
	Batch       int `json:"daemon_batch"`
	Concurrency int `json:"daemon_concurrency"`
	// Order is the runs in the order they ran.
	Order      []string      `json:"order"`
	RiverRuns  []RiverRun    `json:"river_runs"`
	DaemonRuns []*Throughput `json:"daemon_runs"`
	Rounds     []RiverRound  `json:"rounds"`

	RiverMedianJobsPerSec    float64 `json:"river_median_jobs_per_sec"`
	RiverMinJobsPerSec       float64 `json:"river_min_jobs_per_sec"`
	RiverMaxJobsPerSec       float64 `json:"river_max_jobs_per_sec"`
	DaemonMedianEventsPerSec float64 `json:"daemon_median_events_per_sec"`
	// The median of the rounds' daemon / River ratios, and their spread.
	MedianRatio float64 `json:"median_daemon_to_river"`
	MinRatio    float64 `json:"min_daemon_to_river"`
	MaxRatio    float64 `json:"max_daemon_to_river"`
}

// riverGoal is the issue's: the daemon's Postgres path at least twice
// River's rate on the same database.
const riverGoal = 2.0

// The runs of step 16, as Order names them.
const (
	riverRunRiver  = "river"
	riverRunDaemon = "daemon"
)

// 16. The daemon's Postgres path next to River, one sitting. Neither side
// runs a replica: River's client and the daemon's loop each drain in
// process, neither's election running, so a standby on the daemon's side
// alone would not compare like with like (step 3 measures the loop with
// one).
func (b *bench) river(ctx context.Context) error {
	cfg := b.cfg.River
	bin, err := buildRiverBench(ctx, b.s.Dir)
	if err != nil {
		return err
	}
	// River's tables in a database of their own, on the same server.
	name := b.s.DB.Name + "_river"
	dbURL, err := harness.CreateEmptyDatabase(ctx, b.cfg.AdminURL, name)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		defer cancel()
		if err := harness.DropDatabase(dctx, b.cfg.AdminURL, name); err != nil {
			b.say("cleanup: drop database %s: %v", name, err)
		}
	}()
	rv := &River{Jobs: cfg.Jobs, Workers: cfg.Workers, FetchCooldownMs: ms(cfg.FetchCooldown),
		FetchPollIntervalMs: ms(cfg.FetchPollInterval), Batch: b.cfg.Batch, Concurrency: b.cfg.Concurrency}
	for round := range cfg.Rounds {
		order := []string{riverRunRiver, riverRunDaemon}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		var r RiverRound
		for _, run := range order {
			switch run {
			case riverRunRiver:
				res, err := b.riverRun(ctx, bin, dbURL)
				if err != nil {
					return fmt.Errorf("river, round %d: %w", round+1, err)
				}
				rv.RiverRuns = append(rv.RiverRuns, res)
				r.RiverJobsPerSec = res.JobsPerSec
			case riverRunDaemon:
				t, err := b.daemonRun(ctx, cfg.Jobs)
				if err != nil {
					return fmt.Errorf("daemon, round %d: %w", round+1, err)
				}
				rv.DaemonRuns = append(rv.DaemonRuns, t)
				r.DaemonEventsPerSec = t.EventsPerSec
			}
			rv.Order = append(rv.Order, run)
		}
		r.DaemonToRiver = harness.Round3(r.DaemonEventsPerSec / r.RiverJobsPerSec)
		rv.Rounds = append(rv.Rounds, r)
		b.say("river, round %d: River %.0f jobs/s, daemon %.0f events/s: daemon / River %.3f",
			round+1, r.RiverJobsPerSec, r.DaemonEventsPerSec, r.DaemonToRiver)
	}
	rv.finish()
	b.rep.River = rv
	return b.reset(ctx)
}

// daemonRun is one drain of n events by step 3's daemon loop with the
// ledger, at -batch: step 3's code, with its backlog set to n for the run.
func (b *bench) daemonRun(ctx context.Context, n int) (*Throughput, error) {
	docs := b.cfg.Docs
	b.cfg.Docs = n
	defer func() { b.cfg.Docs = docs }()
	return b.pgRun(ctx, pgLedger, b.cfg.Batch)
}

// riverRun runs riverbench once against dbURL and reads its line.
func (b *bench) riverRun(ctx context.Context, bin, dbURL string) (RiverRun, error) {
	cfg := b.cfg.River
	cmd := exec.CommandContext(ctx, bin, "-jobs", strconv.Itoa(cfg.Jobs), "-workers", strconv.Itoa(cfg.Workers),
		"-fetch-cooldown", cfg.FetchCooldown.String(), "-fetch-poll-interval", cfg.FetchPollInterval.String(),
		"-timeout", b.drainTimeout(cfg.Jobs).String(), "-rounds", "1")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if b.cfg.Verbose {
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	}
	if err := cmd.Run(); err != nil {
		return RiverRun{}, fmt.Errorf("riverbench: %w\n%s", err, tail(stderr.String(), 4000))
	}
	runs, err := parseRiverRuns(stdout.Bytes())
	if err != nil {
		return RiverRun{}, err
	}
	if len(runs) != 1 {
		return RiverRun{}, fmt.Errorf("riverbench printed %d results, want 1", len(runs))
	}
	res := runs[0]
	if res.Jobs != cfg.Jobs {
		return RiverRun{}, fmt.Errorf("riverbench drained %d jobs, want %d", res.Jobs, cfg.Jobs)
	}
	b.say("river %s: %d jobs, %d workers, fetch cooldown %g ms: %.0f jobs/s", res.RiverVersion, res.Jobs, res.Workers,
		res.FetchCooldownMs, res.JobsPerSec)
	return res, nil
}

// buildRiverBench builds tools/bench/river, a module of its own, into dir.
func buildRiverBench(ctx context.Context, dir string) (string, error) {
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "riverbench")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "tools", "bench", "river")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tools/bench/river: %w\n%s", err, out)
	}
	return bin, nil
}

// parseRiverRuns reads riverbench's JSON lines; any other line is an error.
func parseRiverRuns(out []byte) ([]RiverRun, error) {
	var runs []RiverRun
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r RiverRun
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("riverbench printed %q: %w", tail(line, 200), err)
		}
		if r.Jobs <= 0 || r.Seconds <= 0 || r.JobsPerSec <= 0 {
			return nil, fmt.Errorf("riverbench printed %q: no jobs, time or rate", tail(line, 200))
		}
		runs = append(runs, r)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		return nil, errors.New("riverbench printed no result")
	}
	return runs, nil
}

// finish computes the medians and the spread over the rounds.
func (rv *River) finish() {
	if len(rv.RiverRuns) > 0 {
		first := rv.RiverRuns[0]
		rv.Version, rv.PoolMaxConns = first.RiverVersion, first.PoolMaxConns
	}
	var river, daemon, ratios []float64
	for _, r := range rv.Rounds {
		river, daemon, ratios = append(river, r.RiverJobsPerSec), append(daemon, r.DaemonEventsPerSec), append(ratios, r.DaemonToRiver)
	}
	if len(ratios) == 0 {
		return
	}
	rv.RiverMedianJobsPerSec, rv.RiverMinJobsPerSec, rv.RiverMaxJobsPerSec = round1(median(river)), slices.Min(river), slices.Max(river)
	rv.DaemonMedianEventsPerSec = round1(median(daemon))
	rv.MedianRatio, rv.MinRatio, rv.MaxRatio = harness.Round3(median(ratios)), slices.Min(ratios), slices.Max(ratios)
}

func riverTargets(r *Report, add addTarget) {
	rv := r.River
	if rv == nil || len(rv.Rounds) == 0 {
		return
	}
	add(fmt.Sprintf("daemon Postgres path ÷ River %s no-op jobs, same Postgres server, %d workers, %g ms fetch cooldown, median of %d rounds",
		rv.Version, rv.Workers, rv.FetchCooldownMs, len(rv.Rounds)), fmt.Sprintf(">= %.1f", riverGoal), rv.MedianRatio, "ratio", rv.MedianRatio >= riverGoal)
}

func riverRows(r *Report, tw io.Writer) {
	rv := r.River
	if rv == nil || len(rv.Rounds) == 0 {
		return
	}
	river := make([]string, len(rv.RiverRuns))
	for i, run := range rv.RiverRuns {
		river[i] = fmt.Sprintf("%.0f", run.JobsPerSec)
	}
	daemon := make([]string, len(rv.DaemonRuns))
	for i, t := range rv.DaemonRuns {
		daemon[i] = fmt.Sprintf("%.0f", t.EventsPerSec)
	}
	fmt.Fprintf(tw, "16 River %s, %d workers, cooldown %g ms, poll %g ms, pool %d\tmedian %.0f jobs/s of %d (runs %s; min %.0f, max %.0f)\t\n",
		rv.Version, rv.Workers, rv.FetchCooldownMs, rv.FetchPollIntervalMs, rv.PoolMaxConns, rv.RiverMedianJobsPerSec, rv.Jobs,
		strings.Join(river, ", "), rv.RiverMinJobsPerSec, rv.RiverMaxJobsPerSec)
	fmt.Fprintf(tw, "16 daemon PG path beside it, batch %d\tmedian %.0f events/s of %d (runs %s)\t\n",
		rv.Batch, rv.DaemonMedianEventsPerSec, rv.Jobs, strings.Join(daemon, ", "))
	fmt.Fprintf(tw, "  daemon / River, %d rounds\tmedian %.3f (min %.3f, max %.3f)\t\n", len(rv.Rounds), rv.MedianRatio, rv.MinRatio, rv.MaxRatio)
}
