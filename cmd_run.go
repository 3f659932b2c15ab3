package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/health"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replay"
)

type elasticFlags struct {
	ElasticURL      string  `help:"Elasticsearch base URL." env:"ELASTIC_URL" default:"http://127.0.0.1:9200"`
	ElasticUsername string  `help:"Elasticsearch basic-auth user." env:"ELASTIC_USERNAME"`
	ElasticPassword string  `help:"Elasticsearch basic-auth password." env:"ELASTIC_PASSWORD"`
	ElasticCAFile   string  `name:"elastic-ca-file" help:"PEM file of the CA that signed the engine's TLS certificate." env:"ELASTIC_CA_FILE" type:"existingfile"`
	ElasticTimeout  float64 `help:"Timeout of one request to the engine, in seconds." env:"ELASTIC_TIMEOUT_SECONDS" default:"30"`
}

type runCmd struct {
	dbFlags
	elasticFlags
	ElasticIndex string `help:"Index the search projection writes to." env:"ELASTIC_INDEX" default:"search"`

	WorkerID       string `help:"Name of this replica (default: hostname-pid)." env:"OUTBOX_WORKER_ID"`
	LeaderName     string `help:"Replicas with the same leader name compete for one lock." env:"OUTBOX_LEADER_NAME" default:"wlproj"`
	HTTPAddr       string `name:"http-addr" help:"Bind address of the health and metrics endpoints." env:"OUTBOX_HTTP_ADDR" default:"127.0.0.1"`
	HTTPPort       int    `name:"http-port" help:"Port of /healthz and /readyz." env:"OUTBOX_HTTP_PORT" default:"8080"`
	MetricsPort    int    `help:"Port of /metrics; 0 or the HTTP port serves it on the same listener." env:"OUTBOX_METRICS_PORT" default:"0"`
	RequireESReady bool   `name:"require-es-ready" help:"Make /readyz fail while the engine is unreachable." env:"OUTBOX_REQUIRE_ES_READY"`
	Pprof          bool   `help:"Serve Go's /debug/pprof/ on the metrics port, for profiling." env:"OUTBOX_PPROF"`

	BulkSize               int     `help:"Events per claim and per bulk request [1, 10000]." env:"OUTBOX_BULK_SIZE" default:"500"`
	Concurrency            int     `help:"Bulk requests in flight at once [1, 64]." env:"OUTBOX_CONCURRENCY" default:"2"`
	PollIntervalSeconds    float64 `help:"Fallback poll when no NOTIFY arrives [0.01, 300]." env:"OUTBOX_POLL_INTERVAL_SECONDS" default:"1"`
	LeaseSeconds           float64 `help:"Claim lease [1, 3600]." env:"OUTBOX_LEASE_SECONDS" default:"60"`
	ReclaimIntervalSeconds float64 `help:"How often stuck rows are reclaimed [0.1, 3600]." env:"OUTBOX_RECLAIM_INTERVAL_SECONDS" default:"5"`
	MaxProcessingSeconds   float64 `help:"Time in processing after which a row is stuck whatever its lease [1, 86400]." env:"OUTBOX_MAX_PROCESSING_SECONDS" default:"300"`
	MaxAttempts            int     `help:"Attempts before a transient failure becomes terminal [1, 1000]." env:"OUTBOX_MAX_ATTEMPTS" default:"10"`
	BaseBackoffSeconds     float64 `help:"First retry delay [0.01, 3600]." env:"OUTBOX_BASE_BACKOFF_SECONDS" default:"1"`
	MaxBackoffSeconds      float64 `help:"Retry delay cap [0.01, 86400]." env:"OUTBOX_MAX_BACKOFF_SECONDS" default:"300"`
	ShutdownGraceSeconds   float64 `help:"How long SIGTERM lets in-flight bulks finish [1, 600]." env:"OUTBOX_SHUTDOWN_GRACE_SECONDS" default:"20"`
	MaxPayloadBytes        int     `help:"Largest upsert payload accepted; larger ones fail as payload_invalid." env:"OUTBOX_MAX_PAYLOAD_BYTES" default:"1048576"`

	LeaderCheckIntervalSeconds float64 `help:"How often the leader verifies its lock connection [0.05, 10]." env:"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS" default:"0.25"`
	LeaderCheckTimeoutSeconds  float64 `help:"Timeout of one lock check [0.1, 30]." env:"OUTBOX_LEADER_CHECK_TIMEOUT_SECONDS" default:"1"`
	TCPKeepalivesIdle          int     `name:"tcp-keepalives-idle" help:"Seconds of silence before the lock connection sends keepalives [1, 600]." env:"OUTBOX_TCP_KEEPALIVES_IDLE" default:"5"`
	TCPKeepalivesInterval      int     `name:"tcp-keepalives-interval" help:"Seconds between keepalive probes [1, 600]." env:"OUTBOX_TCP_KEEPALIVES_INTERVAL" default:"2"`
	TCPKeepalivesCount         int     `name:"tcp-keepalives-count" help:"Unanswered probes before the lock connection is dropped [1, 100]." env:"OUTBOX_TCP_KEEPALIVES_COUNT" default:"3"`

	AutoReplay          bool `help:"Revive transient failures automatically while the engine is healthy." env:"OUTBOX_AUTO_REPLAY"`
	AutoReplayPerMinute int  `help:"Auto-replay budget, events per minute [1, 100000]." env:"OUTBOX_AUTO_REPLAY_PER_MINUTE" default:"60"`
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func (c *runCmd) consumeConfig() consume.Config {
	return consume.Config{
		BulkSize:        c.BulkSize,
		Concurrency:     c.Concurrency,
		PollInterval:    seconds(c.PollIntervalSeconds),
		Lease:           seconds(c.LeaseSeconds),
		ReclaimInterval: seconds(c.ReclaimIntervalSeconds),
		MaxProcessing:   seconds(c.MaxProcessingSeconds),
		MaxAttempts:     c.MaxAttempts,
		BaseBackoff:     seconds(c.BaseBackoffSeconds),
		MaxBackoff:      seconds(c.MaxBackoffSeconds),
		ShutdownGrace:   seconds(c.ShutdownGraceSeconds),
	}
}

// Validate runs before anything connects, so a bad flag exits at once with
// the variable's name.
func (c *runCmd) Validate() error {
	type rng struct {
		env      string
		v        float64
		min, max float64
	}
	for _, r := range []rng{
		{"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS", c.LeaderCheckIntervalSeconds, 0.05, 10},
		{"OUTBOX_LEADER_CHECK_TIMEOUT_SECONDS", c.LeaderCheckTimeoutSeconds, 0.1, 30},
		{"OUTBOX_TCP_KEEPALIVES_IDLE", float64(c.TCPKeepalivesIdle), 1, 600},
		{"OUTBOX_TCP_KEEPALIVES_INTERVAL", float64(c.TCPKeepalivesInterval), 1, 600},
		{"OUTBOX_TCP_KEEPALIVES_COUNT", float64(c.TCPKeepalivesCount), 1, 100},
		{"OUTBOX_AUTO_REPLAY_PER_MINUTE", float64(c.AutoReplayPerMinute), 1, 100000},
		{"OUTBOX_MAX_PAYLOAD_BYTES", float64(c.MaxPayloadBytes), 1, 100 << 20},
		{"OUTBOX_HTTP_PORT", float64(c.HTTPPort), 1, 65535},
		{"OUTBOX_METRICS_PORT", float64(c.MetricsPort), 0, 65535},
		{"ELASTIC_TIMEOUT_SECONDS", c.ElasticTimeout, 0.1, 600},
		{"OUTBOX_SHUTDOWN_GRACE_SECONDS", c.ShutdownGraceSeconds, 1, 600},
	} {
		if r.v < r.min || r.v > r.max {
			return fmt.Errorf("%s=%g is out of range [%g, %g]", r.env, r.v, r.min, r.max)
		}
	}
	// No defaults here: kong already applied the flag defaults, so a zero is
	// the operator's value and must be refused, not replaced.
	return c.consumeConfig().Validate()
}

func (c *runCmd) Run(g *globals) error {
	log := g.logger
	workerID := c.WorkerID
	if workerID == "" {
		host, _ := os.Hostname()
		workerID = host + "-" + strconv.Itoa(os.Getpid())
	}
	log = log.With().Str("worker_id", workerID).Logger()

	// The first signal drains; a second one forces the exit.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var draining atomic.Bool
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		log.Info().Str("signal", sig.String()).Msg("draining")
		draining.Store(true)
		_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
		cancel()
		sig = <-sigs
		log.Warn().Str("signal", sig.String()).Msg("second signal: exiting without drain")
		os.Exit(1)
	}()

	poolCfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	poolCfg.MaxConns = int32(c.Concurrency + 6)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "wlproj:" + workerID
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()

	es, err := projection.NewElasticClient(projection.ElasticOptions{
		URL: c.ElasticURL, Username: c.ElasticUsername, Password: c.ElasticPassword,
		CAFile: c.ElasticCAFile, Timeout: seconds(c.ElasticTimeout),
	})
	if err != nil {
		return fmt.Errorf("ELASTIC_URL: %w", err)
	}
	search, err := projection.NewSearch(projection.SearchConfig{Client: es, Index: c.ElasticIndex, MaxPayloadBytes: c.MaxPayloadBytes})
	if err != nil {
		return err
	}
	pingES := func(ctx context.Context) error {
		_, err := es.ClusterHealth().Do(ctx)
		return err
	}

	store := &outbox.Store{Pool: pool, Owner: workerID, LeaderName: c.LeaderName}
	loop, err := consume.NewLoop(c.consumeConfig(), store, projection.Registry{"search": search}, log)
	if err != nil {
		return err
	}
	reclaimer := consume.NewReclaimer(loop.Config(), store, log)
	var auto *replay.AutoReplayer
	if c.AutoReplay {
		auto, err = replay.NewAutoReplayer(pool, replay.AutoReplayerConfig{PerMinute: c.AutoReplayPerMinute},
			func(ctx context.Context) bool { return pingES(ctx) == nil }, log)
		if err != nil {
			return err
		}
	}

	services := func(ctx context.Context, epoch int64, drain <-chan struct{}) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); reclaimer.Run(ctx, epoch, drain) }()
		if auto != nil {
			autoCtx, stopAuto := context.WithCancel(ctx)
			defer stopAuto()
			go func() {
				select {
				case <-drain:
					stopAuto()
				case <-autoCtx.Done():
				}
			}()
			wg.Add(1)
			go func() { defer wg.Done(); auto.Run(autoCtx) }()
		}
		loop.Run(ctx, epoch, drain)
		wg.Wait()
	}
	// systemd restarts a unit that misses WATCHDOG_USEC; ping twice per window.
	watchdog, _ := daemon.SdWatchdogEnabled(false)
	tick := time.Second
	if watchdog > 0 {
		tick = min(tick, watchdog/2)
	}
	elector, err := leader.New(leader.Config{
		DatabaseURL:        c.DatabaseURL,
		Name:               c.LeaderName,
		WorkerID:           workerID,
		CheckInterval:      seconds(c.LeaderCheckIntervalSeconds),
		CheckTimeout:       seconds(c.LeaderCheckTimeoutSeconds),
		KeepalivesIdle:     time.Duration(c.TCPKeepalivesIdle) * time.Second,
		KeepalivesInterval: time.Duration(c.TCPKeepalivesInterval) * time.Second,
		KeepalivesCount:    c.TCPKeepalivesCount,
		DrainTimeout:       seconds(c.ShutdownGraceSeconds) + 10*time.Second,
		TickInterval:       tick,
	}, log, services)
	if err != nil {
		return err
	}
	if watchdog > 0 {
		elector.OnTick = func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog) }
	}

	srv, err := health.New(health.Config{
		Addr: c.HTTPAddr, HTTPPort: c.HTTPPort, MetricsPort: c.MetricsPort, RequireES: c.RequireESReady,
		MaxProcessing: seconds(c.MaxProcessingSeconds), Pprof: c.Pprof,
	}, health.Deps{Pool: pool, Elector: elector, PingES: pingES, Draining: &draining, Log: log})
	if err != nil {
		return err
	}
	srvCtx, stopSrv := context.WithCancel(context.Background())
	defer stopSrv()
	srv.Serve(srvCtx)
	defer srv.Close()
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)
	log.Info().Str("addr", c.HTTPAddr).Int("http_port", c.HTTPPort).Str("leader_name", c.LeaderName).Msg("replica started")

	err = elector.Run(ctx)
	log.Info().Msg("stopped")
	return err
}
