package replica

import (
	"cmp"
	"os"
	"strconv"
	"time"

	"github.com/wlproj/wlproj/console"
	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/health"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/replay"
	"github.com/wlproj/wlproj/verify"
)

// drainTimeoutMargin is how much longer than the consume loop's shutdown
// grace the elector waits for the leader's services to stop.
const drainTimeoutMargin = 10 * time.Second

// Config is what a replica runs with. The packages' own configs are kept
// whole, so each default and range has one home: the package's.
type Config struct {
	// DatabaseURL is the outbox database. Required.
	DatabaseURL string
	// WorkerID names this replica in the leader table, logs and
	// pg_stat_activity. Defaults to hostname-pid (WorkerIDDefault).
	WorkerID string
	// Elastic reaches the search engine.
	Elastic projection.ElasticOptions
	// Index is the index or alias the search projection writes. Defaults
	// to projection.IndexDefault.
	Index string
	// MaxPayloadBytes is the search projection's largest upsert payload.
	// Defaults to projection.MaxPayloadBytesDefault.
	MaxPayloadBytes int
	// ChronicleMaxPayloadBytes is the chronicle's largest payload. Defaults
	// to projection.ChronicleMaxPayloadBytesDefault.
	ChronicleMaxPayloadBytes int
	// Consume is the leader's claim → project → ack loop and its reclaimer.
	Consume consume.Config
	// Leader is the election; its DatabaseURL, WorkerID and DrainTimeout
	// are the replica's (DrainTimeout: Consume.ShutdownGrace + 10s).
	Leader leader.Config
	// Pruner bounds the outbox and the ledger.
	Pruner consume.PrunerConfig
	// Health is /healthz, /readyz and /metrics.
	Health health.Config
	// Console is the operator console; off unless it has a way to sign in
	// (console.Config.On).
	Console console.Config
	// AutoReplay revives transient failures while the engine is healthy.
	// Defaults to false.
	AutoReplay bool
	// AutoReplayer is the auto-replay's budget.
	AutoReplayer replay.AutoReplayerConfig
	// FailedArchiveAfter moves failed rows older than this to the dead
	// letter. Defaults to 0, off.
	FailedArchiveAfter time.Duration
	// Verify is the scheduled verify; off while its Interval is 0. It
	// verifies each search projection, against its source table when the
	// projections file names one (Verify.SourceTable for the default set).
	Verify verify.ServiceConfig
	// Projections is what the replica projects into, from the projections
	// file (LoadProjections). Defaults to DefaultSpecs: ELASTIC_* and the
	// chronicle, as before the file existed.
	Projections Specs
}

// WorkerIDDefault is Config.WorkerID's default: hostname-pid.
func WorkerIDDefault() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid())
}

func (c Config) withDefaults() Config {
	c.WorkerID = cmp.Or(c.WorkerID, WorkerIDDefault())
	c.Index = cmp.Or(c.Index, projection.IndexDefault)
	if c.Projections == nil {
		c.Projections = DefaultSpecs(c)
	}
	c.Leader.ProjectionsHash = c.Projections.Hash()
	c.Leader = c.leader()
	c.Leader.TickInterval = cmp.Or(c.Leader.TickInterval, tickInterval())
	return c
}

// leader is the election's config, with the replica's share filled in.
func (c Config) leader() leader.Config {
	l := c.Leader
	l.DatabaseURL, l.WorkerID = c.DatabaseURL, cmp.Or(c.WorkerID, "validate")
	l.DrainTimeout = cmp.Or(l.DrainTimeout, c.Consume.ShutdownGrace+drainTimeoutMargin)
	return l
}

// Validate checks the settings as given, no defaults applied (a zero is
// refused where a package does not accept it), so that a bad setting stops
// the replica before anything connects. It returns a *bounds.FieldError
// naming the Go field.
func (c Config) Validate() error {
	err := bounds.First(
		c.Consume.Validate(),
		c.leader().Validate(),
		c.Health.Validate(),
		bounds.Check("Timeout", c.Elastic.Timeout, projection.TimeoutRange),
		c.Elastic.ValidateAuth(),
		bounds.Check("MaxPayloadBytes", c.MaxPayloadBytes, projection.MaxPayloadBytesRange),
		bounds.Check("ChronicleMaxPayloadBytes", c.ChronicleMaxPayloadBytes, projection.ChronicleMaxPayloadBytesRange),
		bounds.Check("PerMinute", c.AutoReplayer.PerMinute, replay.PerMinuteRange),
		bounds.Check("Retention", c.Pruner.Retention, consume.RetentionRange),
		bounds.Check("TombstoneRetention", c.Pruner.TombstoneRetention, consume.TombstoneRetentionRange),
		bounds.NotBelow("TombstoneRetention", c.Pruner.TombstoneRetention, "Retention", c.Pruner.Retention),
	)
	if err == nil && c.Console.On() {
		err = c.Console.Validate()
	}
	if err == nil && c.FailedArchiveAfter != 0 {
		err = bounds.Check("After", c.FailedArchiveAfter, replay.ArchiveAfterRange)
	}
	if err == nil && c.Verify.Interval != 0 {
		err = c.Verify.Validate()
	}
	return err
}
