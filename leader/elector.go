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
	"github.com/rs/zerolog"
)

const (
	nameDefault               = "wlproj"
	checkIntervalDefault      = 250 * time.Millisecond
	checkTimeoutDefault       = time.Second
	retryIntervalDefault      = 500 * time.Millisecond
	tickIntervalDefault       = time.Second
	keepalivesIdleDefault     = 5 * time.Second
	keepalivesIntervalDefault = 2 * time.Second
	keepalivesCountDefault    = 3
	drainTimeoutDefault       = 30 * time.Second
)

// Config configures an Elector.
type Config struct {
	// DatabaseURL is where the lock connection goes. Required.
	DatabaseURL string
	// Name is the leader name; replicas with the same name compete for one
	// lock. Defaults to "wlproj".
	Name string
	// WorkerID identifies this replica in outbox_leader and pg_stat_activity. Required.
	WorkerID string
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
}

func (c Config) withDefaults() Config {
	c.Name = cmp.Or(c.Name, nameDefault)
	c.CheckInterval = cmp.Or(c.CheckInterval, checkIntervalDefault)
	c.CheckTimeout = cmp.Or(c.CheckTimeout, checkTimeoutDefault)
	c.RetryInterval = cmp.Or(c.RetryInterval, retryIntervalDefault)
	c.TickInterval = cmp.Or(c.TickInterval, tickIntervalDefault)
	c.KeepalivesIdle = cmp.Or(c.KeepalivesIdle, keepalivesIdleDefault)
	c.KeepalivesInterval = cmp.Or(c.KeepalivesInterval, keepalivesIntervalDefault)
	c.KeepalivesCount = cmp.Or(c.KeepalivesCount, keepalivesCountDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, drainTimeoutDefault)
	return c
}

func (c Config) validate() error {
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required")
	}
	if c.WorkerID == "" {
		return errors.New("OUTBOX_WORKER_ID is required")
	}
	return nil
}

// Services is what the leader runs. It must return once ctx is cancelled
// (leadership lost: stop writing at once) or drain is closed (shutdown:
// finish in-flight work within the grace period, then return).
type Services func(ctx context.Context, epoch int64, drain <-chan struct{})

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
	services Services
	// OnTick, if set, is called from the loop every TickInterval; liveness
	// and the systemd watchdog hang off it.
	OnTick func()

	mu    sync.Mutex
	state State
	tick  atomic.Int64
}

// New validates cfg and returns an Elector that runs services while leader.
func New(cfg Config, log zerolog.Logger, services Services) (*Elector, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Elector{cfg: cfg, log: log.With().Str("component", "leader").Logger(), services: services}
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
	e.state = State{Role: role, WorkerID: e.cfg.WorkerID, Epoch: epoch, Since: time.Now()}
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

// Run campaigns until ctx is cancelled. Cancelling ctx is a graceful
// shutdown: a leader drains its services, then releases the lock.
func (e *Elector) Run(ctx context.Context) error {
	e.ticked()
	for ctx.Err() == nil {
		err := e.campaign(ctx)
		if err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg("leadership attempt failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(e.cfg.RetryInterval):
			}
		}
	}
	return nil
}

func (e *Elector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(e.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	secs := func(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) }
	cfg.RuntimeParams["application_name"] = "wlproj-leader:" + e.cfg.WorkerID
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
	return pgx.ConnectConfig(ctx, cfg)
}

// campaign runs one connection's life: wait for the lock, lead, and return
// when leadership or the connection is lost, or ctx is cancelled.
func (e *Elector) campaign(ctx context.Context) error {
	conn, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())

	// The blocking wait runs aside so the loop keeps ticking for liveness.
	locked := make(chan error, 1)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() {
		_, err := conn.Exec(waitCtx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, e.cfg.Name)
		locked <- err
	}()
	ticker := time.NewTicker(e.cfg.TickInterval)
	defer ticker.Stop()
	for waiting := true; waiting; {
		select {
		case err := <-locked:
			if err != nil {
				return fmt.Errorf("wait for lock: %w", err)
			}
			waiting = false
		case <-ticker.C:
			e.ticked()
		}
	}

	var epoch int64
	err = conn.QueryRow(ctx, `
		INSERT INTO outbox_leader (name, holder, epoch, acquired_at) VALUES ($1, $2, 1, now())
		ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = outbox_leader.epoch + 1, acquired_at = now()
		RETURNING epoch`, e.cfg.Name, e.cfg.WorkerID).Scan(&epoch)
	if err != nil {
		return fmt.Errorf("bump epoch: %w", err)
	}
	return e.lead(ctx, conn, epoch)
}

func (e *Elector) lead(ctx context.Context, conn *pgx.Conn, epoch int64) error {
	e.setState(RoleLeader, epoch)
	e.log.Info().Int64("epoch", epoch).Msg("became leader")
	defer e.setState(RoleStandby, 0)

	svcCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drain := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.services(svcCtx, epoch, drain)
	}()

	check := time.NewTicker(e.cfg.CheckInterval)
	defer check.Stop()
	tick := time.NewTicker(e.cfg.TickInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			close(drain)
			// Keep ticking: a drain is progress, not a hang, for /healthz.
			timeout := time.After(e.cfg.DrainTimeout)
			for drained := false; !drained; {
				select {
				case <-done:
					drained = true
				case <-tick.C:
					e.ticked()
				case <-timeout:
					e.log.Warn().Msg("drain timed out; cancelling services")
					cancel()
					<-done
					drained = true
				}
			}
			unlockCtx, cancelUnlock := context.WithTimeout(context.Background(), e.cfg.CheckTimeout)
			_, err := conn.Exec(unlockCtx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, e.cfg.Name)
			cancelUnlock()
			e.log.Info().Int64("epoch", epoch).Err(err).Msg("released leadership")
			return nil
		case <-done:
			// The services stopped on their own; give the lock to another replica.
			e.log.Warn().Int64("epoch", epoch).Msg("services stopped; stepping down")
			return nil
		case <-tick.C:
			e.ticked()
		case <-check.C:
			if err := e.check(conn, epoch); err != nil {
				cancel()
				<-done
				e.log.Error().Err(err).Int64("epoch", epoch).Msg("lost leadership; stopped writing")
				return err
			}
		}
	}
}

// check proves the lock session is alive and no one has taken a newer epoch.
func (e *Elector) check(conn *pgx.Conn, epoch int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.CheckTimeout)
	defer cancel()
	var current int64
	err := conn.QueryRow(ctx, `SELECT epoch FROM outbox_leader WHERE name = $1`, e.cfg.Name).Scan(&current)
	if err != nil {
		return fmt.Errorf("lock connection check: %w", err)
	}
	if current != epoch {
		return fmt.Errorf("epoch moved from %d to %d", epoch, current)
	}
	return nil
}
