package consume

import (
	"cmp"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// Defaults of Config. The CLI's flags take their defaults from here.
const (
	PollIntervalDefault    = time.Second
	LeaseDefault           = 60 * time.Second
	ReclaimIntervalDefault = 5 * time.Second
	MaxAttemptsDefault     = 10
	BaseBackoffDefault     = time.Second
	MaxBackoffDefault      = 300 * time.Second
	ShutdownGraceDefault   = 20 * time.Second
	ClaimCooldownDefault   = 50 * time.Millisecond
	UnknownWaitDefault     = 10 * time.Minute
)

// Accepted ranges of Config.
var (
	MaxAttemptsRange     = bounds.Range[int]{Min: 1, Max: 1000}
	PollIntervalRange    = bounds.Range[time.Duration]{Min: 10 * time.Millisecond, Max: 5 * time.Minute}
	LeaseRange           = bounds.Range[time.Duration]{Min: time.Second, Max: time.Hour}
	ReclaimIntervalRange = bounds.Range[time.Duration]{Min: 100 * time.Millisecond, Max: time.Hour}
	BaseBackoffRange     = bounds.Range[time.Duration]{Min: 10 * time.Millisecond, Max: time.Hour}
	MaxBackoffRange      = bounds.Range[time.Duration]{Min: 10 * time.Millisecond, Max: 24 * time.Hour}
	ShutdownGraceRange   = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * time.Minute}
	ClaimCooldownRange   = bounds.Range[time.Duration]{Min: time.Millisecond, Max: time.Second}
	UnknownWaitRange     = bounds.Range[time.Duration]{Min: time.Millisecond, Max: 24 * time.Hour}
)

// Config tunes the loop and the reclaimer. Zero fields take their defaults;
// Validate rejects values outside the accepted ranges, naming the field.
type Config struct {
	// BulkSize is how many events one claim takes and one bulk request
	// carries. Defaults to 500.
	BulkSize int
	// Concurrency is how many bulk requests may be in flight at once.
	// Defaults to 2.
	Concurrency int
	// PollInterval is the fallback wake-up when no NOTIFY arrives.
	// Defaults to 1s.
	PollInterval time.Duration
	// Lease is how long a claim stays valid before the reclaimer may take
	// the row back. Defaults to 60s: above the engine's 30s request
	// timeout, so a slow bulk is not resent in flight.
	Lease time.Duration
	// ReclaimInterval is how often the reclaimer runs. Defaults to 5s.
	ReclaimInterval time.Duration
	// MaxProcessing caps time in processing whatever the lease says.
	// Defaults to 300s.
	MaxProcessing time.Duration
	// MaxAttempts is the attempt after which a transient failure becomes
	// terminal. Defaults to 10.
	MaxAttempts int
	// BaseBackoff is the first retry delay. Defaults to 1s.
	BaseBackoff time.Duration
	// MaxBackoff caps the retry delay. Defaults to 300s.
	MaxBackoff time.Duration
	// ShutdownGrace is how long a drain lets in-flight bulks finish.
	// Defaults to 20s.
	ShutdownGrace time.Duration
	// ClaimCooldown is how long the leader waits after a claim that found
	// less than a full batch before it claims again: under a steady
	// trickle every insert's NOTIFY would otherwise cost a claim, an ack
	// and a bulk for one or two events. Defaults to 50ms: in the sustained
	// bench it cost the database 36-55 µs per event at 2,000/s against
	// 60-87 µs with 10ms, and 70-88 against 136-289 at 500/s, for a lag p99
	// of 57-82 ms (10ms: 15-138 ms, and less flat).
	ClaimCooldown time.Duration
	// UnknownWait is how long a queued event naming a projection this
	// replica does not know waits, unread, before it fails as
	// unknown_projection: during a rolling restart that adds a projection
	// to the projections file, the leader still on the old file passes
	// over its events, and the replica that knows it drains them once it
	// leads. Defaults to 10m.
	UnknownWait time.Duration
	// Masks hide each projection's masked payload fields (package mask)
	// in the error text the loop stores (last_error, error_history), logs
	// and traces, by projection name. Defaults to none.
	Masks map[string]*mask.Mask
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	c.BulkSize = cmp.Or(c.BulkSize, projection.BulkSizeDefault)
	c.Concurrency = cmp.Or(c.Concurrency, projection.ConcurrencyDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.ReclaimInterval = cmp.Or(c.ReclaimInterval, ReclaimIntervalDefault)
	c.MaxProcessing = cmp.Or(c.MaxProcessing, outbox.MaxProcessingDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.BaseBackoff = cmp.Or(c.BaseBackoff, BaseBackoffDefault)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, MaxBackoffDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.ClaimCooldown = cmp.Or(c.ClaimCooldown, ClaimCooldownDefault)
	c.UnknownWait = cmp.Or(c.UnknownWait, UnknownWaitDefault)
	return c
}

// Validate checks every setting against its accepted range and returns a
// *bounds.FieldError for the first that is not.
func (c Config) Validate() error {
	return bounds.First(
		bounds.Check("BulkSize", c.BulkSize, projection.BulkSizeRange),
		bounds.Check("Concurrency", c.Concurrency, projection.ConcurrencyRange),
		bounds.Check("MaxAttempts", c.MaxAttempts, MaxAttemptsRange),
		bounds.Check("PollInterval", c.PollInterval, PollIntervalRange),
		bounds.Check("Lease", c.Lease, LeaseRange),
		bounds.Check("ReclaimInterval", c.ReclaimInterval, ReclaimIntervalRange),
		bounds.Check("MaxProcessing", c.MaxProcessing, outbox.MaxProcessingRange),
		bounds.Check("BaseBackoff", c.BaseBackoff, BaseBackoffRange),
		bounds.Check("MaxBackoff", c.MaxBackoff, MaxBackoffRange),
		bounds.Check("ShutdownGrace", c.ShutdownGrace, ShutdownGraceRange),
		bounds.Check("ClaimCooldown", c.ClaimCooldown, ClaimCooldownRange),
		bounds.Check("UnknownWait", c.UnknownWait, UnknownWaitRange),
		bounds.NotBelow("MaxBackoff", c.MaxBackoff, "BaseBackoff", c.BaseBackoff),
	)
}
