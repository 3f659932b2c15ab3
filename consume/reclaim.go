package consume

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// Reclaimer returns stuck rows to pending: lease expired, processing longer
// than MaxProcessing, or claimed under an earlier epoch. It runs once as
// soon as a replica becomes leader, so rows the previous leader died with are
// picked up at once rather than after their lease.
type Reclaimer struct {
	leader.Periodic
	cfg   Config
	store *outbox.Store
	log   zerolog.Logger
}

// NewReclaimer builds the reclaimer service; cfg should be the loop's
// effective config.
func NewReclaimer(cfg Config, store *outbox.Store, log zerolog.Logger) *Reclaimer {
	cfg = cfg.WithDefaults()
	r := &Reclaimer{cfg: cfg, store: store, log: log.With().Str("service", "reclaim").Logger()}
	r.Periodic = leader.Periodic{ServiceName: "reclaim", Interval: cfg.ReclaimInterval, Log: log,
		Once: func(ctx context.Context, epoch int64) error { _, err := r.runOnce(ctx, epoch); return err }}
	return r
}

func (r *Reclaimer) runOnce(ctx context.Context, epoch int64) (outbox.ReclaimResult, error) {
	res, err := r.store.Reclaim(ctx, epoch, r.cfg.MaxProcessing, r.cfg.MaxAttempts)
	if err != nil {
		countError(ctx, reclaimErrorsTotal, err)
		return res, err
	}
	n := len(res.Pending) + len(res.Failed)
	if n == 0 {
		return res, nil
	}
	reclaimedTotal.Add(n)
	for _, row := range res.Failed {
		terminalFailedTotal(row.Projection, classify.Stuck).Inc()
	}
	r.log.Warn().Int64("epoch", epoch).Int("to_pending", len(res.Pending)).Int("to_failed", len(res.Failed)).
		Msg("reclaimed stuck events")
	return res, nil
}
