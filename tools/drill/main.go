// Command drill is wlproj's unattended failover drill: two real replicas
// drain an outbox fed at a steady rate while the drill kills, cuts and
// restarts what they depend on, then checks that nothing was lost.
//
// Usage:
//
//	make drill                                   # the defaults, at most 5 minutes
//	make drill DRILL_FLAGS='-kills 2 -outage 20s' # smaller
//	make drill DRILL_FLAGS='-scenarios soak'      # one scenario (or several, comma-separated)
//	go run ./drill -h                            # every flag
//
// The drill runs against the local stack (`make drill` sources .stack/env):
// DATABASE_URL must name a superuser; ELASTIC_URL the engine; STACK_PG_DATA,
// STACK_PG_BINDIR, STACK_RUN_USER and STACK_RUN_DIR say how to restart
// Postgres (pg_ctl restart -m fast, as the stack's user). With
// -pg-restart=false those four are not needed and Postgres is left alone.
// STACK_PG_STANDBY_DATA names the standby postgres-failover promotes (the
// stack's PG_STANDBY=1, which `make drill` sets); without one the drill
// refuses to start unless -pg-failover=false.
//
// Setup: a database of its own, migrated by the admin; deploy/sql/roles.sql
// applied with role names of its own; an index from testdata/mapping.json;
// replicas a and b logged in as the runtime role, each through TCP proxies
// of its own to Postgres (one per host of DATABASE_URL, in its order) and its own hold proxy (internal/testkit/holdproxy) to one HTTP
// fault proxy in front of the engine. A
// producer inserts -rate events per second as the admin: upserts (and a few
// deletes) of -entities books, each with increasing versions, of which 5%
// are written late, after the next version of their book; and a few books
// are written without a version, the outbox id ordering them.
//
// Before the scenarios, the replay scenario's books are seeded: -replays
// books per story get an upsert the strict mapping refuses (it has an
// isbn), which fails; then each book is deleted (versioned or not),
// upserted at a newer version, or left alone. The failed rows wait through
// the other scenarios.
//
// Scenarios, in order (-scenarios runs some of them):
//
//  0. soak: the producer at -soak-rate (1,000) events/s for -soak (3
//     minutes) on the pair no fault has touched yet. Half way an
//     application table's 10,000 rows are deleted, and VACUUM must remove
//     every one within 10 s. It fails when the lag is not flat (the last
//     third's p99 above 1.2x the first third's and 250 ms more), when a
//     wlproj session held a snapshot over 5 s, or when VACUUM could not
//     remove the rows; then the outbox drains and every event and
//     document is checked against the model (harness.Verify) before the
//     producer goes back to -rate.
//
//  1. kill-9: -kills times, kill -9 the leader, restart it as a standby.
//
//  2. engine-down: the fault proxy refuses connections for -outage.
//
//  3. postgres-restart: pg_ctl restart -m fast; the replicas reconnect alone.
//
//  4. network-cut: the leader's proxy blackholes (no FIN, no RST); after the
//     keepalive window it resets the server side, as Postgres' keepalive
//     would; then the path is restored.
//
//  5. rolling-sigterm: SIGTERM the standby then the leader, each restarted
//     and back as standby before the next; each must exit 0.
//
//  6. replay-after-delete: the producer pauses, the outbox drains, and the
//     engine forgets its deletes' versions (index.gc_deletes at 0 for a
//     refresh and a flush, proven on a canary document); the producer
//     resumes, the mapping gets the isbn, `wlproj replay --ids` returns the
//     seeded failures to pending as the runtime role, and the leader is
//     killed at once. Every replayed row must end done; the ledger must
//     have dropped all but the left-alone books' unsent.
//
//  7. deposed-leader-late-write: the producer pauses and the outbox drains;
//     the leader's hold proxy holds what it sends to the engine; upsert v5
//     of a fresh book is written and, once the held bytes hold its bulk,
//     the leader is killed -9. The new leader applies v5, then delete v6;
//     the engine forgets the delete (as past index.gc_deletes) and the held
//     bytes are released: the book must stay absent. The hold proxy
//     delivers them only if the dead leader's connection ended without an
//     RST (SO_LINGER 0 sends one); the report says which it was.
//
//  8. engine-node-loss (on a stack of several engine nodes, ENGINE_NODES=3
//     in `make drill`): a fault proxy stands in front of each node, the
//     replicas roll onto the proxies' node list, and the index gets a
//     replica. Under load, for -node-outage each: the first node's proxy
//     stops answering (a lost host), then the second's answers 503 (a node
//     cut off from its master); each node may get at most 2 bulks while
//     faulted and must get bulks again within 35 s once its proxy forwards,
//     and no event may wait over 10 s, fail, or have an error in its
//     history since the fault began. Then the node holding the primary is
//     killed -9 for -node-outage and started again with its data; reads
//     through the other nodes must keep answering and no event may use an
//     attempt. Last, every event and document is checked against the
//     model (harness.Verify).
//
//  9. postgres-failover: kill -9 of the primary's postmaster, pg_ctl promote
//     of the synchronous standby; the replicas, whose DATABASE_URL names
//     both (through a proxy each) with target_session_attrs=read-write,
//     reconnect to it and elect a leader. Last, as it leaves the first host
//     down.
//
// The replicas run with OUTBOX_RETENTION=-retention (30 s), so the
// outbox's partitions and the ledger's rotate about every 20 s all through
// the scenarios. Every partition a rotation empties is copied first into
// the run's rotation archive (harness.InstallRotationArchive: a BEFORE
// TRUNCATE trigger, the admin's, in the drill's database only), and every
// check of events reads the outbox and the archive together.
//
// Then the producer stops, the outbox drains, and harness.VerifyRotated
// checks that every event, in the outbox or archived, is done with its
// document at the newest version, or failed with a reason, and the ledger
// at the newest version and op of every document (or, where the rotation
// dropped the entry legitimately, the entry it dropped). Each table must
// have rotated at least -min-rotations (2) times by the replicas' counters
// (outbox_events_rotations_total, outbox_ledger_rotations_total). The drill
// writes -report (JSON) and prints a summary.
//
// During every scenario the database is sampled every half second
// (harness.WatchHealth): the oldest snapshot (any holder's, by time and
// age(xid), and wlproj's), the outbox's and the ledger's dead rows and
// autovacuums, lock waits, the backlog; the report has it per scenario.
//
// Measures:
//   - takeover: from the fault to the first event the new leader applied
//     (harness.WaitFirstAck, Postgres' clock, as is the fault's time): the
//     replicas run a search projection, so for a queued row the ledger's
//     applied_at of the new leader's first ack, which it writes once the
//     engine has answered the bulk (a few ms after the index write), or the
//     processed_at of a claimed row it acked; not the first checkpoint,
//     saved up to a second later. After a Postgres restart, any event
//     applied after the new postmaster started counts; after a network
//     cut, any leader's.
//   - duplicate sends: claimed rows whose error_history holds a
//     stuck_reclaimed entry, i.e. claimed by a leader that never recorded
//     the outcome (it was killed, cut off or restarted mid-batch) and then
//     sent again. An upper bound for those: the first leader may have died
//     before sending. Queued rows a new leader sends again from the last
//     saved position (about a second's worth) leave no trace in the
//     outbox and are not counted.
//   - lag (engine-node-loss, soak): insert to ack as each replica measured
//     it (outbox_event_latency_seconds, scraped from every live process at
//     a phase's start and end): a queued row that succeeds has no
//     processed_at.
//   - acks refused by fencing: outbox_fenced_acks_total scraped from each
//     replica process every 250 ms while it lives and just before it is
//     stopped or killed, its highest value summed over the processes.
//   - events the ledger dropped unsent: outbox_superseded_total
//     {cause="ledger"}, scraped the same way; replayed rows: replay_count > 0.
//   - rotations: outbox_events_rotations_total and
//     outbox_ledger_rotations_total, scraped the same way and summed; and
//     the partitions the archive saw emptied, the rows it kept, and the
//     longest its copy held a rotation's TRUNCATE.
//   - postgres-failover: kill → standby promoted, and kill → the first event
//     applied on the promoted standby (any after it accepted writes).
//   - network-cut's stop-writing time: from the cut until the cut leader's
//     /healthz says standby, which the elector says only once its services
//     have stopped.
//
// Exit status: 0 when every scenario passed and nothing was lost, regressed,
// missing or resurrected, the ledger agreed and both tables rotated; 1 otherwise; 2 when the drill could not start.
// Ctrl-C stops the drill and cleans up: replicas, proxies, database, roles,
// index, and Postgres is started again if the drill had restarted it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg := Config{Out: os.Stdout}
	fs := flag.NewFlagSet("drill", flag.ExitOnError)
	fs.IntVar(&cfg.Rate, "rate", rateDefault, "events per second written by the producer")
	fs.IntVar(&cfg.Entities, "entities", entitiesDefault, "books the producer writes versions of")
	fs.IntVar(&cfg.Kills, "kills", killsDefault, "kill -9 rounds")
	fs.DurationVar(&cfg.Soak, "soak", soakDefault, "how long the soak scenario runs (0 skips it)")
	fs.IntVar(&cfg.SoakRate, "soak-rate", soakRateDefault, "events per second of the producer during the soak")
	fs.Func("scenarios", "comma-separated scenarios to run (default all): "+strings.Join(scenarioNames(), ","), func(v string) error {
		cfg.Scenarios = strings.Split(v, ",")
		return nil
	})
	fs.IntVar(&cfg.Replays, "replays", replaysDefault, "books per story of the replay scenario (0 skips it)")
	fs.DurationVar(&cfg.Outage, "outage", outageDefault, "how long the engine is down")
	fs.BoolVar(&cfg.PGRestart, "pg-restart", true, "run the Postgres restart scenario (restarts the stack's Postgres)")
	fs.BoolVar(&cfg.PGFailover, "pg-failover", true, "run the Postgres failover scenario (kills the stack's primary, promotes its standby; needs PG_STANDBY=1)")
	fs.BoolVar(&cfg.NodeLoss, "node-loss", true, "run engine-node-loss (needs a stack of several engine nodes)")
	fs.DurationVar(&cfg.NodeOutage, "node-outage", nodeOutageDefault, "how long engine-node-loss keeps each node silent, answering 503, or killed")
	fs.DurationVar(&cfg.Settle, "settle", settleDefault, "pause before each fault, so the leader is mid-stream")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", drainTimeoutDefault, "how long the final drain may take")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", maxAttemptsDefault, "OUTBOX_MAX_ATTEMPTS of the replicas; must outlast the outage")
	fs.DurationVar(&cfg.Retention, "retention", retentionDefault, "OUTBOX_RETENTION of the replicas: short, so both rotations run during the drill")
	fs.IntVar(&cfg.MinRotations, "min-rotations", minRotationsDefault, "the fewest rotations of each table (the outbox's, the ledger's) the drill must see (0: no check)")
	fs.StringVar(&cfg.ReportPath, "report", reportDefault, "where the JSON report goes")
	fs.StringVar(&cfg.Bin, "bin", "", "a built wlproj binary (default: go build the checkout)")
	fs.BoolVar(&cfg.Verbose, "v", false, "copy the replicas' logs to stderr")
	_ = fs.Parse(os.Args[1:])

	cfg.AdminURL = os.Getenv("DATABASE_URL")
	cfg.ElasticURL = os.Getenv("ELASTIC_URL")
	cfg.Nodes = nodeControlFromEnv()
	cfg.PG = PGControl{
		Data: os.Getenv("STACK_PG_DATA"), BinDir: os.Getenv("STACK_PG_BINDIR"),
		RunUser: os.Getenv("STACK_RUN_USER"), RunDir: os.Getenv("STACK_RUN_DIR"),
		StandbyData: os.Getenv("STACK_PG_STANDBY_DATA"),
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := Run(ctx, cfg)
	if err != nil && rep == nil {
		fmt.Fprintln(os.Stderr, "drill:", err)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "drill:", err)
	}
	if !rep.OK {
		fmt.Fprintf(os.Stderr, "drill: FAILED after %s\n", time.Since(start).Round(time.Second))
		os.Exit(1)
	}
}
