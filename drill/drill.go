package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/faultproxy"
	"github.com/wlproj/wlproj/internal/replica"
	"github.com/wlproj/wlproj/internal/rig"
	"github.com/wlproj/wlproj/internal/tcpproxy"
)

const (
	rateDefault         = 200
	entitiesDefault     = 500
	killsDefault        = 5
	outageDefault       = 60 * time.Second
	settleDefault       = 2 * time.Second
	drainTimeoutDefault = 2 * time.Minute
	// maxAttemptsDefault outlasts a 60 s outage: with a 2 s backoff cap and
	// equal jitter an event retries at most every second.
	maxAttemptsDefault = 100
	reportDefault      = "drill/report.json"

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
	pollEvery   = 20 * time.Millisecond

	msgLostLeadership = "lost leadership; stopped writing"
)

// Config is what one drill run needs.
type Config struct {
	// Rate is the events per second the producer writes.
	Rate int
	// Entities is the number of books the producer writes versions of.
	Entities int
	// Kills is the number of kill -9 rounds.
	Kills int
	// Outage is how long the engine is down.
	Outage time.Duration
	// PGRestart runs the Postgres restart scenario; it restarts the whole
	// cluster, so tests sharing it leave it off.
	PGRestart bool
	// Settle is the pause before each fault.
	Settle time.Duration
	// DrainTimeout bounds the final drain.
	DrainTimeout time.Duration
	// MaxAttempts is the replicas' OUTBOX_MAX_ATTEMPTS.
	MaxAttempts int
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
	case c.Outage < time.Second:
		return fmt.Errorf("-outage %s: must be at least 1s", c.Outage)
	case c.MaxAttempts < 1 || c.MaxAttempts > 1000:
		return fmt.Errorf("-max-attempts %d: out of range [1, 1000]", c.MaxAttempts)
	case c.PGRestart && (c.PG.Data == "" || c.PG.BinDir == ""):
		return errors.New("the Postgres restart needs STACK_PG_DATA and STACK_PG_BINDIR (from .stack/env); or pass -pg-restart=false")
	}
	return nil
}

// PGControl restarts the stack's Postgres as its unprivileged user.
type PGControl struct {
	Data, BinDir, RunUser, RunDir string
}

// ctl runs pg_ctl as the cluster's user. It ignores the drill's context: a
// pg_ctl killed half way could leave Postgres down.
func (pg PGControl) ctl(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	argv := append([]string{filepath.Join(pg.BinDir, "pg_ctl"), "-D", pg.Data}, args...)
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
	root    string
	tmp     string
	logsDir string
	bin     string

	dbName, dbURL   string
	owner, runtime  string
	runtimePassword string
	index           string
	admin           *pgxpool.Pool
	engine          *faultproxy.Proxy
	slots           []*slot
	prod            *producer
	pgRestarted     bool
	cleanups        []func()
	procsMu         sync.Mutex
	procs           []*proc
}

// slot is one replica name with its own path to Postgres; each restart of
// the replica is a new proc in the same slot.
type slot struct {
	name   string
	proxy  *tcpproxy.Proxy
	cur    *proc
	starts int
}

// proc is one `wlproj run` process.
type proc struct {
	r            *replica.Replica
	watch        *logWatch
	file         *os.File
	fencedMetric int64 // last scraped outbox_fenced_acks_total
}

func (p *proc) alive() bool {
	select {
	case <-p.r.Exited():
		return false
	default:
		return true
	}
}

// scrape keeps the process's fencing counter; a killed process loses it.
func (p *proc) scrape() {
	code, body, err := p.r.Get("/metrics")
	if err != nil || code != http.StatusOK {
		return
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "outbox_fenced_acks_total "); ok {
			if n, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				p.fencedMetric = int64(n)
			}
		}
	}
}

// Run runs the drill and returns its report; a nil report means it could
// not start. Everything it created is gone when Run returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Settle <= 0 {
		cfg.Settle = settleDefault
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = drainTimeoutDefault
	}
	d := &drill{cfg: cfg, start: time.Now(), rep: &Report{
		StartedAt: time.Now().UTC(),
		Settings: Settings{Rate: cfg.Rate, Entities: cfg.Entities, Kills: cfg.Kills, OutageSeconds: cfg.Outage.Seconds(),
			PGRestart: cfg.PGRestart, MaxAttempts: cfg.MaxAttempts, KeepaliveWindow: keepaliveWindow.Seconds()},
	}}
	defer d.cleanup()
	if err := d.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	d.run(ctx)
	if ctx.Err() == nil {
		d.finish(ctx)
	} else {
		d.problem("interrupted")
	}
	d.rep.OK = len(d.rep.Problems) == 0
	d.rep.DurationSeconds = rig.Round3(time.Since(d.start).Seconds())
	if !d.rep.OK {
		d.rep.LogsDir = d.logsDir
	}
	if err := d.rep.write(cfg.ReportPath); err != nil {
		d.problem("write report: " + err.Error())
		d.rep.OK = false
	}
	d.rep.summary(cfg.Out, cfg.ReportPath)
	return d.rep, nil
}

func (d *drill) say(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "[%6.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

func (d *drill) problem(p string) { d.rep.Problems = append(d.rep.Problems, p) }

func (d *drill) onCleanup(f func()) { d.cleanups = append(d.cleanups, f) }

// cleanup undoes setup in reverse, each step on its own deadline, so that
// a Ctrl-C or a failed step still leaves nothing behind.
func (d *drill) cleanup() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
	if d.tmp != "" && (d.rep.OK || d.rep.LogsDir == "") {
		_ = os.RemoveAll(d.tmp)
	}
}

func (d *drill) setup(ctx context.Context) error {
	var err error
	if d.root, err = rig.RepoRoot(); err != nil {
		return err
	}
	if d.tmp, err = os.MkdirTemp("", "wlproj-drill-"); err != nil {
		return err
	}
	d.logsDir = filepath.Join(d.tmp, "logs")
	if err := os.MkdirAll(d.logsDir, 0o755); err != nil {
		return err
	}
	d.bin = d.cfg.Bin
	if d.bin == "" {
		d.say("building wlproj")
		if d.bin, err = rig.Build(ctx, d.root, d.tmp); err != nil {
			return err
		}
	}

	id := rig.RandomHex(4)
	d.dbName, d.index = "wlproj_drill_"+id, "wlproj-drill-"+id
	d.owner, d.runtime = "wlproj_owner_drill_"+id, "wlproj_runtime_drill_"+id
	d.runtimePassword = rig.RandomHex(12)
	d.rep.Database, d.rep.Index = d.dbName, d.index
	d.rep.Roles = Roles{Owner: d.owner, Runtime: d.runtime}
	if err := d.setupDatabase(ctx); err != nil {
		return err
	}
	if err := d.setupIndex(ctx); err != nil {
		return err
	}

	if d.engine, err = faultproxy.New(d.cfg.ElasticURL); err != nil {
		return err
	}
	d.onCleanup(func() { _ = d.engine.Close() })
	pgCfg, err := pgx.ParseConfig(d.cfg.AdminURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pgAddr := net.JoinHostPort(pgCfg.Host, strconv.Itoa(int(pgCfg.Port)))
	for _, name := range []string{"a", "b"} {
		p, err := tcpproxy.New(pgAddr)
		if err != nil {
			return err
		}
		d.onCleanup(func() { _ = p.Close() })
		d.slots = append(d.slots, &slot{name: name, proxy: p})
	}
	// Replicas stop before the proxies close, so they exit on their own terms.
	d.onCleanup(d.stopReplicas)

	d.say("database %s, index %s, replicas as role %s; starting replicas a and b", d.dbName, d.index, d.runtime)
	if err := d.startProc(ctx, d.slots[0]); err != nil {
		return err
	}
	if _, _, err := d.waitLeader(ctx, 0); err != nil {
		return err
	}
	if err := d.startProc(ctx, d.slots[1]); err != nil {
		return err
	}
	if err := d.waitStandby(ctx, d.slots[1]); err != nil {
		return err
	}

	d.prod = startProducer(context.WithoutCancel(ctx), d.admin, d.cfg.Rate, d.cfg.Entities)
	d.onCleanup(d.prod.stop)
	d.say("producer: %d events/s over %d books", d.cfg.Rate, d.cfg.Entities)
	if _, err := d.firstAck(ctx, time.Time{}, ""); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// setupDatabase creates the database, migrates it as the admin and applies
// roles.sql, which hands the schema to the owner role and grants the
// runtime role what the daemon needs.
func (d *drill) setupDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.cfg.AdminURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(ctx)
	var ver string
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&ver); err != nil {
		return err
	}
	d.rep.Versions.Postgres = ver
	// Registered before anything exists, so that it runs last: roles that
	// still own objects in the database cannot be dropped before it.
	d.onCleanup(d.dropDatabaseAndRoles)
	if d.dbURL, err = rig.CreateDatabase(ctx, conn, d.cfg.AdminURL, d.dbName); err != nil {
		return err
	}
	psql := "psql"
	if p := filepath.Join(d.cfg.PG.BinDir, "psql"); d.cfg.PG.BinDir != "" {
		psql = p
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "dbname="+d.dbName,
		"-v", "owner_role="+d.owner, "-v", "runtime_role="+d.runtime,
		"-v", "owner_password="+rig.RandomHex(12), "-v", "runtime_password="+d.runtimePassword,
		"-f", filepath.Join(d.root, "deploy", "sql", "roles.sql"), d.dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("roles.sql: %w\n%s", err, out)
	}
	d.admin, err = pgxpool.New(ctx, d.dbURL)
	if err != nil {
		return err
	}
	d.onCleanup(d.admin.Close)
	return nil
}

func (d *drill) dropDatabaseAndRoles() {
	if d.pgRestarted {
		if err := d.cfg.PG.ensureRunning(); err != nil {
			d.say("cleanup: Postgres is not running and would not start: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conn *pgx.Conn
	var err error
	// Right after a restart the first connection may still be refused.
	for range 50 {
		if conn, err = pgx.Connect(ctx, d.cfg.AdminURL); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		d.say("cleanup: connect as admin: %v; drop database %s and roles %s, %s by hand", err, d.dbName, d.owner, d.runtime)
		return
	}
	defer conn.Close(ctx)
	for _, stmt := range []string{
		"DROP DATABASE IF EXISTS " + pgx.Identifier{d.dbName}.Sanitize() + " WITH (FORCE)",
		"DROP ROLE IF EXISTS " + pgx.Identifier{d.runtime}.Sanitize(),
		"DROP ROLE IF EXISTS " + pgx.Identifier{d.owner}.Sanitize(),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			d.say("cleanup: %s: %v", stmt, err)
		}
	}
}

func (d *drill) setupIndex(ctx context.Context) error {
	var root struct {
		Version struct{ Number string } `json:"version"`
	}
	if err := rig.ES(ctx, d.cfg.ElasticURL, http.MethodGet, "/", nil, &root); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	d.rep.Versions.Elasticsearch = root.Version.Number
	mapping, err := os.ReadFile(filepath.Join(d.root, "testdata", "mapping.json"))
	if err != nil {
		return err
	}
	d.onCleanup(func() {
		_ = rig.ES(context.Background(), d.cfg.ElasticURL, http.MethodDelete, "/"+d.index+"?ignore_unavailable=true", nil, nil)
	})
	if err := rig.ES(ctx, d.cfg.ElasticURL, http.MethodPut, "/"+d.index, mapping, nil); err != nil {
		return fmt.Errorf("create index %s: %w", d.index, err)
	}
	return nil
}

// env is a replica's environment: the runtime role through the slot's own
// proxy, the engine through the fault proxy, and fast failover settings.
func (d *drill) env(s *slot) []string {
	u, _ := url.Parse(d.dbURL)
	u.User = url.UserPassword(d.runtime, d.runtimePassword)
	u.Host = s.proxy.Addr()
	return []string{
		"DATABASE_URL=" + u.String(),
		"ELASTIC_URL=" + d.engine.URL(),
		"ELASTIC_INDEX=" + d.index,
		"ELASTIC_TIMEOUT_SECONDS=5",
		"OUTBOX_LEADER_NAME=" + d.index,
		"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS=0.25",
		"OUTBOX_TCP_KEEPALIVES_IDLE=" + strconv.Itoa(keepalivesIdle),
		"OUTBOX_TCP_KEEPALIVES_INTERVAL=" + strconv.Itoa(keepalivesInterval),
		"OUTBOX_TCP_KEEPALIVES_COUNT=" + strconv.Itoa(keepalivesCount),
		"OUTBOX_BASE_BACKOFF_SECONDS=0.2",
		"OUTBOX_MAX_BACKOFF_SECONDS=2",
		"OUTBOX_MAX_ATTEMPTS=" + strconv.Itoa(d.cfg.MaxAttempts),
		"OUTBOX_POLL_INTERVAL_SECONDS=0.2",
		"OUTBOX_RECLAIM_INTERVAL_SECONDS=0.5",
		"OUTBOX_LEASE_SECONDS=10",
		"OUTBOX_SHUTDOWN_GRACE_SECONDS=" + strconv.Itoa(int(shutdownGrace.Seconds())),
		"LOG_FORMAT=json",
		"LOG_LEVEL=info",
	}
}

func (d *drill) startProc(ctx context.Context, s *slot) error {
	s.starts++
	f, err := os.Create(filepath.Join(d.logsDir, fmt.Sprintf("%s-%d.log", s.name, s.starts)))
	if err != nil {
		return err
	}
	w := &logWatch{file: f}
	if d.cfg.Verbose {
		w.tee = os.Stderr
	}
	r, err := replica.Start(d.bin, s.name, d.env(s), w)
	if err != nil {
		f.Close()
		return err
	}
	p := &proc{r: r, watch: w, file: f}
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
		if s.cur != nil && s.cur.alive() {
			s.cur.scrape()
			wg.Add(1)
			go func() { defer wg.Done(); s.cur.r.Stop(shutdownGrace + 10*time.Second) }()
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
// epoch of at least minEpoch, and returns it.
func (d *drill) waitLeader(ctx context.Context, minEpoch int64) (*slot, int64, error) {
	deadline := time.Now().Add(stepTimeout)
	for {
		var leaders []*slot
		var epoch int64
		for _, s := range d.slots {
			if s.cur == nil || !s.cur.alive() {
				continue
			}
			if h, err := s.cur.r.Health(); err == nil && h.Role == "leader" {
				leaders = append(leaders, s)
				epoch = h.Epoch
			}
		}
		if len(leaders) == 1 && epoch >= minEpoch {
			return leaders[0], epoch, nil
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("no single leader with epoch >= %d after %s (%d claim to lead)", minEpoch, stepTimeout, len(leaders))
		}
		if err := pause(ctx, pollEvery); err != nil {
			return nil, 0, err
		}
	}
}

// waitStandby waits until the slot's replica holds a lock connection that
// waits for the advisory lock: a standby ready to take over.
func (d *drill) waitStandby(ctx context.Context, s *slot) error {
	return d.poll(ctx, "replica "+s.name+" waiting for the lock", func(ctx context.Context) (bool, error) {
		if !s.cur.alive() {
			return false, fatal{fmt.Errorf("replica %s exited", s.name)}
		}
		var n int
		err := d.admin.QueryRow(ctx, `
			SELECT count(*) FROM pg_stat_activity
			 WHERE datname = $1 AND application_name = $2 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`,
			d.dbName, "wlproj-leader:"+s.name).Scan(&n)
		return n > 0, err
	})
}

// poll calls cond until it holds, for at most stepTimeout. Errors are
// retried (Postgres may be restarting) unless wrapped in fatal.
func (d *drill) poll(ctx context.Context, what string, cond func(ctx context.Context) (bool, error)) error {
	deadline := time.Now().Add(stepTimeout)
	var lastErr error
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ok, err := cond(qctx)
		cancel()
		if ok {
			return nil
		}
		var f fatal
		if errors.As(err, &f) {
			return f.error
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last error: %v)", stepTimeout, what, lastErr)
		}
		if err := pause(ctx, pollEvery); err != nil {
			return err
		}
	}
}

// fatal stops a poll at once.
type fatal struct{ error }

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// dbNow is Postgres' clock, the one processed_at is on.
func (d *drill) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := d.poll(ctx, "the database clock", func(ctx context.Context) (bool, error) {
		err := d.admin.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
		return err == nil, err
	})
	return t, err
}

// firstAck waits for the earliest ack after after, by the replica named by
// (any if empty), and returns its processed_at.
func (d *drill) firstAck(ctx context.Context, after time.Time, by string) (time.Time, error) {
	var at *time.Time
	err := d.poll(ctx, "an ack after the fault", func(ctx context.Context) (bool, error) {
		err := d.admin.QueryRow(ctx, `
			SELECT min(processed_at) FROM outbox_events
			 WHERE status = 'done' AND processed_at > $1 AND ($2 = '' OR locked_by = $2)`, after, by).Scan(&at)
		return err == nil && at != nil, err
	})
	if err != nil {
		return time.Time{}, err
	}
	return *at, nil
}

func (d *drill) backlog(ctx context.Context) (int64, error) {
	var n int64
	err := d.poll(ctx, "the backlog", func(ctx context.Context) (bool, error) {
		err := d.admin.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status IN ('pending', 'processing')`).Scan(&n)
		return err == nil, err
	})
	return n, err
}

// logWatch reads a replica's JSON log lines as they arrive: the arrival
// time is the measure (the log's own timestamps have one-second precision).
type logWatch struct {
	file io.Writer
	tee  io.Writer

	mu         sync.Mutex
	partial    []byte
	fenced     int64
	permission int
	seen       []logLine
}

type logLine struct {
	at  time.Time
	msg string
}

func (w *logWatch) Write(p []byte) (int, error) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.file.Write(p)
	if w.tee != nil {
		_, _ = w.tee.Write(p)
	}
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(now, w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *logWatch) line(at time.Time, b []byte) {
	if bytes.Contains(b, []byte("permission denied")) {
		w.permission++
	}
	var l struct {
		Message string `json:"message"`
		Fenced  int64  `json:"fenced"`
	}
	if json.Unmarshal(b, &l) != nil {
		return
	}
	switch l.Message {
	case "batch":
		w.fenced += l.Fenced
	case msgLostLeadership, "became leader":
		w.seen = append(w.seen, logLine{at: at, msg: l.Message})
	}
}

// after returns when msg was first logged after t.
func (w *logWatch) after(msg string, t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.seen {
		if l.msg == msg && l.at.After(t) {
			return l.at, true
		}
	}
	return time.Time{}, false
}

func (w *logWatch) counts() (fenced int64, permission int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fenced, w.permission
}
