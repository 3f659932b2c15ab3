// Command bench measures wlproj side by side with what it is built on, in
// one run on one machine, and writes the figures as JSON with their ratios.
//
// Usage:
//
//	make bench                       # the defaults below, a few minutes
//	make bench BENCH_SMOKE=1         # every step on tiny sizes, under a minute
//	make bench BENCH_FLAGS='-done-rows 10000000'
//	go run ./tools/bench -h          # every flag
//	go run ./tools/bench -compare -compare-out tools/bench/results/engines.json tools/bench/results/results-*.json   # one table, one row per engine
//
// It runs on the local stack (`make bench` sources .stack/env): DATABASE_URL
// names a superuser, ELASTIC_URL the engine. It creates a database and
// indices of its own and drops them at the end.
//
// Every step that runs wlproj under load runs the deployment the README
// documents: two replicas, one leading and one standing by, waiting for
// the lock (bench.startPair; step 3 plays the leader in process beside a
// real standby). Their CPU is wlproj's, the standby's included. During
// each such step the database is sampled every second (health.go): the
// oldest snapshot in it, by time and by age(xid), and who held it; the
// oldest of wlproj's; dead rows and autovacuum runs of the outbox and the
// ledger; samples in which a wlproj session waited for a lock (a standby's
// wait for the leader's lock counted apart). The report has a table of
// them and a target per step: no wlproj snapshot older than 5 s.
//
// Steps:
//
//  1. raw bulk: -n documents of about -doc-bytes go straight to the engine
//     with _bulk, -batch per request, -concurrency requests in flight,
//     external_gte versions: the daemon's request shape without the daemon.
//
//  2. end to end: the same documents as outbox rows, drained by the pair
//     of real `wlproj run` with the same batch and concurrency; from the
//     moment the leader took the lock to the last ack (both on Postgres'
//     clock; the last ack is the ledger's newest applied_at, written by
//     the ack of a queued row).
//
//  3. Postgres path alone: the daemon's consume loop, in process, with a
//     projection that acknowledges without sending, with the
//     applied-version ledger (a projection that keeps one version per
//     document, projection.LatestOnly, as the index does) and without it
//     (one that keeps every event, as the chronicle does); next
//     to a bare SQL loop (claim -bare-batch rows FOR UPDATE SKIP LOCKED,
//     mark them done, one transaction each). The daemon drains the
//     backlog as queued rows, the bare loop as pending ones; each is timed
//     in process, to its last ack. The three drain the same
//     backlog in turn, -pg-rounds times, the order reversed every other
//     round, so a drift of the shared machine weighs on each alike; the
//     ratios are the medians of each round's. A real replica stands by
//     all along, waiting for the lock the bench holds for the loop.
//
//  4. latency: a producer inserts -rate events/s for -duration while the
//     pair runs; percentiles from insert to ack, from the pair's histogram
//     outbox_event_latency_seconds (queued rows get no processed_at;
//     estimated within its buckets), and the claim statement's and the
//     batch's percentiles.
//
//  5. failover: -failovers times, kill -9 the leader of two replicas under
//     -failover-rate events/s; from the kill to the first event the other
//     applied (harness.WaitFirstAck: the ledger's applied_at of its first ack).
//
//  6. claim cost: median time of one claim with only pending rows in the
//     table, then with -done-rows done and -failed-rows failed rows too
//     (and a ledger entry for each done document, as a real outbox has),
//     then beside -parked-rows pending rows of a paused projection, then
//     beside as many rows waiting out a backoff.
//
//  7. memory: peak RSS (VmHWM) of the leader of step 2.
//
//  8. retention: the pair with OUTBOX_RETENTION=-retention drains a
//     producer of -retention-rate events/s (updates of -retention-docs
//     books) for -retention-duration; every -retention-sample the rows and
//     bytes of the outbox and the ledger, and, from the pair's histograms
//     since the sample before, the p99 of the claim statement and of insert
//     to ack (queued rows keep no claim time). Verdict: the rows and
//     the bytes of the last third stay within 1.1x of the middle third's
//     (a plateau), the claim p99 of the last third within 1.5x of the
//     first third's.
//
//  9. pairs: raw bulk and end to end in turn (ABAB), -pairs times after
//     one warm-up, each into a fresh index with the same settings; the
//     median end-to-end / raw ratio with its min and max, and the CPU
//     microseconds per event of the leader and of Postgres. With -pin (the
//     default outside the smoke run) the engine runs on cpu 0 and Postgres,
//     the daemon and the bench on cpu 1 (taskset), recorded in the report.
//
//  10. rebuild: -rebuild-rows rows of a source table bulk-loaded by the
//     rebuild into a new index while the pair drains live events; its
//     load rate over raw _bulk's (goal 0.8), and a reader of the alias.
//
//  11. console: the failed page over -console-rows failed rows, timed in
//     process (first screen under 300 ms, filters under 500 ms).
//
//  12. sustained: for each of -sustained-rate (2000 and 500), a producer alone at that rate for a tenth of
//     -sustained-duration (the application's own database cost), then the
//     pair draining it for -sustained-duration, autovacuum as shipped and
//     no manual vacuum, twice: on an outbox holding -sustained-history done
//     rows and their ledger, and on one emptied and analyzed just before.
//     Lag p99 overall and by third (the pair's outbox_event_latency_seconds,
//     scraped at each third's end: by ack), claim p99 (the leader's
//     outbox_claim_duration_seconds), lease expiries, and the database's
//     and wlproj's CPU per event, the producer's own cost subtracted.
//
//  13. verify: -verify-docs documents in the index, a source table and the
//     ledger; wlproj verify --from-table timed as a process next to a bare
//     scroll of the index alone and a bare key-ordered read of the table
//     alone, -verify-rounds times, every other round reversed (goal: at
//     most 1.25x their sum, peak RSS at most 100 MB); then the pair's live
//     drain's p99 at -verify-live-rate without a scheduled verify for
//     -verify-window, and during one (goal: at most 2x).
//
//  14. sqlscale: every statement the leader runs per batch or on a schedule,
//     and the metrics poller's, EXPLAIN ANALYZEd next to -scale-rows done
//     rows (outbox's TestStatementsAtScaleReadNoTableWhole, run with go
//     test): no sequential scan of the outbox or the ledger, each <= 50 ms.
//
//  15. netdelay: -netdelay-docs events drained end to end by the pair
//     through the
//     fault proxy at each of -netdelay-ms one-way delays (10% jitter), with
//     the default settings and with the runbook's for that delay,
//     -netdelay-rounds times, every other round reversed; medians (goal:
//     at 20 ms, with the runbook's settings, at least 0.8x the 0 ms rate).
//
//  16. river: River v0.51.1 (tools/bench/river, a Go module of its own, so
//     wlproj's go.mod never depends on River; built with go build) drains
//     -river-jobs no-op jobs from a database of its own on the same server
//     (-river-workers workers, -river-fetch-cooldown, bulk-inserted, timed
//     from the client's Start to the last job's completion event), in turn
//     with step 3's daemon loop (with the ledger, at -batch) draining as
//     many events, -river-rounds times, every other round reversed. River's
//     jobs/s (median, min, max), the daemon's events/s, and the daemon /
//     River ratio of each round with its median (goal: at least 2.0). Not
//     in make test's smoke run.
//
//  17. soak: the pair with its defaults under -soak-rate (2,000) events/s
//     for -soak-duration (30 minutes), autovacuum as shipped, shaped like
//     issue 30's pgbench run: one event per transaction from
//     -soak-writers connections, ~1 KB payloads, -soak-books (100,000)
//     books updated at random. Per -soak-window (5 minutes): lag p99, the
//     backlog's max, dead rows of the outbox and the ledger (max, last,
//     lowest), the oldest snapshot (any holder's and wlproj's), lock
//     waits, and CPU µs per event of the database (the producer's inserts
//     included) and of wlproj. Goals: lag p99 <= 250 ms in every window,
//     last / first window <= 1.2, the last window's lowest dead-row count
//     at most half the highest before it (autovacuum reclaims), no wlproj
//     snapshot older than 5 s. Shorter: -soak-duration 5m -soak-window 1m.
//     Per window too: the outbox's and the ledger's updates + deletes per
//     acked event (HOT updates apart, pg_stat_user_tables) and dead rows at
//     its end. Lag is from the pair's histogram outbox_event_latency_seconds
//     (queued rows get no processed_at). Issue 33's measurement, an outside
//     transaction (REPEATABLE READ, one read of the outbox, a connection of
//     its own) holding the vacuum horizon from minute 5 to 25, then the
//     seconds until wlproj caught up with what was committed before it
//     ended:
//
//     make bench BENCH_FLAGS='-steps soak -soak-hold-from 5m -soak-hold-to 25m'
//
// CPU seconds used by the engine, Postgres, the daemon and the bench itself
// are recorded for steps 1 to 3 (from /proc), so the report can say who the
// machine's cores were busy with.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	cfg.flags(fs)
	cfg.Verify.flags(fs)
	cfg.NetDelay.flags(fs)
	cfg.River.flags(fs)
	cfg.Soak.flags(fs)
	compare := fs.Bool("compare", false, "print one table of the results JSON files given as arguments (one per engine), write it as JSON to -compare-out if given, and exit")
	replicaSettings := fs.String("replica-env", "", "comma-separated KEY=VALUE settings for every replica the bench starts, e.g. OUTBOX_CLAIM_COOLDOWN_SECONDS=0.05")
	headlineREADME := fs.String("headline", "", "write the headline table of the results JSON files given as arguments between this README's bench:headline lines, and the soak picture to -headline-picture, and exit")
	headlinePicture := fs.String("headline-picture", "tools/bench/results/soak-lag.svg", "with -headline: where the soak's lag picture goes")
	compareOut := fs.String("compare-out", "", "with -compare: where the per-engine table goes as JSON")
	steps := fs.String("steps", "", "comma-separated steps to run (raw,e2e,pg,latency,failover,claim,retention,pairs,rebuild,console,sustained,verify,sqlscale,netdelay,river,projections,soak; default all)")
	fs.StringVar(&cfg.Out, "out", envOr("BENCH_OUT", cfg.Out), "where the JSON goes (BENCH_OUT)")
	fs.StringVar(&cfg.CPUProfile, "cpuprofile", cfg.CPUProfile, "write a CPU profile of the leader during step 2 here")
	fs.StringVar(&cfg.LoopCPUProfile, "loop-cpuprofile", "", "write CPU profiles of the in-process loop of steps 3 and 16 here, one per drain (PATH.1, PATH.2, ...)")
	fs.StringVar(&cfg.Bin, "bin", "", "a built wlproj binary (default: go build the checkout)")
	fs.BoolVar(&cfg.Smoke, "smoke", os.Getenv("BENCH_SMOKE") == "1", "tiny sizes, under a minute (BENCH_SMOKE=1)")
	fs.BoolVar(&cfg.Verbose, "v", false, "copy the replicas' logs to stderr")
	_ = fs.Parse(os.Args[1:])
	if *compare {
		if err := compareResults(os.Stdout, *compareOut, fs.Args()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *headlineREADME != "" {
		if err := writeHeadline(*headlineREADME, *headlinePicture, fs.Args()); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	cfg.Command = benchCommand(os.Args[1:])
	if cfg.Smoke {
		cfg = cfg.smoke()
	}
	if *steps != "" {
		cfg.Steps = strings.Split(*steps, ",")
	}
	if *replicaSettings != "" {
		cfg.ReplicaSettings = strings.Split(*replicaSettings, ",")
	}
	cfg.AdminURL = os.Getenv("DATABASE_URL")
	cfg.ElasticURL = os.Getenv("ELASTIC_URL")
	cfg.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	rep.Table(os.Stdout)
	fmt.Printf("\nwritten to %s\n", cfg.Out)
}

// flags declares the sizes and rates of the steps, one flag per line.
func (c *Config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Docs, "n", c.Docs, "documents in steps 1 to 3")
	fs.IntVar(&c.DocBytes, "doc-bytes", c.DocBytes, "approximate size of one document")
	fs.IntVar(&c.Batch, "batch", c.Batch, "events per claim and per bulk request (OUTBOX_BULK_SIZE)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "bulk requests in flight (OUTBOX_CONCURRENCY)")
	fs.IntVar(&c.BareBatch, "bare-batch", c.BareBatch, "rows per transaction of the bare SQL loop")
	fs.IntVar(&c.Rate, "rate", c.Rate, "events per second of the latency producer")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long the latency producer runs")
	fs.IntVar(&c.Failovers, "failovers", c.Failovers, "kill -9 rounds")
	fs.IntVar(&c.FailoverRate, "failover-rate", c.FailoverRate, "events per second during the failovers")
	fs.IntVar(&c.DoneRows, "done-rows", c.DoneRows, "done rows in the claim-cost table")
	fs.IntVar(&c.FailedRows, "failed-rows", c.FailedRows, "failed rows in the claim-cost table")
	fs.IntVar(&c.ParkedRows, "parked-rows", c.ParkedRows, "paused projection's rows, then rows in backoff, the claim-cost step claims beside")
	fs.IntVar(&c.ScaleRows, "scale-rows", c.ScaleRows, "done rows the sql-at-scale step runs each statement next to")
	fs.IntVar(&c.ClaimSamples, "claim-samples", c.ClaimSamples, "claims timed per table state")
	fs.IntVar(&c.PGRounds, "pg-rounds", c.PGRounds, "rounds of bare loop, daemon loop with and without the ledger in step 3")
	fs.IntVar(&c.RetentionRate, "retention-rate", c.RetentionRate, "events per second of the retention producer")
	fs.DurationVar(&c.RetentionDuration, "retention-duration", c.RetentionDuration, "how long the retention producer runs")
	fs.DurationVar(&c.Retention, "retention", c.Retention, "the leader's OUTBOX_RETENTION in the retention step")
	fs.DurationVar(&c.RetentionSample, "retention-sample", c.RetentionSample, "time between two samples of the retention step")
	fs.Func("sustained-rate", fmt.Sprintf("events per second of the sustained step's producer, comma-separated for several (default %s)", joinInts(c.SustainedRates)), func(v string) error {
		rates, err := parseInts(v)
		if err != nil {
			return fmt.Errorf("-sustained-rate: %w", err)
		}
		c.SustainedRates = rates
		return nil
	})
	fs.DurationVar(&c.SustainedDuration, "sustained-duration", c.SustainedDuration, "how long the sustained step produces, in each table state")
	fs.IntVar(&c.SustainedHistory, "sustained-history", c.SustainedHistory, "done rows (with their ledger) the sustained step's history state starts with")
	fs.IntVar(&c.RetentionDocs, "retention-docs", c.RetentionDocs, "books the retention producer updates in turn")
	fs.IntVar(&c.RetentionSeed, "retention-seed", c.RetentionSeed, "done rows older than the retention written before the retention leader starts")
	fs.BoolVar(&c.Pin, "pin", c.Pin, "pairs step: engine on cpu 0, Postgres, the daemon and the bench on cpu 1 (taskset)")
	fs.IntVar(&c.Pairs, "pairs", c.Pairs, "raw bulk / end-to-end pairs, run in turn, of the pairs step")
	fs.IntVar(&c.RebuildRows, "rebuild-rows", c.RebuildRows, "rows of the source table the rebuild step loads")
	fs.IntVar(&c.ConsoleRows, "console-rows", c.ConsoleRows, "failed rows the console step's pages show")
	fs.IntVar(&c.ConsoleSamples, "console-samples", c.ConsoleSamples, "times each console page is timed")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func parseInts(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// benchCommand is the make bench line that gives these flags.
func benchCommand(args []string) string {
	if len(args) == 0 {
		return "make bench"
	}
	return "make bench BENCH_FLAGS='" + strings.Join(args, " ") + "'"
}
