package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/internal/testkit/holdproxy"
	"github.com/wlproj/wlproj/internal/testkit/tcpproxy"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/projection"
)

const (
	rateDefault     = 200
	entitiesDefault = 500
	killsDefault    = 20
	replaysDefault  = 5
	outageDefault   = 60 * time.Second
	// soakDefault and soakRateDefault are the soak's length and rate: a
	// few minutes at a rate the drill's stack (three engine nodes, a
	// synchronous Postgres standby, the fault and hold proxies) sustains
	// on a shared two-core machine. At the bench soak's 2,000/s it did
	// not there (load average 10 to 18: lag p99 2.5 s from the first
	// minute, 7.5 s in the last), with the database healthy all along; at
	// 1,000/s the lag stayed flat (p99 0.8, 0.2, 0.2 s by third).
	soakDefault         = 3 * time.Minute
	soakRateDefault     = 1000
	settleDefault       = 2 * time.Second
	drainTimeoutDefault = 2 * time.Minute
	// maxAttemptsDefault outlasts a 60 s outage: with a 2 s backoff cap and
	// equal jitter an event retries at most every second.
	maxAttemptsDefault = 100
	reportDefault      = "tools/drill/report.json"
	// retentionDefault is the replicas' OUTBOX_RETENTION: short, so both
	// rotations run many times in a drill. Each table's partition is due
	// every half of it, and the leader's pruner looks every 10 s and at the
	// start of each term, so a 30 s retention rotates each table about
	// every 20 s, the outbox less often while a backlog holds it (an
	// outage): 11 outbox and 17 ledger rotations in a 6-minute drill, rows
	// done 30 s before emptied while the faults go on.
	retentionDefault = 30 * time.Second
	// minRotationsDefault is the fewest rotations of each table a drill
	// must see: fewer and the run proved nothing about them.
	minRotationsDefault = 2

	// Keepalives of the replicas' lock connections. The network cut waits
	// their window before resetting the server side, as Postgres would.
	keepalivesIdle     = 2
	keepalivesInterval = 1
	keepalivesCount    = 2
	keepaliveWindow    = time.Duration(keepalivesIdle+keepalivesInterval*keepalivesCount) * time.Second
	// shutdownGrace is the replicas' drain grace on SIGTERM.
	shutdownGrace = 5 * time.Second

	// stepTimeout bounds every wait for one thing to happen (a leader, an
	// ack, a standby); a drill step that takes longer has failed.
	stepTimeout = 30 * time.Second
	// scrapeEvery is how often each replica's counters are read: a killed
	// process loses what it counted since.
	scrapeEvery = 250 * time.Millisecond
	// healthEvery is how often the database's health is sampled: a
	// standby's wait slice is a second, so an older snapshot shows twice.
	healthEvery = 500 * time.Millisecond
	// ledgerMetric counts the events the ledger dropped unsent.
	ledgerMetric = `outbox_superseded_total{projection="search",cause="ledger"}`
	// eventsRotationsMetric and ledgerRotationsMetric count each table's
	// partitions emptied by its rotation.
	eventsRotationsMetric = `outbox_events_rotations_total`
	ledgerRotationsMetric = `outbox_ledger_rotations_total`
	// processedMetric counts every ack of a search event, a second ack of
	// the same event included.
	processedMetric = `outbox_processed_total{projection="search"}`
)

// Config is what one drill run needs.
type Config struct {
	// Rate is the events per second the producer writes.
	Rate int
	// Entities is the number of books the producer writes versions of.
	Entities int
	// Kills is the number of kill -9 rounds.
	Kills int
	// Soak is how long the soak scenario runs the pair at SoakRate; zero
	// skips it.
	Soak     time.Duration
	SoakRate int
	// Scenarios names the scenarios to run; empty runs every one.
	Scenarios []string
	// Replays is the number of books of each story of the replay scenario;
	// zero skips it.
	Replays int
	// Outage is how long the engine is down.
	Outage time.Duration
	// PGRestart runs the Postgres restart scenario; it restarts the whole
	// cluster, so tests sharing it leave it off.
	PGRestart bool
	// PGFailover runs the Postgres failover scenario: it kills the primary
	// and promotes the standby (PG.StandbyData), so it runs last.
	PGFailover bool
	// Settle is the pause before each fault.
	Settle time.Duration
	// DrainTimeout bounds the final drain.
	DrainTimeout time.Duration
	// MaxAttempts is the replicas' OUTBOX_MAX_ATTEMPTS.
	MaxAttempts int
	// Retention is the replicas' OUTBOX_RETENTION; their tombstone
	// retention is the default. Defaults to 30s.
	Retention time.Duration
	// MinRotations is the fewest rotations of each table (the outbox's
	// partitions, the ledger's) the run must count; 0 checks none.
	MinRotations int
	// ReportPath is where the JSON report is written.
	ReportPath string
	// Bin is a built wlproj; empty builds the checkout.
	Bin string
	// Verbose copies the replicas' logs to stderr.
	Verbose bool

	// AdminURL is a superuser's URL (DATABASE_URL).
	AdminURL string
	// ElasticURL is the engine (ELASTIC_URL).
	ElasticURL string
	// PG restarts Postgres.
	PG PGControl
	// NodeLoss runs engine-node-loss, which needs a stack of several engine
	// nodes, Nodes, and keeps each faulted node silent, answering 503, or
	// killed for NodeOutage.
	NodeLoss   bool
	Nodes      NodeControl
	NodeOutage time.Duration
	// Out receives the progress lines and the summary.
	Out io.Writer
}

func (c Config) validate() error {
	switch {
	case c.AdminURL == "":
		return errors.New("DATABASE_URL is not set: run `make drill`, or source .stack/env")
	case c.ElasticURL == "":
		return errors.New("ELASTIC_URL is not set: run `make drill`, or source .stack/env")
	case c.Rate < 1:
		return fmt.Errorf("-rate %d: must be at least 1", c.Rate)
	case c.Entities < 1:
		return fmt.Errorf("-entities %d: must be at least 1", c.Entities)
	case c.Kills < 0:
		return fmt.Errorf("-kills %d: must not be negative", c.Kills)
	case c.Soak < 0 || c.Soak > time.Hour:
		return fmt.Errorf("-soak %s: out of range [0, 1h]", c.Soak)
	case c.Soak > 0 && (c.SoakRate < 1 || c.SoakRate > 100_000):
		return fmt.Errorf("-soak-rate %d: out of range [1, 100000]", c.SoakRate)
	case c.Replays < 0 || c.Replays > 1000:
		return fmt.Errorf("-replays %d: out of range [0, 1000]", c.Replays)
	case c.Outage < time.Second:
		return fmt.Errorf("-outage %s: must be at least 1s", c.Outage)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("-max-attempts %d: out of range [1, 1000]", c.MaxAttempts)
	case c.Retention != 0 && !consume.RetentionRange.Contains(c.Retention):
		return fmt.Errorf("-retention %s: out of range [%s, %s]", c.Retention, consume.RetentionRange.Min, consume.RetentionRange.Max)
	case c.MinRotations < 0:
		return fmt.Errorf("-min-rotations %d: must not be negative", c.MinRotations)
	case c.NodeLoss && c.NodeOutage < time.Second:
		return fmt.Errorf("-node-outage %s: must be at least 1s", c.NodeOutage)
	case c.PGRestart && c.wants("postgres-restart") && (c.PG.Data == "" || c.PG.BinDir == ""):
		return errors.New("the Postgres restart needs STACK_PG_DATA and STACK_PG_BINDIR (from .stack/env); or pass -pg-restart=false")
	case c.PGFailover && c.wants("postgres-failover") && (c.PG.Data == "" || c.PG.BinDir == "" || c.PG.StandbyData == ""):
		return errors.New("postgres-failover needs a Postgres standby (STACK_PG_STANDBY_DATA, STACK_PG_DATA, STACK_PG_BINDIR): start the stack with PG_STANDBY=1, as `make drill` does; or pass -pg-failover=false")
	}
	var known []string
	for _, sc := range (&drill{cfg: c}).scenarios() {
		known = append(known, sc.name)
	}
	for _, name := range c.Scenarios {
		if !slices.Contains(known, name) {
			return fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", name, strings.Join(known, ","))
		}
	}
	return nil
}

// wants says whether the scenario name is to run, as far as -scenarios
// says: every one when it names none.
func (c Config) wants(name string) bool {
	return len(c.Scenarios) == 0 || slices.Contains(c.Scenarios, name)
}

// PGControl restarts the stack's Postgres as its unprivileged user, and
// kills it and promotes its standby (StandbyData) for the failover.
type PGControl struct {
	Data, BinDir, RunUser, RunDir string
	StandbyData                   string
}

// ctl runs pg_ctl as the cluster's user. It ignores the drill's context: a
// pg_ctl killed half way could leave Postgres down.
func (pg PGControl) ctl(args ...string) ([]byte, error) {
	return pg.ctlData(pg.Data, args...)
}

// ctlData is ctl on the cluster in dataDir.
func (pg PGControl) ctlData(dataDir string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	argv := append([]string{filepath.Join(pg.BinDir, "pg_ctl"), "-D", dataDir}, args...)
	if os.Geteuid() == 0 && pg.RunUser != "" && pg.RunUser != "root" {
		argv = append([]string{"setpriv", "--reuid=" + pg.RunUser, "--regid=" + pg.RunUser, "--init-groups", "--", "env", "HOME=/tmp"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = os.TempDir() // the cluster's user may not be able to enter ours
	// Its own process group, so a Ctrl-C meant for the drill does not abort
	// a restart half way.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd.CombinedOutput()
}

// restart is pg_ctl restart -m fast: the options the cluster was started
// with come back from postmaster.opts. The server's output must go to a log
// file: otherwise it would hold pg_ctl's output pipe, and us, open.
func (pg PGControl) restart() error {
	logFile := filepath.Join(filepath.Dir(pg.Data), "postgres.log")
	if pg.RunDir != "" {
		logFile = filepath.Join(pg.RunDir, "postgres.log")
	}
	out, err := pg.ctl("restart", "-m", "fast", "-w", "-t", "60", "-l", logFile)
	if err != nil {
		return fmt.Errorf("pg_ctl restart: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// ensureRunning starts Postgres again if a restart left it down.
func (pg PGControl) ensureRunning() error {
	if _, err := pg.ctl("status"); err == nil {
		return nil
	}
	return pg.restart()
}

// drill is one run: what it created, and what it measured.
type drill struct {
	cfg     Config
	start   time.Time
	rep     *Report
	s       *harness.Session
	logsDir string

	runtimePassword string
	engine          *faultproxy.Proxy
	slots           []*slot
	prod            *producers
	seeded          []seedBook
	// written counts the rows the drill wrote itself (the replay seed).
	written     int64
	pgRestarted bool
	// failedOver: the primary was killed and the standby promoted; the old
	// primary must stay down (a second read-write host).
	failedOver bool
	// nodeList: the replicas talk to the engine's nodes over a node list
	// (engine-node-loss on): nodeProxies, one fault proxy in front of each
	// node of ELASTIC_URL, in its order; not through the slots' hold
	// proxies and the first node's fault proxy.
	nodeList    bool
	nodeProxies []*faultproxy.Proxy
	procsMu     sync.Mutex
	procs       []*proc
	// health samples the database during the scenario running.
	health *harness.HealthWatch
}

// slot is one replica name with its own paths to Postgres and to the
// engine (through the fault proxy); each restart of the replica is a new
// proc in the same slot.
type slot struct {
	name string
	// proxy is the path to the first host of DATABASE_URL, the primary;
	// proxies has one path per host (a standby's too).
	proxy   *tcpproxy.Proxy
	proxies []*tcpproxy.Proxy
	engine  *holdproxy.Proxy
	cur     *proc
	starts  int
}

// proc is one `wlproj run` process.
type proc struct {
	r               *harness.Replica
	fenced          *harness.Peak // outbox_fenced_acks_total
	ledger          *harness.Peak // ledgerMetric
	processed       *harness.Peak // processedMetric
	eventsRotations *harness.Peak // eventsRotationsMetric
	ledgerRotations *harness.Peak // ledgerRotationsMetric
	file            *os.File
}

// scrape reads the process's counters now: just before a kill, say.
func (p *proc) scrape() {
	p.fenced.Scrape()
	p.ledger.Scrape()
	p.processed.Scrape()
	p.eventsRotations.Scrape()
	p.ledgerRotations.Scrape()
}

// Run runs the drill and returns its report; a nil report means it could
// not start. Everything it created is gone when Run returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Out = cmp.Or[io.Writer](cfg.Out, io.Discard)
	cfg.Settle = cmp.Or(cfg.Settle, settleDefault)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, drainTimeoutDefault)
	cfg.Retention = cmp.Or(cfg.Retention, retentionDefault)
	d := &drill{cfg: cfg, start: time.Now(), rep: &Report{
		RunReport: harness.RunReport{StartedAt: time.Now().UTC()},
		Settings: Settings{Rate: cfg.Rate, Entities: cfg.Entities, Kills: cfg.Kills, Replays: cfg.Replays, OutageSeconds: cfg.Outage.Seconds(),
			SoakSeconds: cfg.Soak.Seconds(), SoakRate: cfg.SoakRate,
			PGRestart: cfg.PGRestart, PGFailover: cfg.PGFailover, MaxAttempts: cfg.MaxAttempts, KeepaliveWindow: keepaliveWindow.Seconds(),
			RetentionSeconds: cfg.Retention.Seconds(), TombstoneRetentionSeconds: consume.TombstoneRetentionDefault.Seconds(),
			MinRotations: cfg.MinRotations},
	}}
	defer d.close()
	if err := d.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	d.run(ctx)
	if ctx.Err() == nil {
		d.finish(ctx)
	} else {
		d.rep.Problem("interrupted")
	}
	d.rep.DurationSeconds = harness.Elapsed(d.start)
	d.rep.OK = len(d.rep.Problems) == 0
	if !d.rep.OK {
		d.rep.LogsDir = d.logsDir
		d.s.KeepDir()
	}
	if err := harness.WriteJSON(cfg.ReportPath, d.rep); err != nil {
		d.rep.Problem("write report: " + err.Error())
		d.rep.OK = false
	}
	d.rep.summary(cfg.Out, cfg.ReportPath)
	return d.rep, nil
}

func (d *drill) say(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *drill) close() {
	if d.s != nil {
		d.s.Close()
	}
}

func (d *drill) setup(ctx context.Context) error {
	s, err := harness.Open(ctx, harness.SessionConfig{AdminURL: d.cfg.AdminURL, ElasticURL: d.cfg.ElasticURL,
		Name: "drill", Bin: d.cfg.Bin, Roles: true, Log: d.say})
	if err != nil {
		return err
	}
	d.s = s
	// Registered first, so it runs last of ours: just before the session
	// drops the database, which needs Postgres up.
	s.OnClose(d.ensurePostgres)
	d.rep.Versions, d.rep.Database, d.rep.Index = s.Versions, s.DB.Name, s.Index
	d.rep.Roles = Roles{Owner: s.Owner, Runtime: s.Runtime}
	d.logsDir = filepath.Join(s.Dir, "logs")
	if err := os.MkdirAll(d.logsDir, 0o755); err != nil {
		return err
	}
	if err := d.applyRoles(ctx); err != nil {
		return err
	}
	// Before any replica: every partition the rotations empty is archived.
	if err := harness.InstallRotationArchive(ctx, s.DB.Pool); err != nil {
		return err
	}
	if err := d.setupProxies(); err != nil {
		return err
	}
	// Replicas stop before the proxies close, so they exit on their own terms.
	s.OnClose(d.stopReplicas)

	d.say("database %s, index %s, replicas as role %s; starting replicas a and b", s.DB.Name, s.Index, s.Runtime)
	if err := d.repair(ctx); err != nil {
		return err
	}
	d.prod = newProducers(context.WithoutCancel(ctx), s.DB.Pool, d.cfg.Rate, d.cfg.Entities)
	d.prod.resume()
	s.OnClose(d.prod.pause)
	d.say("producer: %d events/s over %d books, %.0f%% of the versions late; %d books without versions",
		d.cfg.Rate, d.cfg.Entities, lateShare*100, unversionedBooks)
	if _, err := harness.WaitFirstAck(ctx, stepTimeout, s.DB.Pool, time.Time{}, ""); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// applyRoles applies roles.sql, which hands the schema to the owner role
// and grants the runtime role what the daemon needs.
func (d *drill) applyRoles(ctx context.Context) error {
	psql := "psql"
	if d.cfg.PG.BinDir != "" {
		psql = filepath.Join(d.cfg.PG.BinDir, "psql")
	}
	d.runtimePassword = harness.UniqueName("")
	out, err := harness.RolesSQL{Psql: psql, Root: d.s.Root, AdminURL: d.s.DB.URL, DBName: d.s.DB.Name,
		Owner: d.s.Owner, Runtime: d.s.Runtime, OwnerPassword: harness.UniqueName(""),
		RuntimePassword: d.runtimePassword}.Apply(ctx)
	if err != nil {
		return fmt.Errorf("roles.sql: %w\n%s", err, out)
	}
	return nil
}

// setupProxies puts the engine behind a fault proxy and gives each slot a
// path to Postgres of its own, and one to the fault proxy that can hold
// what the slot's replica sends.
func (d *drill) setupProxies() error {
	var err error
	// The proxies front the first node of a node list.
	first, _, _ := strings.Cut(d.cfg.ElasticURL, ",")
	if d.engine, err = faultproxy.New(first); err != nil {
		return err
	}
	d.s.OnClose(func() { _ = d.engine.Close() })
	if err := d.setupNodeProxies(); err != nil {
		return err
	}
	pgCfg, err := pgx.ParseConfig(d.cfg.AdminURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pgAddrs := pgHosts(pgCfg)
	engine, err := url.Parse(d.engine.URL())
	if err != nil {
		return err
	}
	for _, name := range []string{"a", "b"} {
		s := &slot{name: name}
		for _, addr := range pgAddrs {
			p, err := tcpproxy.New(addr)
			if err != nil {
				return err
			}
			d.s.OnClose(func() { _ = p.Close() })
			s.proxies = append(s.proxies, p)
		}
		s.proxy = s.proxies[0]
		if s.engine, err = holdproxy.New(engine.Host); err != nil {
			return err
		}
		d.s.OnClose(func() { _ = s.engine.Close() })
		d.slots = append(d.slots, s)
	}
	return nil
}

// setupNodeProxies puts a fault proxy in front of each node of a stack of
// several engine nodes, for engine-node-loss. They are made here, with the
// others, so that they too close only once the replicas have stopped.
func (d *drill) setupNodeProxies() error {
	if len(d.cfg.Nodes.URLs) < 2 {
		return nil
	}
	for _, node := range d.cfg.Nodes.URLs {
		p, err := faultproxy.New(node)
		if err != nil {
			return err
		}
		d.s.OnClose(func() { _ = p.Close() })
		d.nodeProxies = append(d.nodeProxies, p)
	}
	return nil
}

// nodeListURL is the replicas' ELASTIC_URL on a node list: the nodes'
// fault proxies, comma-separated.
func (d *drill) nodeListURL() string {
	urls := make([]string, len(d.nodeProxies))
	for i, p := range d.nodeProxies {
		urls[i] = p.URL()
	}
	return strings.Join(urls, ",")
}

// pgHosts lists the host:port of each host DATABASE_URL names, in order
// (sslmode=prefer lists a host twice, with and without TLS).
func pgHosts(cfg *pgx.ConnConfig) []string {
	addrs := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, fb := range cfg.Fallbacks {
		if a := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))); !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

func (d *drill) ensurePostgres() {
	if !d.pgRestarted || d.failedOver {
		return
	}
	if err := d.cfg.PG.ensureRunning(); err != nil {
		d.say("cleanup: Postgres is not running and would not start: %v", err)
	}
}

// env is a replica's environment: the runtime role through the slot's own
// proxy, the engine through the slot's hold proxy and the fault proxy (or,
// on a node list, through the nodes' fault proxies), and fast failover
// settings.
func (d *drill) env(s *slot) []string {
	u, _ := url.Parse(d.s.DB.URL)
	u.User = url.UserPassword(d.s.Runtime, d.runtimePassword)
	// One proxy per host of DATABASE_URL, in its order, so the replicas
	// follow a failover as they would follow the hosts themselves.
	hosts := make([]string, len(s.proxies))
	for i, p := range s.proxies {
		hosts[i] = p.Addr()
	}
	u.Host = strings.Join(hosts, ",")
	engine, timeouts := "http://"+s.engine.Addr(), []string{"OUTBOX_LEASE_SECONDS=10"}
	if d.nodeList {
		// The engine timeout and the lease as shipped: a node that holds a
		// bulk then costs what it would in service (its whole deadline
		// before the node list), not harness.Quick's 5 s; and the lease
		// outlasts that deadline, as shipped.
		engine, timeouts = d.nodeListURL(), []string{
			"ELASTIC_TIMEOUT_SECONDS=" + strconv.Itoa(int(projection.TimeoutDefault.Seconds())),
			"OUTBOX_LEASE_SECONDS=" + strconv.Itoa(int(consume.LeaseDefault.Seconds())),
		}
	}
	return harness.ReplicaEnv(u.String(), engine, d.s.Index, slices.Concat(harness.Quick, timeouts, []string{
		"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS=0.25",
		"OUTBOX_TCP_KEEPALIVES_IDLE=" + strconv.Itoa(keepalivesIdle),
		"OUTBOX_TCP_KEEPALIVES_INTERVAL=" + strconv.Itoa(keepalivesInterval),
		"OUTBOX_TCP_KEEPALIVES_COUNT=" + strconv.Itoa(keepalivesCount),
		"OUTBOX_MAX_BACKOFF_SECONDS=2",
		"OUTBOX_MAX_ATTEMPTS=" + strconv.Itoa(d.cfg.MaxAttempts),
		"OUTBOX_SHUTDOWN_GRACE_SECONDS=" + strconv.Itoa(int(shutdownGrace.Seconds())),
		"OUTBOX_RETENTION=" + d.cfg.Retention.String(),
		"LOG_FORMAT=json",
	})...)
}

func (d *drill) startProc(ctx context.Context, s *slot) error {
	s.starts++
	f, err := os.Create(filepath.Join(d.logsDir, fmt.Sprintf("%s-%d.log", s.name, s.starts)))
	if err != nil {
		return err
	}
	var w io.Writer = f
	if d.cfg.Verbose {
		w = io.MultiWriter(f, os.Stderr)
	}
	r, err := harness.Start(d.s.Bin, s.name, d.env(s), w)
	if err != nil {
		f.Close()
		return err
	}
	p := &proc{r: r, fenced: r.WatchPeak("outbox_fenced_acks_total", scrapeEvery),
		ledger: r.WatchPeak(ledgerMetric, scrapeEvery), processed: r.WatchPeak(processedMetric, scrapeEvery),
		eventsRotations: r.WatchPeak(eventsRotationsMetric, scrapeEvery), ledgerRotations: r.WatchPeak(ledgerRotationsMetric, scrapeEvery),
		file: f}
	d.procsMu.Lock()
	d.procs = append(d.procs, p)
	d.procsMu.Unlock()
	s.cur = p
	hctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	return r.WaitHealthy(hctx)
}

func (d *drill) stopReplicas() {
	var wg sync.WaitGroup
	for _, s := range d.slots {
		if s.cur != nil && s.cur.r.Alive() {
			s.cur.scrape()
			wg.Go(func() { s.cur.r.Stop(shutdownGrace + 10*time.Second) })
		}
	}
	wg.Wait()
	d.procsMu.Lock()
	defer d.procsMu.Unlock()
	for _, p := range d.procs {
		p.file.Close()
	}
}

func (d *drill) other(s *slot) *slot {
	if s == d.slots[0] {
		return d.slots[1]
	}
	return d.slots[0]
}

// waitLeader waits until exactly one live replica says it leads, with an
// epoch of at least minEpoch, and returns its slot.
func (d *drill) waitLeader(ctx context.Context, minEpoch int64) (*slot, int64, error) {
	rs := make([]*harness.Replica, len(d.slots))
	for i, s := range d.slots {
		if s.cur != nil {
			rs[i] = s.cur.r
		}
	}
	r, epoch, err := harness.WaitLeader(ctx, stepTimeout, minEpoch, rs...)
	if err != nil {
		return nil, 0, err
	}
	return d.slots[slices.Index(rs, r)], epoch, nil
}

// healthConfig is what the drill samples of the database: the horizon,
// wlproj's snapshots and lock waits, the outbox's and the ledger's dead
// rows, the backlog.
func (d *drill) healthConfig() harness.HealthConfig {
	return harness.HealthConfig{Prefix: "wlproj", Election: leader.LockSessionName(""),
		Tables: []string{"outbox_events", "outbox_ledger"}, Backlog: true, Every: healthEvery}
}

// waitStandby waits until the slot's replica is a ready standby.
func (d *drill) waitStandby(ctx context.Context, s *slot) error {
	return harness.WaitStandby(ctx, stepTimeout, d.s.DB.Pool, s.cur.r, leader.LockSessionName(s.name))
}

// poll waits for cond for at most a step.
func (d *drill) poll(ctx context.Context, what string, cond func(ctx context.Context) (bool, error)) error {
	return harness.Poll(ctx, stepTimeout, what, cond)
}

// backlog is the events not done or failed yet, queued ones included.
func (d *drill) backlog(ctx context.Context) (int64, error) {
	var n int64
	err := d.poll(ctx, "the backlog", func(ctx context.Context) (bool, error) {
		var err error
		n, err = harness.Backlog(ctx, d.s.DB.Pool)
		return err == nil, err
	})
	return n, err
}

// rotation is what the replicas rotate with, for the verdict.
func (d *drill) rotation() harness.Rotation {
	return harness.Rotation{Retention: d.cfg.Retention, TombstoneRetention: consume.TombstoneRetentionDefault}
}

// verifyIndex ends the run as an operator would: wlproj verify compares
// the index with the applied-version ledger (the drill's producers keep no
// source table) and must find it clean.
func (d *drill) verifyIndex(ctx context.Context) {
	cmd := exec.CommandContext(ctx, d.s.Bin, "verify", "--json")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+d.s.DB.URL, "ELASTIC_URL="+d.cfg.ElasticURL, "ELASTIC_INDEX="+d.s.Index)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	out = bytes.TrimSpace(out)
	var exit *exec.ExitError
	switch {
	case err == nil:
		d.say("wlproj verify: clean: %s", out)
	case errors.As(err, &exit) && exit.ExitCode() == 4:
		d.rep.Problem("wlproj verify found drift: " + string(out))
	default:
		d.rep.Problem(fmt.Sprintf("wlproj verify: %v: %s", err, bytes.TrimSpace(stderr.Bytes())))
	}
}
