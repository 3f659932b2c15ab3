package consume

import (
	"context"
	"fmt"

	"github.com/VictoriaMetrics/metrics"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/metrichelp"
	"github.com/wlproj/wlproj/internal/promhist"
)

var (
	fencedAcksTotal = metrics.NewCounter(`outbox_fenced_acks_total`)
	reclaimedTotal  = metrics.NewCounter(`outbox_reclaimed_total`)
	// The leader's statements that failed: the loop, the acks and the
	// reclaimer log each failure and carry on, so without these a leader
	// whose every claim fails looks as healthy as an idle one.
	claimErrorsTotal   = metrics.NewCounter(`outbox_claim_errors_total`)
	ackErrorsTotal     = metrics.NewCounter(`outbox_ack_errors_total`)
	reclaimErrorsTotal = metrics.NewCounter(`outbox_reclaim_errors_total`)
	// ledgerRotationsTotal counts the ledger's partitions the pruner
	// reopened; ledgerCarriedTotal the entries it copied out of them first.
	ledgerRotationsTotal = metrics.NewCounter(`outbox_ledger_rotations_total`)
	ledgerCarriedTotal   = metrics.NewCounter(`outbox_ledger_carried_total`)
	// The outbox's partitions reopened, the rows moved out of them first,
	// and whether a due rotation waits for a row still needed.
	eventsRotationsTotal = metrics.NewCounter(`outbox_events_rotations_total`)
	eventsCarriedTotal   = metrics.NewCounter(`outbox_events_carried_total`)
	eventsRotationHeld   = metrics.NewGauge(`outbox_events_rotation_held`, nil)
	batchDuration        = promhist.New(`outbox_batch_duration_seconds`, promhist.LatencyBuckets)
	// claimDuration is fine-grained below 5 ms: a claim's cost is what the
	// application's database pays per batch.
	claimDuration = promhist.New(`outbox_claim_duration_seconds`, []float64{
		0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5})
	eventLatency = promhist.New(`outbox_event_latency_seconds`, []float64{
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600})
)

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_processed_total":        "Events acked done, including superseded ones.",
		"outbox_failed_total":           "Failed attempts, by reason, whether retried or terminal.",
		"outbox_retry_scheduled_total":  "Failed attempts sent back to pending with a backoff.",
		"outbox_terminal_failed_total":  "Events that reached the terminal failed state.",
		"outbox_reclaimed_total":        "Stuck events returned by the reclaimer.",
		"outbox_superseded_total":       "Events acked without effect: the ledger (never sent) or the projection had this version, a newer one, or this very event.",
		"outbox_events_rotations_total": "Outbox partitions reopened (TRUNCATE) once their rows were older than the retention and passed by every projection.",
		"outbox_events_carried_total":   "Outbox rows moved out of a partition before it was reopened, because they were still needed (retrying, failed, discarded, done within the retention).",
		"outbox_events_rotation_held":   "1 while the outbox's oldest partition is due but still holds an event in flight or one a projection has not passed (a paused projection): its rotation waits.",
		"outbox_ledger_rotations_total": "Ledger partitions reopened (TRUNCATE) once their entries were older than the retention.",
		"outbox_ledger_carried_total":   "Ledger entries copied out of a partition before it was reopened, because they were still needed.",
		"outbox_fenced_acks_total":      "Acks refused because the claim token was no longer current.",
		"outbox_batch_duration_seconds": "Time to project and ack one claimed batch.",
		"outbox_claim_duration_seconds": "Time of one claim statement, as the leader waits for it.",
		"outbox_event_latency_seconds":  "Time from insert to ack of an event.",
		"outbox_claim_errors_total":     "Claims that failed with an error (the leader logs each and claims again after the poll interval).",
		"outbox_ack_errors_total":       "Acks (done or failed) that failed with an error; their rows come back after the lease.",
		"outbox_reclaim_errors_total":   "Reclaimer rounds that failed with an error.",
	})
}

// countError counts err in c, unless ctx has ended: a statement cut short
// because leadership was lost or the replica is stopping is no fault.
func countError(ctx context.Context, c *metrics.Counter, err error) {
	if err != nil && ctx.Err() == nil {
		c.Inc()
	}
}

// initCounters creates every labelled series at zero, so that increase()
// and rate() see the first failure of a kind instead of a new series.
func initCounters(projections []string) {
	for _, p := range projections {
		processedTotal(p)
		supersededTotal(p, causeLedger)
		supersededTotal(p, causeProjection)
		for _, r := range classify.Reasons {
			failedTotal(p, r)
			terminalFailedTotal(p, r)
			if classify.ClassOf(r) == classify.Transient {
				retryScheduledTotal(p, r)
			}
		}
	}
}

func processedTotal(projection string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_processed_total{projection=%q}`, projection))
}

func failedTotal(projection, reason string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_failed_total{projection=%q,reason=%q}`, projection, reason))
}

func retryScheduledTotal(projection, reason string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_retry_scheduled_total{projection=%q,reason=%q}`, projection, reason))
}

func terminalFailedTotal(projection, reason string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_terminal_failed_total{projection=%q,reason=%q}`, projection, reason))
}

func supersededTotal(projection, cause string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_superseded_total{projection=%q,cause=%q}`, projection, cause))
}

// A rotation that fails is retried the next round and logged each time:
// without these, only that log showed that a rotation never ran (a grant
// missing, a lock never free) while its table grew. rotationErrorsTotal
// counts the failed rounds per table and class (rotationErrorClass);
// rotationLastSuccess is when a round of the table last ended without an
// error (rotated, not due, or held).

// rotationTables are the tables the pruner rotates, as the rotation
// metrics name them.
var rotationTables = []string{"outbox_events", "outbox_ledger"}

func rotationErrorsTotal(table, class string) *metrics.Counter {
	return metrics.GetOrCreateCounter(fmt.Sprintf(`outbox_rotation_errors_total{table=%q,class=%q}`, table, class))
}

func rotationLastSuccess(table string) *metrics.Gauge {
	return metrics.GetOrCreateGauge(fmt.Sprintf(`outbox_rotation_last_success_timestamp_seconds{table=%q}`, table), nil)
}

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_rotation_errors_total": "Rounds of the leader's rotation of a table (outbox_events, outbox_ledger) that failed, by class: " +
			"permission_denied, lock_not_available, canceled, no_rotation_row, connection, other.",
		"outbox_rotation_last_success_timestamp_seconds": "Unix time the leader's rotation of a table last ended a round without an error " +
			"(it rotated, was not due, or was held); absent until the first.",
	})
	// Every series at zero from the start, so that increase() sees the
	// first failure of a class.
	for _, table := range rotationTables {
		for _, class := range rotationErrorClasses {
			rotationErrorsTotal(table, class)
		}
	}
}
