package leader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/startstop"
	"github.com/wlproj/wlproj/outbox"
)

// Defaults of Config. The CLI's flags take their defaults from here.
const (
	NameDefault                = "wlproj"
	CheckIntervalDefault       = 250 * time.Millisecond
	CheckTimeoutDefault        = time.Second
	retryIntervalDefault       = 500 * time.Millisecond
	tickIntervalDefault        = time.Second
	KeepalivesIdleDefault      = 5 * time.Second
	KeepalivesIntervalDefault  = 2 * time.Second
	KeepalivesCountDefault     = 3
	drainTimeoutDefault        = 30 * time.Second
	serverCheckIntervalDefault = 5 * time.Second
)

// Accepted ranges of Config.
var (
	CheckIntervalRange      = bounds.Range[time.Duration]{Min: 50 * time.Millisecond, Max: 10 * time.Second}
	CheckTimeoutRange       = bounds.Range[time.Duration]{Min: 100 * time.Millisecond, Max: 30 * time.Second}
	KeepalivesIdleRange     = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * time.Minute}
	KeepalivesIntervalRange = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * time.Minute}
	KeepalivesCountRange    = bounds.Range[int]{Min: 1, Max: 100}
)

// lockSessionPrefix starts the application_name of every lock connection.
const lockSessionPrefix = "wlproj-leader:"

// LockSessionName is the application_name of workerID's lock connection, by
// which pg_stat_activity shows who waits for or holds the lock.
func LockSessionName(workerID string) string { return lockSessionPrefix + workerID }

// Config configures an Elector.
type Config struct {
	// DatabaseURL is where the lock connection goes; with several hosts it
	// must carry target_session_attrs=read-write (or primary), and each
	// reconnection, after the lock session is lost, goes to whichever host
	// accepts writes then. Required.
	DatabaseURL string
	// Name is the leader name; replicas with the same name compete for one
	// lock. Defaults to "wlproj".
	Name string
	// WorkerID identifies this replica in outbox_leader and pg_stat_activity. Required.
	WorkerID string
	// ProjectionsHash identifies the projections this replica runs; the
	// leader records it in outbox_leader_projections (outbox.RecordProjectionsSQL).
	// Empty records nothing.
	ProjectionsHash string
	// CheckInterval is how often the leader verifies its lock connection.
	// Defaults to 250ms.
	CheckInterval time.Duration
	// CheckTimeout bounds one check. Defaults to 1s.
	CheckTimeout time.Duration
	// RetryInterval is the pause before reconnecting after an error. Defaults to 500ms.
	RetryInterval time.Duration
	// TickInterval is how often Run calls OnTick, leader or not. Defaults to 1s.
	TickInterval time.Duration
	// KeepalivesIdle, KeepalivesInterval and KeepalivesCount set TCP
	// keepalives on both ends of the lock connection, so that Postgres drops
	// a partitioned leader's session, and its lock, within
	// idle + interval*count (plus tcp_user_timeout for unacknowledged data).
	// Default to 5s, 2s and 3.
	KeepalivesIdle     time.Duration
	KeepalivesInterval time.Duration
	KeepalivesCount    int
	// DrainTimeout bounds how long shutdown waits for the services to drain
	// before it cancels them. Defaults to 30s.
	DrainTimeout time.Duration
	// ServerCheckInterval is how often a leader asks every host DatabaseURL
	// lists, and its pool, which server they reach (a split brain check,
	// each within CheckTimeout), and how long a replica that refused to
	// lead waits before it asks again. A standby asks every half of it
	// while it waits for the lock, so that the replica that wins has asked
	// within the interval and starts leading without asking again.
	// Defaults to 5s.
	ServerCheckInterval time.Duration
}

func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, NameDefault)
	c.CheckInterval = cmp.Or(c.CheckInterval, CheckIntervalDefault)
	c.CheckTimeout = cmp.Or(c.CheckTimeout, CheckTimeoutDefault)
	c.RetryInterval = cmp.Or(c.RetryInterval, retryIntervalDefault)
	c.TickInterval = cmp.Or(c.TickInterval, tickIntervalDefault)
	c.KeepalivesIdle = cmp.Or(c.KeepalivesIdle, KeepalivesIdleDefault)
	c.KeepalivesInterval = cmp.Or(c.KeepalivesInterval, KeepalivesIntervalDefault)
	c.KeepalivesCount = cmp.Or(c.KeepalivesCount, KeepalivesCountDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, drainTimeoutDefault)
	c.ServerCheckInterval = cmp.Or(c.ServerCheckInterval, serverCheckIntervalDefault)
	return c
}

// Validate checks the settings; a missing or out-of-range one is a
// *bounds.FieldError, which the CLI reports by its variable's name.
func (c Config) Validate() error {
	if c.DatabaseURL == "" {
		return bounds.Invalid("DatabaseURL", "is required: the Postgres connection URL")
	}
	cfg, err := pgx.ParseConfig(c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DatabaseURL: %w", err)
	}
	if err := pgpool.CheckHosts(&cfg.Config); err != nil {
		return fmt.Errorf("DatabaseURL: %w", err)
	}
	if c.WorkerID == "" {
		return bounds.Invalid("WorkerID", "is required: the name of this replica")
	}
	return bounds.First(
		bounds.Check("CheckInterval", c.CheckInterval, CheckIntervalRange),
		bounds.Check("CheckTimeout", c.CheckTimeout, CheckTimeoutRange),
		bounds.Check("KeepalivesIdle", c.KeepalivesIdle, KeepalivesIdleRange),
		bounds.Check("KeepalivesInterval", c.KeepalivesInterval, KeepalivesIntervalRange),
		bounds.Check("KeepalivesCount", c.KeepalivesCount, KeepalivesCountRange),
	)
}

// Role of a replica.
type Role string

const (
	RoleStandby Role = "standby"
	RoleLeader  Role = "leader"
)

// State is a snapshot for health endpoints.
type State struct {
	Role     Role      `json:"role"`
	WorkerID string    `json:"worker_id"`
	Epoch    int64     `json:"epoch"`
	Since    time.Time `json:"since"`
	// Refused is why this replica refuses to lead (a Reason constant),
	// empty when it does not.
	Refused string `json:"refused,omitempty"`
}

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_leader":               "1 while this replica is the leader, else 0.",
		"outbox_leader_epoch":         "Epoch (fencing token) of this replica's current leadership.",
		"outbox_leader_changes_total": "Times this replica became leader.",
	})
}

var (
	leaderGauge   = metrics.NewGauge(`outbox_leader`, nil)
	epochGauge    = metrics.NewGauge(`outbox_leader_epoch`, nil)
	leaderChanges = metrics.NewCounter(`outbox_leader_changes_total`)
)

// Elector runs the election loop for one replica.
type Elector struct {
	cfg      Config
	log      zerolog.Logger
	services []Service
	// OnTick, if set, is called from the loop every TickInterval; liveness
	// and the systemd watchdog hang off it.
	OnTick func()
	// CanLead, if set, says whether this replica may lead now; the replica
	// sets it to whether the database's schema is one its binary runs on.
	// While it says no the elector does not campaign (checked every tick,
	// with no connection open, and between the slices of the lock wait),
	// and a leader for which it turns to no steps down as at shutdown. It
	// is called from the loop, so it must answer at once.
	CanLead func() bool
	// PoolServers, if set, says which servers the replica's pool reaches
	// (PoolServers makes one of a pool). A replica whose pool reaches
	// another server than its lock connection does not lead: its claims
	// and acks would run where its lock and epoch are not.
	PoolServers func(context.Context) ([]Server, error)

	// refusal is the last split check's verdict and checkedAt its time;
	// only the loop touches them.
	refusal   *Refusal
	checkedAt time.Time
	// attempts logs failed attempts as outages; only the loop touches it.
	attempts attemptLog

	mu     sync.Mutex
	state  State
	tick   atomic.Int64
	runner startstop.Runner
}

// New validates cfg and returns an Elector that runs services while leader.
func New(cfg Config, log zerolog.Logger, services ...Service) (*Elector, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Elector{cfg: cfg, log: log.With().Str("service", "leader").Logger(), services: services}
	e.state = State{Role: RoleStandby, WorkerID: cfg.WorkerID, Since: time.Now()}
	// Live from the start: /healthz is served before the loop's first tick.
	e.tick.Store(time.Now().UnixNano())
	return e, nil
}

// State returns the current role and epoch.
func (e *Elector) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// LastTick is when the loop last made progress.
func (e *Elector) LastTick() time.Time { return time.Unix(0, e.tick.Load()) }

func (e *Elector) setState(role Role, epoch int64) {
	e.mu.Lock()
	e.state = State{Role: role, WorkerID: e.cfg.WorkerID, Epoch: epoch, Since: time.Now(), Refused: e.state.Refused}
	e.mu.Unlock()
	if role == RoleLeader {
		leaderGauge.Set(1)
		epochGauge.Set(float64(epoch))
		leaderChanges.Inc()
	} else {
		leaderGauge.Set(0)
	}
}

func (e *Elector) ticked() {
	e.tick.Store(time.Now().UnixNano())
	if e.OnTick != nil {
		e.OnTick()
	}
}

// Start runs Run in the background (a startstop.Service): the elector
// campaigns until Stop or ctx ends.
func (e *Elector) Start(ctx context.Context) error {
	e.runner.Run(ctx, e.Run)
	return nil
}

// Stop ends the campaign as a cancelled ctx does and returns once a
// leader's services have drained and the lock is released.
func (e *Elector) Stop() { e.runner.Stop() }

// errMayNotLead ends a campaign or a term because CanLead said no.
var errMayNotLead = errors.New("this replica may not lead now")

func (e *Elector) canLead() bool { return e.CanLead == nil || e.CanLead() }

// Run campaigns until ctx is cancelled. Cancelling ctx is a graceful
// shutdown: a leader drains its services, then releases the lock.
func (e *Elector) Run(ctx context.Context) {
	e.ticked()
	for ctx.Err() == nil {
		if !e.awaitCanLead(ctx) {
			return
		}
		err := e.campaign(ctx)
		var refused *Refusal
		switch {
		case errors.Is(err, errMayNotLead):
		case errors.As(err, &refused):
			// Refused, not failed: the split lasts until someone resolves
			// it, so ask again after a check interval, not at once.
			e.pause(ctx, e.cfg.ServerCheckInterval)
		case err != nil && ctx.Err() == nil:
			// A failed attempt is the loop at work, not a hung one: liveness
			// must not fail (and systemd's watchdog or a kubelet restart the
			// replica) for a database outage, which readiness reports.
			e.ticked()
			e.attempts.failed(e.log, err, time.Now())
			e.pause(ctx, e.cfg.RetryInterval)
		}
	}
}

// pause waits d, or until ctx ends, ticking meanwhile.
func (e *Elector) pause(ctx context.Context, d time.Duration) {
	done := time.After(d)
	ticker := time.NewTicker(e.cfg.TickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-ticker.C:
			e.ticked()
		}
	}
}

// awaitCanLead returns true once CanLead allows a campaign and false when
// ctx ends. It keeps ticking meanwhile: the replica is alive, only not
// allowed to lead, and a restart would not change that.
func (e *Elector) awaitCanLead(ctx context.Context) bool {
	if e.canLead() {
		return true
	}
	// Info, not a warning: every start waits here until the replica's first
	// schema read, and a real reason (a schema behind the binary, a queue
	// from another cluster) is logged, as an error, by the check that found it.
	e.log.Info().Msg("not campaigning for leadership until this replica may lead (/readyz says why)")
	ticker := time.NewTicker(e.cfg.TickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-ticker.C:
			e.ticked()
			if e.canLead() {
				e.log.Info().Msg("campaigning for leadership again")
				return true
			}
		}
	}
}

func (e *Elector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(e.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	secs := func(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) }
	cfg.RuntimeParams["application_name"] = LockSessionName(e.cfg.WorkerID)
	// Every statement of the lock session gives up a lock wait after a
	// slice (waitInSlices), the standby's wait for leadership above all.
	cfg.RuntimeParams["lock_timeout"] = strconv.Itoa(int(outbox.LockWaitSlice.Milliseconds()))
	cfg.RuntimeParams["tcp_keepalives_idle"] = secs(e.cfg.KeepalivesIdle)
	cfg.RuntimeParams["tcp_keepalives_interval"] = secs(e.cfg.KeepalivesInterval)
	cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(e.cfg.KeepalivesCount)
	userTimeout := e.cfg.KeepalivesIdle + e.cfg.KeepalivesInterval*time.Duration(e.cfg.KeepalivesCount)
	cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(userTimeout.Milliseconds()))
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: e.cfg.KeepalivesIdle, Interval: e.cfg.KeepalivesInterval, Count: e.cfg.KeepalivesCount,
	}}
	cfg.DialFunc = dialer.DialContext
	cfg.ConnectTimeout = cmp.Or(cfg.ConnectTimeout, 5*time.Second)
	return pgpool.Connect(ctx, cfg)
}

// campaign runs one connection's life: wait for the lock, lead, and return
// when leadership or the connection is lost, or ctx is cancelled.
//
// It checks for a split brain before it waits for the lock, so a replica
// that refused takes no lock while it keeps asking, and again after it
// wins unless the last check is recent: the failover path (the lock free at
// once) pays for one check, not two.
func (e *Elector) campaign(ctx context.Context) error {
	conn, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	lock, err := readServer(ctx, conn)
	if err != nil {
		return fmt.Errorf("read the lock connection's server: %w", err)
	}
	e.attempts.reached(e.log, time.Now())
	if err := e.checkSplit(ctx, lock); err != nil {
		return err
	}
	if err := e.waitForLock(ctx, conn, lock); err != nil {
		return err
	}
	if !e.canLead() {
		return errMayNotLead // closing conn releases the lock
	}
	if time.Since(e.checkedAt) >= e.cfg.ServerCheckInterval {
		if err := e.checkSplit(ctx, lock); err != nil {
			return err // closing conn releases the lock
		}
	}
	var epoch int64
	err = conn.QueryRow(ctx, outbox.BumpEpochSQL, e.cfg.Name, e.cfg.WorkerID).Scan(&epoch)
	if err != nil {
		return fmt.Errorf("bump epoch: %w", err)
	}
	return e.lead(ctx, conn, epoch, lock)
}

// recordProjections records the projections this leader runs, once its
// services have started: only seen, never relied on, so a failure to
// record it leads anyway, and the write is no step of a takeover.
func (e *Elector) recordProjections(ctx context.Context, conn *pgx.Conn, epoch int64) {
	if e.cfg.ProjectionsHash == "" {
		return
	}
	if _, err := conn.Exec(ctx, outbox.RecordProjectionsSQL, e.cfg.Name, epoch, e.cfg.ProjectionsHash); err != nil {
		e.log.Warn().Err(err).Msg("could not record this leader's projections hash")
	}
}

// checkSplit runs findSplit; a *Refusal when this replica may not lead
// on lock.
func (e *Elector) checkSplit(ctx context.Context, lock Server) error {
	return e.recordSplit(e.findSplit(ctx, lock))
}

// recordSplit records a split check's verdict and returns r as an error,
// nil for no split.
func (e *Elector) recordSplit(r *Refusal) error {
	e.checkedAt = time.Now()
	e.refuse(r)
	if r != nil {
		return r
	}
	return nil
}

// waitForLock returns once conn, on lock's server, holds the leader lock.
// The wait runs aside so the loop keeps ticking for liveness, and checks
// for a split brain every half ServerCheckInterval meanwhile: the check is
// then recent when the lock comes, and a takeover does not wait for one
// (probe connections to every host, a statement on each pooled one). A
// split found ends the wait with the *Refusal.
func (e *Elector) waitForLock(ctx context.Context, conn *pgx.Conn, lock Server) error {
	locked := make(chan error, 1)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() { locked <- waitInSlices(waitCtx, conn, e.cfg.Name, e.canLead) }()
	ticker := time.NewTicker(e.cfg.TickInterval)
	defer ticker.Stop()
	split := e.newSplitWatch(e.cfg.ServerCheckInterval / 2)
	defer split.due.Stop()
	for {
		select {
		case err := <-locked:
			if err != nil {
				return fmt.Errorf("wait for lock: %w", err)
			}
			// A check under way is not waited for: probing the listed
			// hosts opens a connection to each (tens of milliseconds under
			// load), and the takeovers that won the lock during one took
			// 95 ms where the others took 30 (make drill, 2 of 20 kills).
			// The last completed verdict is at most half a
			// ServerCheckInterval old (campaign checks again when it is
			// older than a whole one), and the term's own checks follow
			// from its start; the check under way ends on its own.
			return nil
		case <-ticker.C:
			e.ticked()
		case <-split.due.C:
			split.start(ctx, e, lock)
		case r := <-split.result:
			split.running = false
			if err := e.recordSplit(r); err != nil {
				stopWaiting()
				<-locked // conn is the wait's until it returns
				return err
			}
		}
	}
}

// waitInSlices runs LockSQL until it takes the lock. The lock connection's
// lock_timeout (outbox.LockWaitSlice) ends each wait, and with it the
// statement's snapshot, so a standby never holds the database's vacuum
// horizon back by more than a slice, however long it stands by. Before each
// slice it asks canLead, and gives up the wait with errMayNotLead on a no.
func waitInSlices(ctx context.Context, conn *pgx.Conn, name string, canLead func() bool) error {
	for {
		if !canLead() {
			return errMayNotLead
		}
		_, err := conn.Exec(ctx, outbox.LockSQL, name)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != outbox.LockNotAvailable {
			return err
		}
	}
}

// lead runs the services for the term of epoch until it ends: ctx
// cancelled, the lock connection lost, CanLead turned to no, or a split
// brain check (every ServerCheckInterval) refusing lock's server.
func (e *Elector) lead(ctx context.Context, conn *pgx.Conn, epoch int64, lock Server) error {
	e.setState(RoleLeader, epoch)
	defer e.setState(RoleStandby, 0)

	svcCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drain := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		runAll(svcCtx, epoch, drain, e.services)
	}()
	e.log.Info().Int64("epoch", epoch).Msg("became leader")
	e.recordProjections(ctx, conn, epoch)

	check := time.NewTicker(e.cfg.CheckInterval)
	defer check.Stop()
	tick := time.NewTicker(e.cfg.TickInterval)
	defer tick.Stop()
	split := e.newSplitWatch(e.cfg.ServerCheckInterval)
	defer split.due.Stop()
	for {
		select {
		case <-ctx.Done():
			e.release(conn, epoch, drain, done, tick.C, cancel)
			return nil
		case <-done:
			// The services stopped on their own; give the lock to another replica.
			e.log.Warn().Int64("epoch", epoch).Msg("services stopped; stepping down")
			return nil
		case <-tick.C:
			e.ticked()
		case <-split.due.C:
			split.start(ctx, e, lock)
		case r := <-split.result:
			split.running = false
			if err := e.recordSplit(r); err != nil {
				e.release(conn, epoch, drain, done, tick.C, cancel)
				return err
			}
		case <-check.C:
			if !e.canLead() {
				e.log.Warn().Int64("epoch", epoch).Msg("may not lead any more (/readyz says why); stepping down")
				e.release(conn, epoch, drain, done, tick.C, cancel)
				return errMayNotLead
			}
			if err := e.check(conn, epoch); err != nil {
				cancel()
				<-done
				e.log.Error().Err(err).Int64("epoch", epoch).Msg("lost leadership; stopped writing")
				return err
			}
		}
	}
}

// release ends a term in order, as at shutdown: the services drain, then
// the lock goes.
func (e *Elector) release(conn *pgx.Conn, epoch int64, drain chan struct{}, done <-chan struct{}, tick <-chan time.Time, cancel context.CancelFunc) {
	close(drain)
	e.awaitDrain(done, tick, cancel)
	unlockCtx, cancelUnlock := context.WithTimeout(context.Background(), e.cfg.CheckTimeout)
	_, err := conn.Exec(unlockCtx, outbox.UnlockSQL, e.cfg.Name)
	cancelUnlock()
	e.log.Info().Int64("epoch", epoch).Err(err).Msg("released leadership")
}

// awaitDrain waits for the drained services, cancelling them after
// DrainTimeout. It keeps ticking: a drain is progress, not a hang, for /healthz.
func (e *Elector) awaitDrain(done <-chan struct{}, tick <-chan time.Time, cancel context.CancelFunc) {
	timeout := time.After(e.cfg.DrainTimeout)
	for {
		select {
		case <-done:
			return
		case <-tick:
			e.ticked()
		case <-timeout:
			e.log.Warn().Msg("drain timed out; cancelling services")
			cancel()
			<-done
			return
		}
	}
}

// check proves the lock session is alive and no one has taken a newer epoch.
func (e *Elector) check(conn *pgx.Conn, epoch int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CheckTimeout)
	defer cancel()
	var current int64
	err := conn.QueryRow(ctx, outbox.EpochSQL, e.cfg.Name).Scan(&current)
	if err != nil {
		return fmt.Errorf("lock connection check: %w", err)
	}
	if current != epoch {
		return fmt.Errorf("epoch moved from %d to %d", epoch, current)
	}
	return nil
}
