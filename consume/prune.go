package consume

import (
	"cmp"
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/serviceutil"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// Defaults of PrunerConfig. The CLI's flags take RetentionDefault and
// TombstoneRetentionDefault from here.
const (
	RetentionDefault          = 7 * 24 * time.Hour
	TombstoneRetentionDefault = 90 * 24 * time.Hour
	pruneIntervalDefault      = 10 * time.Second
	pruneBatchDefault         = 1000
	prunePauseDefault         = 50 * time.Millisecond
	pruneMaxBatchesPerRun     = 1000
)

// RetentionRange and TombstoneRetentionRange are what PrunerConfig.Retention
// and PrunerConfig.TombstoneRetention accept.
var (
	RetentionRange          = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}
	TombstoneRetentionRange = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}
)

// PrunerConfig configures the Pruner.
type PrunerConfig struct {
	// Retention is how long done rows are kept after their ack, and how long
	// a live document's ledger entry outlives its last applied event.
	// Defaults to 168h.
	Retention time.Duration
	// TombstoneRetention is how long a deleted document's ledger entry
	// outlives its delete: the window in which an older upsert written
	// after the delete is still refused. Never below Retention. Defaults to
	// 2160h (90 days).
	TombstoneRetention time.Duration
	// Interval is the pause between two rounds. Defaults to 10s.
	Interval time.Duration
	// Batch is the most rows one statement deletes, so no statement holds
	// many locks or runs long next to the claim. Defaults to 1000.
	Batch int
	// Pause is the rest between two batches of a round. Defaults to 50ms.
	Pause time.Duration
}

func (c PrunerConfig) withDefaults() PrunerConfig {
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.TombstoneRetention = cmp.Or(c.TombstoneRetention, TombstoneRetentionDefault)
	c.Interval = cmp.Or(c.Interval, pruneIntervalDefault)
	c.Batch = cmp.Or(c.Batch, pruneBatchDefault)
	c.Pause = cmp.Or(c.Pause, prunePauseDefault)
	return c
}

// Validate returns a *bounds.FieldError for the first bad field.
func (c PrunerConfig) Validate() error {
	return bounds.First(
		bounds.Check("Retention", c.Retention, RetentionRange),
		bounds.Check("TombstoneRetention", c.TombstoneRetention, TombstoneRetentionRange),
		bounds.NotBelow("TombstoneRetention", c.TombstoneRetention, "Retention", c.Retention),
		bounds.Check("Batch", c.Batch, bounds.Range[int]{Min: 1, Max: 100000}),
	)
}

// Pruner is the leader's service that keeps the outbox bounded: it deletes
// done rows older than the retention, and rotates the ledger, whose entries
// live at least the retention (deleted documents' the tombstone retention,
// and any entry as long as an event of its document could still be sent:
// see outbox.RotateLedger).
type Pruner struct {
	leader.Periodic
	cfg   PrunerConfig
	store *outbox.Store
	log   zerolog.Logger
}

// NewPruner validates cfg (after defaults) and builds the service.
func NewPruner(cfg PrunerConfig, store *outbox.Store, log zerolog.Logger) (*Pruner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pruner{cfg: cfg, store: store, log: log.With().Str("service", "prune").Logger()}
	p.Periodic = leader.Periodic{ServiceName: "prune", Interval: cfg.Interval, Log: log,
		Once: func(ctx context.Context, epoch int64) error { _, err := p.runOnce(ctx, epoch); return err }}
	return p, nil
}

// PruneResult is what one round did: the done rows it deleted, and the
// ledger's rotation.
type PruneResult struct {
	Done   int
	Ledger outbox.LedgerRotation
}

// runOnce deletes done rows in batches until one comes back short, then
// rotates the ledger when its current partition is due.
func (p *Pruner) runOnce(ctx context.Context, epoch int64) (PruneResult, error) {
	var res PruneResult
	var err error
	res.Done, err = p.batches(ctx, func(ctx context.Context) (int, error) {
		byProjection, err := p.store.PruneDone(ctx, p.cfg.Retention, p.cfg.Batch)
		n := 0
		for projection, count := range byProjection {
			prunedTotal(projection).Add(count)
			n += count
		}
		return n, err
	})
	if err == nil {
		res.Ledger, err = p.store.RotateLedger(ctx, epoch, p.cfg.Retention, p.cfg.TombstoneRetention, p.cfg.Batch)
	}
	ledgerCarriedTotal.Add(int(res.Ledger.Carried))
	if res.Ledger.Rotated {
		ledgerRotationsTotal.Inc()
	}
	if res.Done > 0 || res.Ledger.Rotated {
		p.log.Info().Int("done", res.Done).Bool("ledger_rotated", res.Ledger.Rotated).Int("ledger_slot", res.Ledger.Slot).
			Int64("ledger_carried", res.Ledger.Carried).Dur("retention", p.cfg.Retention).
			Dur("tombstone_retention", p.cfg.TombstoneRetention).Msg("pruned")
	}
	return res, err
}

// batches calls prune until a batch comes back short, resting between two,
// and returns how many rows it deleted.
func (p *Pruner) batches(ctx context.Context, prune func(context.Context) (int, error)) (int, error) {
	total := 0
	for range pruneMaxBatchesPerRun {
		n, err := prune(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < p.cfg.Batch || serviceutil.Sleep(ctx, p.cfg.Pause) != nil {
			break
		}
	}
	return total, nil
}
