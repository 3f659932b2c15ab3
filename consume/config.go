package consume

import (
	"cmp"
	"fmt"
	"time"
)

const (
	bulkSizeDefault        = 500
	concurrencyDefault     = 2
	pollIntervalDefault    = time.Second
	leaseDefault           = 60 * time.Second
	reclaimIntervalDefault = 5 * time.Second
	maxProcessingDefault   = 300 * time.Second
	maxAttemptsDefault     = 10
	baseBackoffDefault     = time.Second
	maxBackoffDefault      = 300 * time.Second
	shutdownGraceDefault   = 20 * time.Second
)

// Config tunes the loop and the reclaimer. Zero fields take their defaults;
// Validate rejects values outside the safe ranges, naming the env var.
type Config struct {
	// BulkSize is how many events one claim takes and one bulk request
	// carries (OUTBOX_BULK_SIZE). Defaults to 500.
	BulkSize int
	// Concurrency is how many bulk requests may be in flight at once
	// (OUTBOX_CONCURRENCY). Defaults to 2.
	Concurrency int
	// PollInterval is the fallback wake-up when no NOTIFY arrives
	// (OUTBOX_POLL_INTERVAL_SECONDS). Defaults to 1s.
	PollInterval time.Duration
	// Lease is how long a claim stays valid before the reclaimer may take
	// the row back (OUTBOX_LEASE_SECONDS). Defaults to 60s: above the
	// engine's 30s request timeout, so a slow bulk is not resent in flight.
	Lease time.Duration
	// ReclaimInterval is how often the reclaimer runs
	// (OUTBOX_RECLAIM_INTERVAL_SECONDS). Defaults to 5s.
	ReclaimInterval time.Duration
	// MaxProcessing caps time in processing whatever the lease says
	// (OUTBOX_MAX_PROCESSING_SECONDS). Defaults to 300s.
	MaxProcessing time.Duration
	// MaxAttempts is the attempt after which a transient failure becomes
	// terminal (OUTBOX_MAX_ATTEMPTS). Defaults to 10.
	MaxAttempts int
	// BaseBackoff is the first retry delay (OUTBOX_BASE_BACKOFF_SECONDS). Defaults to 1s.
	BaseBackoff time.Duration
	// MaxBackoff caps the retry delay (OUTBOX_MAX_BACKOFF_SECONDS). Defaults to 300s.
	MaxBackoff time.Duration
	// ShutdownGrace is how long a drain lets in-flight bulks finish
	// (OUTBOX_SHUTDOWN_GRACE_SECONDS). Defaults to 20s.
	ShutdownGrace time.Duration
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	c.BulkSize = cmp.Or(c.BulkSize, bulkSizeDefault)
	c.Concurrency = cmp.Or(c.Concurrency, concurrencyDefault)
	c.PollInterval = cmp.Or(c.PollInterval, pollIntervalDefault)
	c.Lease = cmp.Or(c.Lease, leaseDefault)
	c.ReclaimInterval = cmp.Or(c.ReclaimInterval, reclaimIntervalDefault)
	c.MaxProcessing = cmp.Or(c.MaxProcessing, maxProcessingDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, maxAttemptsDefault)
	c.BaseBackoff = cmp.Or(c.BaseBackoff, baseBackoffDefault)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, maxBackoffDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, shutdownGraceDefault)
	return c
}

type intRange struct {
	env      string
	v        int
	min, max int
}

type durRange struct {
	env      string
	v        time.Duration
	min, max time.Duration
}

// Validate checks every setting against its safe range.
func (c Config) Validate() error {
	for _, r := range []intRange{
		{"OUTBOX_BULK_SIZE", c.BulkSize, 1, 10000},
		{"OUTBOX_CONCURRENCY", c.Concurrency, 1, 64},
		{"OUTBOX_MAX_ATTEMPTS", c.MaxAttempts, 1, 1000},
	} {
		if r.v < r.min || r.v > r.max {
			return fmt.Errorf("%s=%d is out of range [%d, %d]", r.env, r.v, r.min, r.max)
		}
	}
	for _, r := range []durRange{
		{"OUTBOX_POLL_INTERVAL_SECONDS", c.PollInterval, 10 * time.Millisecond, 5 * time.Minute},
		{"OUTBOX_LEASE_SECONDS", c.Lease, time.Second, time.Hour},
		{"OUTBOX_RECLAIM_INTERVAL_SECONDS", c.ReclaimInterval, 100 * time.Millisecond, time.Hour},
		{"OUTBOX_MAX_PROCESSING_SECONDS", c.MaxProcessing, time.Second, 24 * time.Hour},
		{"OUTBOX_BASE_BACKOFF_SECONDS", c.BaseBackoff, 10 * time.Millisecond, time.Hour},
		{"OUTBOX_MAX_BACKOFF_SECONDS", c.MaxBackoff, 10 * time.Millisecond, 24 * time.Hour},
		{"OUTBOX_SHUTDOWN_GRACE_SECONDS", c.ShutdownGrace, time.Second, 10 * time.Minute},
	} {
		if r.v < r.min || r.v > r.max {
			return fmt.Errorf("%s=%g is out of range [%g, %g]", r.env, r.v.Seconds(), r.min.Seconds(), r.max.Seconds())
		}
	}
	if c.MaxBackoff < c.BaseBackoff {
		return fmt.Errorf("OUTBOX_MAX_BACKOFF_SECONDS=%g must not be below OUTBOX_BASE_BACKOFF_SECONDS=%g",
			c.MaxBackoff.Seconds(), c.BaseBackoff.Seconds())
	}
	return nil
}
