// Command riverbench drains a backlog of no-op River jobs and prints how
// fast, for step 16 of tools/bench (the daemon's Postgres path next to
// River on the same database). It lives in a module of its own so that
// wlproj's go.mod never depends on River.
//
// Usage:
//
//	DATABASE_URL=postgres://... riverbench -jobs 200000 -workers 500 -fetch-cooldown 1ms
//
// DATABASE_URL names a database of the bench's own: River's migrations go
// into it, and river_job is emptied before each round. Each round inserts
// -jobs no-op jobs (InsertManyFast, COPY), vacuums and analyzes river_job as
// autovacuum would have by then, starts a client with -workers workers on the
// default queue, and times from Start until the last job's completion event
// (EventKindJobCompleted). It prints one JSON line per round on stdout; logs
// go to stderr.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Result is one round, as the bench reads it.
type Result struct {
	RiverVersion        string  `json:"river_version"`
	Jobs                int     `json:"jobs"`
	Workers             int     `json:"workers"`
	FetchCooldownMs     float64 `json:"fetch_cooldown_ms"`
	FetchPollIntervalMs float64 `json:"fetch_poll_interval_ms"`
	PoolMaxConns        int32   `json:"pool_max_conns"`
	Seconds             float64 `json:"seconds"`
	JobsPerSec          float64 `json:"jobs_per_s"`
	// CPUSeconds is this process's (River's client) during the drain;
	// DatabaseCPUSeconds, its database's backends' (read from /proc, 0 when
	// Postgres runs elsewhere).
	CPUSeconds         float64 `json:"cpu_seconds"`
	DatabaseCPUSeconds float64 `json:"database_cpu_seconds"`
}

type config struct {
	jobs, workers, rounds int
	cooldown, poll        time.Duration
	timeout               time.Duration
}

func main() {
	var c config
	fs := flag.NewFlagSet("riverbench", flag.ExitOnError)
	fs.IntVar(&c.jobs, "jobs", 200_000, "no-op jobs each round drains")
	fs.IntVar(&c.workers, "workers", 500, "MaxWorkers of the default queue")
	fs.IntVar(&c.rounds, "rounds", 1, "rounds, each on a fresh backlog")
	fs.DurationVar(&c.cooldown, "fetch-cooldown", time.Millisecond, "the client's FetchCooldown")
	fs.DurationVar(&c.poll, "fetch-poll-interval", 20*time.Millisecond, "the client's FetchPollInterval (River's own bench uses 20ms)")
	fs.DurationVar(&c.timeout, "timeout", 0, "give up on a round after this long (default: a minute plus 5 ms a job)")
	_ = fs.Parse(os.Args[1:])
	if c.timeout == 0 {
		c.timeout = time.Minute + time.Duration(c.jobs)*5*time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "riverbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	switch {
	case c.jobs < 1:
		return fmt.Errorf("-jobs=%d: at least one", c.jobs)
	case c.workers < 1 || c.workers > 10_000:
		return fmt.Errorf("-workers=%d is outside River's 1..10000", c.workers)
	case c.rounds < 1:
		return fmt.Errorf("-rounds=%d: at least one", c.rounds)
	}
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is not set")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: logger})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	enc := json.NewEncoder(os.Stdout)
	for round := range c.rounds {
		res, err := drain(ctx, c, pool, driver, logger)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	return nil
}

type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (*noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// drain loads a fresh backlog and times one client draining it.
func drain(ctx context.Context, c config, pool *pgxpool.Pool, driver *riverpgxv5.Driver, logger *slog.Logger) (*Result, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     c.cooldown,
		FetchPollInterval: c.poll,
		Logger:            logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: c.workers}},
		Workers:           workers,
	})
	if err != nil {
		return nil, err
	}
	if err := loadBacklog(ctx, c, pool, client); err != nil {
		return nil, err
	}
	// A channel that holds every event: a full one drops events, and the
	// count would never reach the backlog.
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: c.jobs,
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled}})
	defer cancel()

	db0, err := databaseCPU(ctx, pool)
	if err != nil {
		return nil, err
	}
	cpu0 := processCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	last, err := awaitCompleted(ctx, c, events)
	cpu := processCPU() - cpu0
	db1, dbErr := databaseCPU(ctx, pool)
	stopClient(client, logger)
	if err = errors.Join(err, dbErr); err != nil {
		return nil, err
	}
	return result(ctx, c, pool, last.Sub(start).Seconds(), cpu, db1.since(db0))
}

// loadBacklog empties river_job and inserts the backlog of c.jobs jobs.
func loadBacklog(ctx context.Context, c config, pool *pgxpool.Pool, client *river.Client[pgx.Tx]) error {
	if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return err
	}
	const chunk = 10_000
	params := make([]river.InsertManyParams, 0, chunk)
	for start := 0; start < c.jobs; start += chunk {
		params = params[:0]
		for i := start; i < min(start+chunk, c.jobs); i++ {
			params = append(params, river.InsertManyParams{Args: noopArgs{N: i}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE river_job`)
	return err
}

// awaitCompleted counts completions until the whole backlog is done and
// returns when the last one came.
func awaitCompleted(ctx context.Context, c config, events <-chan *river.Event) (time.Time, error) {
	completed, timeout := 0, time.After(c.timeout)
	var last time.Time
	for completed < c.jobs {
		select {
		case e := <-events:
			if e == nil {
				return last, fmt.Errorf("the subscription closed after %d of %d jobs", completed, c.jobs)
			}
			if e.Kind != river.EventKindJobCompleted {
				return last, fmt.Errorf("job %d: %s", e.Job.ID, e.Kind)
			}
			completed++
			last = time.Now()
		case <-timeout:
			return last, fmt.Errorf("%d of %d jobs completed after %s", completed, c.jobs, c.timeout)
		case <-ctx.Done():
			return last, ctx.Err()
		}
	}
	return last, nil
}

// stopClient stops the client, waiting for its jobs at most 30 s.
func stopClient(client *river.Client[pgx.Tx], logger *slog.Logger) {
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if err := client.Stop(sctx); err != nil {
		logger.Error("stop", "err", err)
	}
}

// result checks that river_job agrees with the count and makes the row.
func result(ctx context.Context, c config, pool *pgxpool.Pool, secs, cpu, dbCPU float64) (*Result, error) {
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&done); err != nil {
		return nil, err
	}
	if done != c.jobs {
		return nil, fmt.Errorf("%d jobs completed in river_job, want %d", done, c.jobs)
	}
	return &Result{
		RiverVersion: riverVersion(), Jobs: c.jobs, Workers: c.workers,
		FetchCooldownMs: ms(c.cooldown), FetchPollIntervalMs: ms(c.poll), PoolMaxConns: pool.Config().MaxConns,
		Seconds: round3(secs), JobsPerSec: round1(float64(c.jobs) / secs),
		CPUSeconds: round3(cpu), DatabaseCPUSeconds: round3(dbCPU),
	}, nil
}

// riverVersion is River's module version, from the build info.
func riverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// processCPU is this process's user and system CPU seconds so far.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// dbCPU is the CPU seconds of each backend of the database, by pid, as
// the bench's own sampleDBCPU reads them.
type dbCPU map[int]float64

func databaseCPU(ctx context.Context, pool *pgxpool.Pool) (dbCPU, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := dbCPU{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue // a server on another machine, or gone
		}
		if end := bytes.LastIndexByte(stat, ')'); end > 0 {
			// After the command: state ppid pgrp session tty tpgid flags
			// minflt cminflt majflt cmajflt utime stime, in USER_HZ (100).
			if f := strings.Fields(string(stat[end+1:])); len(f) >= 13 {
				utime, _ := strconv.ParseFloat(f[11], 64)
				stime, _ := strconv.ParseFloat(f[12], 64)
				s[pid] = (utime + stime) / 100
			}
		}
	}
	return s, rows.Err()
}

// since is the CPU seconds the backends used between before and s.
func (s dbCPU) since(before dbCPU) float64 {
	var total float64
	for pid, v := range s {
		total += max(0, v-before[pid])
	}
	return total
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }
