package consume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
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
)

// RetentionRange and TombstoneRetentionRange are what PrunerConfig.Retention
// and PrunerConfig.TombstoneRetention accept.
var (
	RetentionRange          = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}
	TombstoneRetentionRange = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}
)

// PrunerConfig configures the Pruner.
type PrunerConfig struct {
	// Retention is how long an event's row is kept at least (done rows
	// after their ack, queued ones after their insert; the outbox's
	// partitions rotate every half of it, so rows live up to 1.5 times it),
	// and how long a live document's ledger entry outlives its last applied
	// event. Defaults to 168h.
	Retention time.Duration
	// TombstoneRetention is how long a deleted document's ledger entry
	// outlives its delete: the window in which an older upsert written
	// after the delete is still refused. Never below Retention. Defaults to
	// 2160h (90 days).
	TombstoneRetention time.Duration
	// Interval is the pause between two rounds. Defaults to 10s.
	Interval time.Duration
	// Batch is the most rows one statement of a rotation's carry moves, so
	// no statement holds many locks or runs long next to the claim.
	// Defaults to 1000.
	Batch int
}

func (c PrunerConfig) withDefaults() PrunerConfig {
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.TombstoneRetention = cmp.Or(c.TombstoneRetention, TombstoneRetentionDefault)
	c.Interval = cmp.Or(c.Interval, pruneIntervalDefault)
	c.Batch = cmp.Or(c.Batch, pruneBatchDefault)
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

// Pruner is the leader's service that keeps the outbox bounded: it rotates
// the outbox's partitions (see outbox.RotateEvents), and the ledger's, whose entries
// live at least the retention (deleted documents' the tombstone retention,
// and any entry as long as an event of its document could still be sent:
// see outbox.RotateLedger).
type Pruner struct {
	leader.Periodic
	cfg   PrunerConfig
	store *outbox.Store
	log   zerolog.Logger
	held  string // what held the outbox's last due rotation, if anything
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

// PruneResult is what one round did: the outbox's rotation and the
// ledger's.
type PruneResult struct {
	Events outbox.EventsRotation
	Ledger outbox.LedgerRotation
}

// runOnce rotates the outbox, then the ledger, each when its current
// partition is due, and drops the activity counts past the retention. The
// three are independent: one that fails (a grant missing, a lock never
// free) holds neither of the others, and each rotation's outcome goes to
// the rotation metrics (recordOutcome); the error returned joins them all.
func (p *Pruner) runOnce(ctx context.Context, epoch int64) (PruneResult, error) {
	var res PruneResult
	activityErr := p.store.PruneActivity(ctx, p.cfg.Retention)
	var eventsErr, ledgerErr error
	res.Events, eventsErr = p.store.RotateEvents(ctx, epoch, p.cfg.Retention, p.cfg.Batch)
	p.recordEvents(res.Events)
	eventsErr = p.recordOutcome(ctx, "outbox_events", eventsErr)
	res.Ledger, ledgerErr = p.store.RotateLedger(ctx, epoch, p.cfg.Retention, p.cfg.TombstoneRetention, p.cfg.Batch)
	p.recordLedger(res.Ledger)
	ledgerErr = p.recordOutcome(ctx, "outbox_ledger", ledgerErr)
	return res, errors.Join(activityErr, eventsErr, ledgerErr)
}

// recordOutcome sets the table's last success, or counts its rotation's
// error by class (unless ctx ended: leadership lost or the replica
// stopping is no fault), and returns the error naming the table.
func (p *Pruner) recordOutcome(ctx context.Context, table string, err error) error {
	if err == nil {
		rotationLastSuccess(table).Set(float64(time.Now().Unix()))
		return nil
	}
	if ctx.Err() == nil {
		rotationErrorsTotal(table, rotationErrorClass(err)).Inc()
	}
	return fmt.Errorf("rotate %s: %w", table, err)
}

// rotationErrorClasses are the classes of outbox_rotation_errors_total:
// what an operator does next differs for each (runbook, "Rotation
// failing").
var rotationErrorClasses = []string{"permission_denied", "lock_not_available", "canceled", "no_rotation_row", "connection", "other"}

// rotationErrorClass is the class of a rotation's error, by SQLSTATE.
func rotationErrorClass(err error) string {
	var pgErr *pgconn.PgError
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.Is(err, outbox.ErrNoRotationRow):
		return "no_rotation_row"
	case errors.As(err, &pgErr):
		switch {
		case pgErr.Code == "42501": // insufficient_privilege
			return "permission_denied"
		case pgErr.Code == outbox.LockNotAvailable || pgErr.Code == "40P01": // lock_timeout, deadlock_detected
			return "lock_not_available"
		case pgErr.Code == "57014": // query_canceled: statement_timeout
			return "canceled"
		case strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P"): // connection, shutdown
			return "connection"
		}
	case errors.As(err, &netErr), errors.As(err, &connectErr), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection"
	}
	return "other"
}

// recordLedger counts and logs what the ledger's rotation did.
func (p *Pruner) recordLedger(r outbox.LedgerRotation) {
	ledgerCarriedTotal.Add(int(r.Carried))
	if r.Rotated {
		ledgerRotationsTotal.Inc()
		p.log.Info().Int("ledger_slot", r.Slot).Int64("ledger_carried", r.Carried).
			Dur("retention", p.cfg.Retention).Dur("tombstone_retention", p.cfg.TombstoneRetention).Msg("ledger rotated")
	}
}

// recordEvents counts and logs what the outbox's rotation did; a held
// rotation is logged when what holds it changes, not every round.
func (p *Pruner) recordEvents(r outbox.EventsRotation) {
	eventsCarriedTotal.Add(int(r.Carried))
	if r.Rotated {
		eventsRotationsTotal.Inc()
		p.log.Info().Int("slot", r.Slot).Int64("carried", r.Carried).Dur("retention", p.cfg.Retention).Msg("outbox rotated")
	}
	if r.Held != "" && r.Held != p.held {
		p.log.Warn().Str("held_by", r.Held).Int64("carried", r.Carried).Dur("retention", p.cfg.Retention).
			Msg("the outbox's oldest partition is due but still needed: its rotation waits (a paused projection holds it until it resumes)")
	}
	p.held = r.Held
	eventsRotationHeld.Set(map[bool]float64{true: 1, false: 0}[r.Held != ""])
}
