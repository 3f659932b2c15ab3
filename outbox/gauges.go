package outbox

import (
	"context"
	"fmt"
	"time"
)

// GaugeCountCap bounds every count a gauge reading makes: the metrics
// poller runs every few seconds on every replica, and a count(*) of a
// backlog of hundreds of thousands took 80-260 ms each time.
const GaugeCountCap = 10_000

// Gauges is what the metrics poller reads: Snapshot's backlog figures, each
// at a cost bounded by GaugeCountCap whatever the size of the outbox.
type Gauges struct {
	// Lag counts pending rows exactly up to GaugeCountCap. Above it
	// LagEstimated is set and Lag adds the span of ids from the cap-th
	// pending row to the newest one: exact for a backlog of consecutive
	// inserts, an overcount when done rows sit between pending ones (a
	// projection paused for long). `wlproj status` counts exactly.
	Lag          int64
	LagEstimated bool
	// OldestPendingAge is exact: one probe of the pending index.
	OldestPendingAge time.Duration
	// InFlight and Stuck are exact up to GaugeCountCap and stop there.
	InFlight int64
	Stuck    int64
	TakenAt  time.Time
}

// pendingSince is when a pending row began to wait for the leader: its
// insert, or the newest replay or restore that revived it. A month-old
// event replayed today has waited since today, and must not fire the
// backlog alert. The history is read only for revived rows.
const pendingSince = `CASE WHEN replay_count > 0 THEN coalesce(
    (SELECT max((h->>'at')::timestamptz) FROM jsonb_array_elements(error_history) h
      WHERE h->>'event' IN ('replayed', 'restored')), created_at) ELSE created_at END`

// gaugesSQL reads at most GaugeCountCap entries of each partial index it
// walks, and the newest pending id with one probe from the index's tail.
// The newest row's id is read only for an estimate past the cap: its probe
// from the primary key's tail visits, one by one, the rows an open
// producer transaction inserted last (2,400 buffers for 100k of them).
var gaugesSQL = `
WITH head AS MATERIALIZED (SELECT id, ` + pendingSince + ` AS since FROM outbox_events WHERE status = 'pending' ORDER BY id LIMIT $2),
queued AS MATERIALIZED (SELECT id, created_at, in_flight, lease_until, processing_started_at
                          FROM outbox_queue_backlog_rows($2))
SELECT
    (SELECT count(*) FROM head) + (SELECT count(*) FROM queued WHERE NOT in_flight),
    (SELECT max(id) FROM head),
    (SELECT id FROM outbox_events WHERE status = 'pending' ORDER BY id DESC LIMIT 1),
    least((SELECT min(since) FROM head), (SELECT min(created_at) FROM queued WHERE NOT in_flight)),
    (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE status = 'processing' LIMIT $2) p)
      + (SELECT count(*) FROM queued WHERE in_flight),
    (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE status = 'processing' AND ` + stuckWhere + ` LIMIT $2) s)
      + (SELECT count(*) FROM queued WHERE in_flight AND ` + stuckWhere + `),
    now(),
    (SELECT count(*) FROM queued) >= $2,
    (SELECT max(id) FROM queued),
    CASE WHEN (SELECT count(*) FROM queued) >= $2 THEN (SELECT max(id) FROM outbox_events) END`

// ReadGauges reads the backlog figures of the gauges.
func ReadGauges(ctx context.Context, db Querier, maxProcessing time.Duration) (Gauges, error) {
	var g Gauges
	var head int64
	var headLast, newest, queuedLast, newestRow *int64
	var oldest *time.Time
	var queuedCapped bool
	err := db.QueryRow(ctx, gaugesSQL, maxProcessing.Seconds(), GaugeCountCap).
		Scan(&head, &headLast, &newest, &oldest, &g.InFlight, &g.Stuck, &g.TakenAt, &queuedCapped, &queuedLast, &newestRow)
	if err != nil {
		return g, fmt.Errorf("gauges: %w", err)
	}
	g.Lag = head
	if head >= GaugeCountCap && headLast != nil && newest != nil {
		g.Lag, g.LagEstimated = head+max(*newest-*headLast, 0), true
	}
	// Queued rows past the cap are estimated the same way: every id from
	// the cap-th one to the newest row.
	if queuedCapped && queuedLast != nil && newestRow != nil {
		g.Lag, g.LagEstimated = g.Lag+max(*newestRow-*queuedLast, 0), true
	}
	if oldest != nil {
		g.OldestPendingAge = max(g.TakenAt.Sub(*oldest), 0)
	}
	return g, nil
}
