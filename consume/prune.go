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

// Defaults of PrunerConfig. The CLI's flag takes RetentionDefault from here.
const (
	RetentionDefault      = 7 * 24 * time.Hour
	pruneIntervalDefault  = 10 * time.Second
	pruneBatchDefault     = 1000
	prunePauseDefault     = 50 * time.Millisecond
	pruneMaxBatchesPerRun = 1000
)

// RetentionRange is what PrunerConfig.Retention accepts.
var RetentionRange = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}

// PrunerConfig configures the Pruner.
type PrunerConfig struct {
	// Retention is how long done rows are kept after their ack, and how long
	// a deleted document's ledger entry outlives its delete. Defaults to 168h.
	Retention time.Duration
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
	c.Interval = cmp.Or(c.Interval, pruneIntervalDefault)
	c.Batch = cmp.Or(c.Batch, pruneBatchDefault)
	c.Pause = cmp.Or(c.Pause, prunePauseDefault)
	return c
}

// Validate returns a *bounds.FieldError for the first bad field.
func (c PrunerConfig) Validate() error {
	return bounds.First(
		bounds.Check("Retention", c.Retention, RetentionRange),
		bounds.Check("Batch", c.Batch, bounds.Range[int]{Min: 1, Max: 100000}),
	)
}

// Pruner is the leader's service that keeps the outbox bounded: it deletes
// done rows older than the retention, and the ledger entries of documents
// deleted longer ago than that (see outbox.PruneLedger for why that is safe).
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
		Once: func(ctx context.Context, _ int64) error { _, err := p.runOnce(ctx); return err }}
	return p, nil
}

// PruneResult is what one round deleted.
type PruneResult struct {
	Done, Ledger int
}

// runOnce deletes batches until one comes back short, resting between them.
func (p *Pruner) runOnce(ctx context.Context) (PruneResult, error) {
	var res PruneResult
	for range pruneMaxBatchesPerRun {
		byProjection, err := p.store.PruneDone(ctx, p.cfg.Retention, p.cfg.Batch)
		if err != nil {
			return res, err
		}
		n := 0
		for projection, count := range byProjection {
			prunedTotal(projection).Add(count)
			n += count
		}
		res.Done += n
		if n < p.cfg.Batch || serviceutil.Sleep(ctx, p.cfg.Pause) != nil {
			break
		}
	}
	for range pruneMaxBatchesPerRun {
		n, err := p.store.PruneLedger(ctx, p.cfg.Retention, p.cfg.Batch)
		if err != nil {
			return res, err
		}
		ledgerPrunedTotal.Add(n)
		res.Ledger += n
		if n < p.cfg.Batch || serviceutil.Sleep(ctx, p.cfg.Pause) != nil {
			break
		}
	}
	if res.Done+res.Ledger > 0 {
		p.log.Info().Int("done", res.Done).Int("ledger", res.Ledger).Dur("retention", p.cfg.Retention).Msg("pruned")
	}
	return res, nil
}
