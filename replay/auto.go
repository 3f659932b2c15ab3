package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
)

// Defaults of AutoReplayerConfig. The CLI's flags take theirs from here.
const (
	PerMinuteDefault  = 60
	intervalDefault   = 10 * time.Second
	maxReplaysDefault = 3
)

// PerMinuteRange is what AutoReplayerConfig.PerMinute accepts.
var PerMinuteRange = bounds.Range[int]{Min: 1, Max: 100000}

// autoWhy is the audit reason of every auto-replay.
const autoWhy = "auto-replay of transient failures while the engine is healthy"

var autoReplayed = metrics.GetOrCreateCounter(`outbox_replayed_total{by="auto"}`)

func init() {
	metrichelp.Describe(map[string]string{"outbox_replayed_total": "Failed events returned to pending by a replay."})
}

// AutoReplayerConfig configures an AutoReplayer.
type AutoReplayerConfig struct {
	// PerMinute is the most rows revived in any 60 seconds, counted from the
	// audit table so a new leader inherits its predecessor's spend.
	// Defaults to 60.
	PerMinute int
	// Interval is how often the service looks for rows to revive. Defaults to 10s.
	Interval time.Duration
	// MaxReplays leaves a row alone once its replay_count reaches it, so a
	// row that keeps failing after recovery ends up with a person instead of
	// churning forever. Defaults to 3.
	MaxReplays int
}

func (c AutoReplayerConfig) withDefaults() AutoReplayerConfig {
	c.PerMinute = cmp.Or(c.PerMinute, PerMinuteDefault)
	c.Interval = cmp.Or(c.Interval, intervalDefault)
	c.MaxReplays = cmp.Or(c.MaxReplays, maxReplaysDefault)
	return c
}

// Validate returns a *bounds.FieldError for the first bad field.
func (c AutoReplayerConfig) Validate() error {
	return bounds.First(
		bounds.Check("PerMinute", c.PerMinute, PerMinuteRange),
		bounds.Check("Interval", c.Interval, bounds.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour}),
		bounds.Check("MaxReplays", c.MaxReplays, bounds.Range[int]{Min: 1, Max: 1000}),
	)
}

// AutoReplayer is the leader's service that revives transient failures
// (classify.AutoReplayable) while the engine is healthy, oldest failure
// first, at most PerMinute rows a minute, each batch audited as by "auto".
type AutoReplayer struct {
	leader.Periodic
	db      Beginner
	cfg     AutoReplayerConfig
	healthy func(context.Context) bool
	log     zerolog.Logger
	// replayed is the process-wide counter; tests swap in their own.
	replayed *metrics.Counter
	// page and pages are autoPage and autoPagesPerRun; tests make them
	// small. swept is where the sweep goes on; only runOnce uses it, one
	// run at a time.
	page, pages int
	swept       sweepAt
}

// NewAutoReplayer returns the service, or an error naming an invalid config
// field. healthy reports whether the engine the revived rows will hit is up.
func NewAutoReplayer(db Beginner, cfg AutoReplayerConfig, healthy func(context.Context) bool, logger zerolog.Logger) (*AutoReplayer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if healthy == nil {
		return nil, errors.New("auto-replay needs an engine health check")
	}
	a := &AutoReplayer{
		db: db, cfg: cfg, healthy: healthy, replayed: autoReplayed,
		log:  logger.With().Str("service", "auto_replay").Logger(),
		page: autoPage, pages: autoPagesPerRun, swept: sweepStart,
	}
	a.Periodic = leader.Periodic{ServiceName: "auto_replay", Interval: cfg.Interval, Log: logger,
		Once: func(ctx context.Context, _ int64) error { _, err := a.runOnce(ctx); return err }}
	return a, nil
}

// autoResult is what one runOnce did.
type autoResult struct {
	// Healthy is false when the engine check failed and nothing was tried.
	Healthy bool
	// Busy is set when another run held the lock: this one did nothing.
	Busy bool
	// Budget is what was left of the per-minute allowance before this run.
	Budget  int
	Revived []int64
	AuditID int64
}

// Serialises runOnce across replicas, so a deposed and a new leader briefly
// running together cannot both spend the same budget. A try-lock: a run
// that finds another under way leaves the round to it rather than wait in
// a statement, whose snapshot would hold vacuum back for as long. The
// two-key form cannot collide with the leader's one-bigint lock key.
const autoLockSQL = `SELECT pg_try_advisory_xact_lock(hashtext('wlproj.outbox'), hashtext('auto_replay'))`

// The rows to revive are found by a sweep of the failed rows in the order
// of failure (outbox_events_failed_time_idx), a page per statement, at
// most autoPagesPerRun pages a run, from where the last run stopped: one
// statement looking for the oldest revivable row walked every failed row
// that is not (a deterministic reason, or replayed MaxReplays times),
// 0.6 s for 200,000 of them, every Interval. A new failure sorts after
// the sweep's position, so the sweep finds it; once it reaches the newest
// failure it starts again from the oldest.
const (
	autoPage        = 5000
	autoPagesPerRun = 10
)

// autoPageSQL reads a page of failed rows after a position, saying which
// the policy may revive.
const autoPageSQL = `
SELECT id, updated_at, error_reason = ANY($1) AND replay_count < $2
  FROM outbox_events
 WHERE status = 'failed' AND (updated_at, id) > ($3, $4)
 ORDER BY updated_at, id
 LIMIT $5`

// autoLockRowsSQL locks the candidates that are still revivable. SKIP
// LOCKED: a row an operator is replaying right now is theirs.
const autoLockRowsSQL = `
SELECT id FROM outbox_events
 WHERE id = ANY($3) AND status = 'failed' AND error_reason = ANY($1) AND replay_count < $2
 ORDER BY id
 FOR UPDATE SKIP LOCKED`

// sweepStart is the position before every failed row.
var sweepStart = sweepAt{at: time.Unix(0, 0).UTC(), id: 0}

// sweepAt is a position in the order of failure.
type sweepAt struct {
	at time.Time
	id int64
}

func (a *AutoReplayer) runOnce(ctx context.Context) (autoResult, error) {
	var res autoResult
	if !a.healthy(ctx) {
		return res, nil
	}
	res.Healthy = true

	tx, err := a.db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("auto-replay: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var locked bool
	if err := tx.QueryRow(ctx, autoLockSQL).Scan(&locked); err != nil {
		return res, fmt.Errorf("auto-replay: lock: %w", err)
	}
	if !locked {
		res.Busy = true
		return res, nil
	}
	spent, err := outbox.AuditedSince(ctx, tx, AutoBy, time.Minute)
	if err != nil {
		return res, fmt.Errorf("auto-replay: budget: %w", err)
	}
	res.Budget = max(a.cfg.PerMinute-spent, 0)
	if res.Budget == 0 {
		return res, nil
	}
	// The rows found but not revived, on an error, are found again.
	from := a.swept
	ids, err := a.candidates(ctx, tx, res.Budget)
	if err != nil {
		a.swept = from
		return res, fmt.Errorf("auto-replay: select: %w", err)
	}
	if len(ids) == 0 {
		return res, nil
	}
	selector := map[string]any{
		"auto": true, "reasons": classify.AutoReplayable, "limit": res.Budget, "max_replays": a.cfg.MaxReplays,
	}
	auditID, _, err := revive(ctx, tx, ids, AutoBy, autoWhy, false, selector)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		a.swept = from
		return res, fmt.Errorf("auto-replay: %w", err)
	}
	res.Revived, res.AuditID = ids, auditID
	a.replayed.Add(len(ids))
	a.log.Info().Int("count", len(ids)).Str("ids", FormatIDs(ids)).
		Int64("audit_id", auditID).Int("budget", res.Budget).Msg("auto-replayed transient failures")
	return res, nil
}

// candidates sweeps on for at most budget revivable rows, and locks those
// still revivable. The sweep stops after the last row it takes, so that
// the revivable rows after it in the page come next run.
func (a *AutoReplayer) candidates(ctx context.Context, tx pgx.Tx, budget int) ([]int64, error) {
	var found []int64
	for range a.pages {
		rows, err := tx.Query(ctx, autoPageSQL, classify.AutoReplayable, a.cfg.MaxReplays, a.swept.at, a.swept.id, a.page)
		if err != nil {
			return nil, err
		}
		n := 0
		var eligible bool
		var at sweepAt
		_, err = pgx.ForEachRow(rows, []any{&at.id, &at.at, &eligible}, func() error {
			n++
			if len(found) < budget {
				a.swept = at
				if eligible {
					found = append(found, at.id)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if n < a.page {
			a.swept = sweepStart // the newest failure: start again next run
			break
		}
		if len(found) == budget {
			break
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, autoLockRowsSQL, classify.AutoReplayable, a.cfg.MaxReplays, found)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
