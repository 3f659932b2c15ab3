package cli

import (
	"cmp"
	"context"
	"errors"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/health"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/policy"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/replica"
	"github.com/wlproj/wlproj/verify"
)

type runCmd struct {
	dbFlags
	elasticFlags
	projectionsFlags
	ElasticIndex string `help:"Index the search projection writes to; ignored with a projections file, whose search projections name their own." env:"ELASTIC_INDEX" default:"${elastic_index}" field:"Index"`

	WorkerID       string `help:"Name of this replica (default: hostname-pid)." env:"OUTBOX_WORKER_ID" field:"WorkerID"`
	LeaderName     string `help:"Replicas with the same leader name compete for one lock." env:"OUTBOX_LEADER_NAME" default:"${leader_name}"`
	HTTPAddr       string `name:"http-addr" help:"Bind address of the health and metrics endpoints." env:"OUTBOX_HTTP_ADDR" default:"${http_addr}"`
	HTTPPort       int    `name:"http-port" help:"Port of /healthz and /readyz [${port_range}]." env:"OUTBOX_HTTP_PORT" default:"${http_port}" field:"HTTPPort"`
	MetricsPort    int    `help:"Port of /metrics; 0 or the HTTP port serves it on the same listener." env:"OUTBOX_METRICS_PORT" default:"0" field:"MetricsPort"`
	RequireESReady bool   `name:"require-es-ready" help:"Make /readyz fail while the engine is unreachable." env:"OUTBOX_REQUIRE_ES_READY"`
	Pprof          bool   `help:"Serve Go's /debug/pprof/ on the metrics port, for profiling." env:"OUTBOX_PPROF"`

	BulkSize               int     `help:"Events per claim and per bulk request [${bulk_size_range}]." env:"OUTBOX_BULK_SIZE" default:"${bulk_size}" field:"BulkSize"`
	Concurrency            int     `help:"Bulk requests in flight at once [${concurrency_range}]." env:"OUTBOX_CONCURRENCY" default:"${concurrency}" field:"Concurrency"`
	PollIntervalSeconds    float64 `help:"Fallback poll when no NOTIFY arrives, and how often a claim starts from the head of the outbox rather than past the last row claimed [${poll_interval_range}]." env:"OUTBOX_POLL_INTERVAL_SECONDS" default:"${poll_interval}" field:"PollInterval"`
	LeaseSeconds           float64 `help:"Claim lease [${lease_range}]." env:"OUTBOX_LEASE_SECONDS" default:"${lease}" field:"Lease"`
	ReclaimIntervalSeconds float64 `help:"How often stuck rows are reclaimed [${reclaim_interval_range}]." env:"OUTBOX_RECLAIM_INTERVAL_SECONDS" default:"${reclaim_interval}" field:"ReclaimInterval"`
	MaxProcessingSeconds   float64 `help:"Time in processing after which a row is stuck whatever its lease [${max_processing_range}]." env:"OUTBOX_MAX_PROCESSING_SECONDS" default:"${max_processing}" field:"MaxProcessing"`
	MaxAttempts            int     `help:"Attempts before a transient failure becomes terminal [${max_attempts_range}]." env:"OUTBOX_MAX_ATTEMPTS" default:"${max_attempts}" field:"MaxAttempts"`
	BaseBackoffSeconds     float64 `help:"First retry delay [${base_backoff_range}]." env:"OUTBOX_BASE_BACKOFF_SECONDS" default:"${base_backoff}" field:"BaseBackoff"`
	MaxBackoffSeconds      float64 `help:"Retry delay cap [${max_backoff_range}]." env:"OUTBOX_MAX_BACKOFF_SECONDS" default:"${max_backoff}" field:"MaxBackoff"`
	ShutdownGraceSeconds   float64 `help:"How long SIGTERM lets in-flight bulks finish [${shutdown_grace_range}]." env:"OUTBOX_SHUTDOWN_GRACE_SECONDS" default:"${shutdown_grace}" field:"ShutdownGrace"`
	ClaimCooldownSeconds   float64 `help:"Wait after a claim that found less than a full batch, so the next one takes what arrived meanwhile [${claim_cooldown_range}]." env:"OUTBOX_CLAIM_COOLDOWN_SECONDS" default:"${claim_cooldown}" field:"ClaimCooldown"`
	MaxPayloadBytes        int     `help:"Largest upsert payload accepted; larger ones fail as payload_invalid [${max_payload_bytes_range}]." env:"OUTBOX_MAX_PAYLOAD_BYTES" default:"${max_payload_bytes}" field:"MaxPayloadBytes"`

	ChronicleMaxPayloadBytes int `help:"Largest payload the chronicle projection appends; larger ones fail as payload_invalid [${chronicle_max_payload_bytes_range}]." env:"OUTBOX_CHRONICLE_MAX_PAYLOAD_BYTES" default:"${chronicle_max_payload_bytes}" field:"ChronicleMaxPayloadBytes"`

	LeaderCheckIntervalSeconds float64 `help:"How often the leader verifies its lock connection [${check_interval_range}]." env:"OUTBOX_LEADER_CHECK_INTERVAL_SECONDS" default:"${check_interval}" field:"CheckInterval"`
	LeaderCheckTimeoutSeconds  float64 `help:"Timeout of one lock check [${check_timeout_range}]." env:"OUTBOX_LEADER_CHECK_TIMEOUT_SECONDS" default:"${check_timeout}" field:"CheckTimeout"`
	TCPKeepalivesIdle          int     `name:"tcp-keepalives-idle" help:"Seconds of silence before the lock connection sends keepalives [${keepalives_idle_range}]." env:"OUTBOX_TCP_KEEPALIVES_IDLE" default:"${keepalives_idle}" field:"KeepalivesIdle"`
	TCPKeepalivesInterval      int     `name:"tcp-keepalives-interval" help:"Seconds between keepalive probes [${keepalives_interval_range}]." env:"OUTBOX_TCP_KEEPALIVES_INTERVAL" default:"${keepalives_interval}" field:"KeepalivesInterval"`
	TCPKeepalivesCount         int     `name:"tcp-keepalives-count" help:"Unanswered probes before the lock connection is dropped [${keepalives_count_range}]." env:"OUTBOX_TCP_KEEPALIVES_COUNT" default:"${keepalives_count}" field:"KeepalivesCount"`

	UnknownProjectionWait    time.Duration `help:"How long a queued event naming a projection this replica does not know waits, unread, for a leader that knows it (a rolling restart adding one to the projections file) before it fails as unknown_projection [${unknown_wait_range}]." env:"OUTBOX_UNKNOWN_PROJECTION_WAIT" default:"${unknown_wait}" field:"UnknownWait"`
	Retention                time.Duration `help:"How long an event's row is kept at least: the leader rotates the outbox's three partitions every half of this and empties the oldest whole, by TRUNCATE, once its rows are older than this and passed by every projection (rows still needed move on first), so a row lives up to one and a half times this; the ledger's partitions rotate likewise, its live documents' entries going once no event of theirs is left [${retention_range}]." env:"OUTBOX_RETENTION" default:"${retention}" field:"Retention"`
	LedgerTombstoneRetention time.Duration `help:"Deleted documents' ledger entries are kept this long after the delete, so an older upsert written later is refused; never below OUTBOX_RETENTION [${tombstone_retention_range}]." env:"OUTBOX_LEDGER_TOMBSTONE_RETENTION" default:"${tombstone_retention}" field:"TombstoneRetention"`

	FailedArchiveAfter time.Duration `help:"Off (0) by default; else the leader moves failed and discarded rows that failed longer ago than this to the dead letter, audited as auto-archive [${archive_after_range}]." env:"OUTBOX_FAILED_ARCHIVE_AFTER" default:"0s" field:"After"`

	VerifyInterval   time.Duration `help:"Off (0) by default; else the leader verifies the index this often, as wlproj verify does, rate-capped, with metrics and the console's overview [${verify_interval_range}]." env:"OUTBOX_VERIFY_INTERVAL" default:"0s" field:"Interval"`
	VerifyFromTable  string        `help:"The source-of-truth table the scheduled verify compares the index with; empty: the applied-version ledger alone. The runtime role needs SELECT on it." env:"OUTBOX_VERIFY_FROM_TABLE"`
	VerifyRate       int           `help:"Documents the scheduled verify reads per second at most [${verify_rate_range}]." env:"OUTBOX_VERIFY_RATE" default:"${verify_rate}" field:"Rate"`
	VerifyAutoRepair bool          `help:"The scheduled verify deletes the resurrected documents it finds (the ledger says deleted), audited as verify-auto; the other kinds wait for an operator." env:"OUTBOX_VERIFY_AUTO_REPAIR"`

	AutoReplay          bool `help:"Revive transient failures automatically while the engine is healthy." env:"OUTBOX_AUTO_REPLAY"`
	AutoReplayPerMinute int  `help:"Auto-replay budget, events per minute [${auto_replay_per_minute_range}]." env:"OUTBOX_AUTO_REPLAY_PER_MINUTE" default:"${auto_replay_per_minute}" field:"PerMinute"`

	consoleFlags

	// loaded is the projections file's set, read by Validate.
	loaded replica.Specs
}

// config is the replica's Config from the flags, kong's defaults applied.
func (c *runCmd) config() replica.Config {
	maxProcessing := seconds(c.MaxProcessingSeconds)
	return replica.Config{
		DatabaseURL: c.DatabaseURL, WorkerID: c.WorkerID, Elastic: c.options(), Index: c.ElasticIndex,
		MaxPayloadBytes: c.MaxPayloadBytes, ChronicleMaxPayloadBytes: c.ChronicleMaxPayloadBytes,
		Consume: consume.Config{
			BulkSize: c.BulkSize, Concurrency: c.Concurrency, PollInterval: seconds(c.PollIntervalSeconds),
			Lease: seconds(c.LeaseSeconds), ReclaimInterval: seconds(c.ReclaimIntervalSeconds), MaxProcessing: maxProcessing,
			MaxAttempts: c.MaxAttempts, BaseBackoff: seconds(c.BaseBackoffSeconds), MaxBackoff: seconds(c.MaxBackoffSeconds),
			ShutdownGrace: seconds(c.ShutdownGraceSeconds), ClaimCooldown: seconds(c.ClaimCooldownSeconds),
			UnknownWait: c.UnknownProjectionWait,
		},
		Leader: leader.Config{
			Name: c.LeaderName, CheckInterval: seconds(c.LeaderCheckIntervalSeconds), CheckTimeout: seconds(c.LeaderCheckTimeoutSeconds),
			KeepalivesIdle: time.Duration(c.TCPKeepalivesIdle) * time.Second, KeepalivesCount: c.TCPKeepalivesCount,
			KeepalivesInterval: time.Duration(c.TCPKeepalivesInterval) * time.Second,
		},
		Pruner: consume.PrunerConfig{Retention: c.Retention, TombstoneRetention: c.LedgerTombstoneRetention},
		Health: health.Config{Addr: c.HTTPAddr, HTTPPort: c.HTTPPort, MetricsPort: c.MetricsPort, RequireES: c.RequireESReady,
			MaxProcessing: maxProcessing, Pprof: c.Pprof},
		Console:            c.consoleFlags.config(c.HTTPPort, maxProcessing),
		AutoReplay:         c.AutoReplay,
		AutoReplayer:       replay.AutoReplayerConfig{PerMinute: c.AutoReplayPerMinute},
		FailedArchiveAfter: c.FailedArchiveAfter,
		Verify: verify.ServiceConfig{Interval: c.VerifyInterval, Index: c.ElasticIndex, SourceTable: c.VerifyFromTable,
			Rate: c.VerifyRate, AutoRepair: c.VerifyAutoRepair},
		Projections: c.loaded,
	}
}

// Validate runs before anything connects, so a bad flag exits at once with
// the variable's name. No defaults are applied here: kong already applied
// the flag defaults, so a zero is the operator's value and must be refused.
// The database URL goes first: the other checks parse it and may quote it.
// The projections file is read here too, so that a bad one stops the
// replica before anything runs, naming the file, the projection and the key.
func (c *runCmd) Validate(kctx *kong.Context) error {
	if err := c.dbFlags.Validate(kctx); err != nil {
		return err
	}
	var err error
	if c.loaded, err = c.specs(); err != nil {
		return usagef("%s", err)
	}
	return renameFields(c, bounds.First(c.config().Validate(), c.consoleFlags.validate()))
}

func (c *runCmd) Run(g *globals) error {
	cfg := c.config()
	cfg.WorkerID = cmp.Or(cfg.WorkerID, replica.WorkerIDDefault())
	log := g.logger.With().Str("worker_id", cfg.WorkerID).Logger()
	gcPercent := setGCPercent()
	// The first line says which build runs, as `wlproj version --json` does.
	log.Info().Interface("build", buildinfo.Get()).Int("gc_percent", gcPercent).Msg("starting")
	stopTracing, err := startTracing(log)
	if err != nil {
		return err
	}
	defer stopTracing()
	ctx, cancel := drainOnSignal(log)
	defer cancel()
	r, err := replica.New(ctx, cfg, log)
	var bad *replica.ProjectionsError
	if errors.As(err, &bad) {
		return badFile(err) // a table the file names, checked at start
	}
	if err != nil {
		return renameFields(c, err)
	}
	r.Run(ctx)
	log.Info().Msg("stopped")
	return nil
}

// GCPercentDefault is the daemon's GOGC unless the environment sets one.
// Its live heap is the batches in flight, small and short-lived, so Go's
// default (100) collects every few megabytes. In a bulk drain of 300,000
// events of 1 KB (bench step 2) 400 took the leader from 15-17 to 11-12 µs
// of CPU per event, for a peak RSS of 67 MB instead of 41.
const GCPercentDefault = 400

// setGCPercent applies GCPercentDefault when GOGC is unset and returns the
// percent in effect.
func setGCPercent() int {
	if v, ok := os.LookupEnv("GOGC"); ok {
		if v == "off" {
			return -1
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 100 // the runtime ignores a malformed GOGC
		}
		return n
	}
	debug.SetGCPercent(GCPercentDefault)
	return GCPercentDefault
}

// drainOnSignal returns a context that the first SIGTERM or SIGINT cancels
// (a graceful drain); a second signal exits at once.
func drainOnSignal(log zerolog.Logger) (context.Context, context.CancelFunc) {
	// The daemon's own audited work (the auto-replay, the auto-archive, a
	// scheduled repair) is the scheduled actor's; a console request carries
	// its person's instead.
	ctx, cancel := context.WithCancel(policy.With(context.Background(), policy.Scheduled("")))
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		log.Info().Str("signal", sig.String()).Msg("draining")
		cancel()
		sig = <-sigs
		log.Warn().Str("signal", sig.String()).Msg("second signal: exiting without drain")
		os.Exit(1)
	}()
	return ctx, cancel
}
