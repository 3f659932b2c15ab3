package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/leader"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// Defaults of ServiceConfig; the CLI's flags take theirs from here.
const (
	// RateDefault keeps a scheduled run of a million documents under four
	// minutes while leaving the engine and Postgres to the live drain.
	RateDefault = 5000
	// AutoBy is the audit name of the automatic repair.
	AutoBy = "verify-auto"
	// checkEvery bounds how late a due run starts, after a failover too:
	// the schedule is kept in outbox_verify_runs, not in the leader.
	checkEvery = time.Minute
)

// IntervalRange and ServiceRateRange are what ServiceConfig accepts.
var (
	IntervalRange    = bounds.Range[time.Duration]{Min: time.Second, Max: 10 * 365 * 24 * time.Hour}
	ServiceRateRange = bounds.Range[int]{Min: 1, Max: 10_000_000}
)

// ServiceConfig configures the scheduled verify.
type ServiceConfig struct {
	// Interval is the time from one run's start to the next one's. Required:
	// the service is not registered without it.
	Interval time.Duration
	// Index is the index or alias verified (ELASTIC_INDEX). Required.
	Index string
	// Projection is whose ledger entries count. Defaults to search.
	Projection string
	// SourceTable is the source-of-truth table; empty compares with the
	// ledger alone. Defaults to empty.
	SourceTable string
	// Rate caps the documents read per second. Defaults to 5000.
	Rate int
	// AutoRepair deletes, audited, the resurrected documents a run finds:
	// the ledger says they were deleted, so the delete is never a guess.
	// The other kinds wait for an operator. Defaults to false.
	AutoRepair bool
}

func (c ServiceConfig) withDefaults() ServiceConfig {
	c.Projection = cmp.Or(c.Projection, projection.SearchName)
	c.Rate = cmp.Or(c.Rate, RateDefault)
	return c
}

// Validate returns a *bounds.FieldError for the first bad field.
func (c ServiceConfig) Validate() error {
	if c.Index == "" {
		return bounds.Invalid("Index", "is required")
	}
	return bounds.First(
		bounds.Check("Interval", c.Interval, IntervalRange),
		bounds.Check("Rate", c.Rate, ServiceRateRange),
	)
}

// Service is the leader's scheduled verify: a run when one is due, its
// result in metrics and in outbox_verify_runs (the console's overview),
// and, with AutoRepair, the resurrected documents deleted.
type Service struct {
	leader.Periodic
	cfg    ServiceConfig
	pool   *pgxpool.Pool
	client *elastic.Client
	search *projection.Search
	log    zerolog.Logger
}

// NewService validates cfg (after defaults) and builds the service. search
// is the leader's handler: the automatic repair sends its deletes through
// it, with its write deadlines and, during a rebuild, to both indexes.
func NewService(cfg ServiceConfig, pool *pgxpool.Pool, client *elastic.Client, search *projection.Search, log zerolog.Logger) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, pool: pool, client: client, search: search, log: log.With().Str("service", "verify").Logger()}
	s.Periodic = leader.Periodic{ServiceName: "verify", Interval: min(cfg.Interval, checkEvery), Log: log,
		Once: func(ctx context.Context, _ int64) error { _, err := s.runOnce(ctx); return err }}
	return s, nil
}

// Run implements leader.Service. The gauges go with the term: a replica
// that no longer leads must not keep reporting the drift it once saw.
func (s *Service) Run(ctx context.Context, epoch int64, drain <-chan struct{}) {
	defer unregisterGauges(s.cfg.Projection)
	s.Periodic.Run(ctx, epoch, drain)
}

// RunResult is one round: whether a run was due, what it found and how
// many resurrected documents it deleted.
type RunResult struct {
	Ran      bool
	Report   Report
	Repaired int64
}

// dueSQL tells whether the projection's last complete run started at
// least an interval ago, on the database's clock.
const dueSQL = `
SELECT NOT EXISTS (SELECT FROM outbox_verify_runs WHERE projection = $1 AND started_at > now() - make_interval(secs => $2))`

// runOnce verifies when a run is due.
func (s *Service) runOnce(ctx context.Context) (RunResult, error) {
	var res RunResult
	var due bool
	if err := s.pool.QueryRow(ctx, dueSQL, s.cfg.Projection, s.cfg.Interval.Seconds()).Scan(&due); err != nil {
		return res, fmt.Errorf("verify: read the last run: %w", err)
	}
	if !due {
		return res, nil
	}
	res.Ran = true
	var repairedIDs []string
	cfg := Config{Pool: s.pool, Client: s.client, Index: s.cfg.Index, Projection: s.cfg.Projection,
		SourceTable: s.cfg.SourceTable, Rate: s.cfg.Rate, Documents: true}
	if s.cfg.AutoRepair {
		cfg.OnDrift = func(ctx context.Context, drift []Drift) error {
			ids, err := s.deleteResurrected(ctx, drift)
			res.Repaired += int64(len(ids))
			if room := auditIDsMax - len(repairedIDs); room > 0 {
				repairedIDs = append(repairedIDs, ids[:min(room, len(ids))]...)
			}
			return err
		}
	}
	var err error
	res.Report, err = Run(ctx, cfg)
	if res.Repaired > 0 {
		// The deletes happened: audit them even when the run stopped after.
		err = errors.Join(err, s.audit(context.WithoutCancel(ctx), res, repairedIDs))
		repairedTotal(s.cfg.Projection).Add(int(res.Repaired))
	}
	if err != nil {
		return res, err
	}
	if err := s.record(ctx, res); err != nil {
		return res, err
	}
	setGauges(res)
	log := s.log.Info()
	if res.Report.Drift() > 0 {
		log = s.log.Warn()
	}
	log.Str("projection", res.Report.Projection).Str("source_table", res.Report.SourceTable).Int64("checked", res.Report.Checked).
		Interface("drift", res.Report.Counts).Interface("samples", res.Report.Samples).Int64("in_flight", res.Report.InFlight).
		Int64("repaired", res.Repaired).Dur("took", res.Report.Took).Msg("verified")
	return res, nil
}

// deleteResurrected deletes the batch's resurrected documents through the
// search handler, at the newest version the index or the ledger holds,
// and returns the ids of those the engine deleted. A document changed
// since the verify judged it (in the database: stillDeleted; or in the
// engine: a version conflict) is left for the next run.
func (s *Service) deleteResurrected(ctx context.Context, drift []Drift) ([]string, error) {
	drift, err := s.stillDeleted(ctx, drift)
	if err != nil {
		return nil, err
	}
	var events []outbox.Event
	var ids []string
	for _, d := range drift {
		ev, why := repairOf(d)
		if d.Kind != Resurrected || why != "" {
			continue
		}
		v := ev.version
		events = append(events, outbox.Event{ID: int64(len(events) + 1), Projection: s.cfg.Projection, EntityType: ev.entityType,
			EntityID: ev.entityID, Op: outbox.OpDelete, EventVersion: &v, Payload: []byte("{}"), Repair: true})
		ids = append(ids, d.ID)
	}
	if len(events) == 0 {
		return nil, nil
	}
	var deleted []string
	var errs []error
	for i, r := range s.search.Handle(ctx, events) {
		switch {
		case r.Err != nil:
			errs = append(errs, fmt.Errorf("delete %s: %w", ids[i], r.Err))
		case !r.Superseded:
			deleted = append(deleted, ids[i])
		}
	}
	return deleted, errors.Join(errs...)
}

// stillDeleted is the drift whose documents the database holds as the
// verify judged them, read again just before the delete: the same ledger
// entry and no event in flight. The automatic repair sends its deletes to
// the engine itself, not through the outbox (the daemon's role may not
// insert events), so this is where it applies the leader's rule: a repair
// delete is never sent once the ledger moved since the judgement, as it
// does when the document is re-created (outbox.Event.Stale).
func (s *Service) stillDeleted(ctx context.Context, drift []Drift) ([]Drift, error) {
	keys := make([]key, 0, len(drift))
	for _, d := range drift {
		if d.EntityType != "" {
			keys = append(keys, key{Type: d.EntityType, ID: d.EntityID})
		}
	}
	now, err := database{q: s.pool, projection: s.cfg.Projection}.current(ctx, keys, false)
	if err != nil {
		return nil, err
	}
	kept := drift[:0:0]
	for _, d := range drift {
		c := now[key{Type: d.EntityType, ID: d.EntityID}]
		if !c.inFlight && c.same(current{ledger: d.Ledger}) {
			kept = append(kept, d)
		}
	}
	return kept, nil
}

// audit writes one row for the run's automatic repair.
func (s *Service) audit(ctx context.Context, res RunResult, ids []string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, _, err := outbox.WriteAudit(ctx, tx, outbox.Audit{Action: "repair", By: AutoBy,
			Why: "scheduled verify: resurrected documents deleted (OUTBOX_VERIFY_AUTO_REPAIR)",
			Selector: map[string]any{"projection": s.cfg.Projection, "index": s.cfg.Index, "kind": Resurrected,
				"deleted": ids, "deleted_listed": len(ids)},
			Count: res.Repaired})
		return err
	})
}

// recordSQL keeps the projection's last complete run.
const recordSQL = `
INSERT INTO outbox_verify_runs AS r (projection, index_name, source_table, started_at, finished_at, checked, missing, stale,
                                     extra, resurrected, in_flight, repaired, samples)
VALUES ($1, $2, nullif($3, ''), $4, now(), $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (projection) DO UPDATE
   SET index_name = excluded.index_name, source_table = excluded.source_table, started_at = excluded.started_at,
       finished_at = excluded.finished_at, checked = excluded.checked, missing = excluded.missing, stale = excluded.stale,
       extra = excluded.extra, resurrected = excluded.resurrected, in_flight = excluded.in_flight,
       repaired = excluded.repaired, samples = excluded.samples`

func (s *Service) record(ctx context.Context, res RunResult) error {
	r := res.Report
	_, err := s.pool.Exec(ctx, recordSQL, r.Projection, r.Index, r.SourceTable, r.Started, r.Checked, r.Counts[Missing],
		r.Counts[Stale], r.Counts[Extra], r.Counts[Resurrected], r.InFlight, res.Repaired, r.Samples)
	if err != nil {
		return fmt.Errorf("verify: record the run: %w", err)
	}
	return nil
}

// LastRun is a projection's last complete scheduled verify.
type LastRun struct {
	Projection  string
	Index       string
	SourceTable string
	Started     time.Time
	Finished    time.Time
	Checked     int64
	Counts      map[Kind]int64
	InFlight    int64
	Repaired    int64
	Samples     map[Kind][]string
}

// Drift is the total of the counts.
func (r LastRun) Drift() int64 { return Report{Counts: r.Counts}.Drift() }

// Count is the count of one kind, by name (for templates).
func (r LastRun) Count(kind string) int64 { return r.Counts[Kind(kind)] }

// LastRuns reads every projection's last complete scheduled verify.
func LastRuns(ctx context.Context, pool *pgxpool.Pool) ([]LastRun, error) {
	rows, err := pool.Query(ctx, `
		SELECT projection, index_name, coalesce(source_table, ''), started_at, finished_at, checked, missing, stale, extra,
		       resurrected, in_flight, repaired, samples
		  FROM outbox_verify_runs ORDER BY projection`)
	if err != nil {
		return nil, fmt.Errorf("read the last verify runs: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LastRun, error) {
		var r LastRun
		var m, s, e, x int64
		err := row.Scan(&r.Projection, &r.Index, &r.SourceTable, &r.Started, &r.Finished, &r.Checked, &m, &s, &e, &x,
			&r.InFlight, &r.Repaired, &r.Samples)
		r.Counts = map[Kind]int64{Missing: m, Stale: s, Extra: e, Resurrected: x}
		return r, err
	})
}

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_verify_drift_documents":                 "Documents the last scheduled verify found differing from the truth, by kind (after the automatic repair).",
		"outbox_verify_checked_documents":               "Documents the last scheduled verify looked at.",
		"outbox_verify_last_complete_timestamp_seconds": "Unix time at which the last scheduled verify completed.",
		"outbox_verify_duration_seconds":                "How long the last scheduled verify took.",
		"outbox_verify_repaired_total":                  "Resurrected documents the scheduled verify deleted (OUTBOX_VERIFY_AUTO_REPAIR).",
	})
}

func driftGauge(projection string, kind Kind) string {
	return fmt.Sprintf(`outbox_verify_drift_documents{projection=%q,kind=%q}`, projection, kind)
}

func projectionGauges(projection string) []string {
	return []string{
		fmt.Sprintf(`outbox_verify_checked_documents{projection=%q}`, projection),
		fmt.Sprintf(`outbox_verify_last_complete_timestamp_seconds{projection=%q}`, projection),
		fmt.Sprintf(`outbox_verify_duration_seconds{projection=%q}`, projection),
	}
}

func repairedTotal(projection string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_verify_repaired_total{projection=%q}`, projection))
}

// setGauges shows a complete run: what the automatic repair deleted no
// longer counts as drift.
func setGauges(res RunResult) {
	r := res.Report
	for _, k := range Kinds {
		n := r.Counts[k]
		if k == Resurrected {
			n -= res.Repaired
		}
		metrics.GetOrCreateGauge(driftGauge(r.Projection, k), nil).Set(float64(n))
	}
	g := projectionGauges(r.Projection)
	metrics.GetOrCreateGauge(g[0], nil).Set(float64(r.Checked))
	metrics.GetOrCreateGauge(g[1], nil).Set(float64(r.Started.Add(r.Took).UnixMilli()) / 1000)
	metrics.GetOrCreateGauge(g[2], nil).Set(r.Took.Seconds())
}

func unregisterGauges(projection string) {
	for _, k := range Kinds {
		metrics.UnregisterMetric(driftGauge(projection, k))
	}
	for _, g := range projectionGauges(projection) {
		metrics.UnregisterMetric(g)
	}
}
