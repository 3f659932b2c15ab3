package consume

import (
	"fmt"

	"github.com/VictoriaMetrics/metrics"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/promhist"
)

var (
	supersededTotal = metrics.NewCounter(`outbox_superseded_total`)
	fencedAcksTotal = metrics.NewCounter(`outbox_fenced_acks_total`)
	reclaimedTotal  = metrics.NewCounter(`outbox_reclaimed_total`)
	batchDuration   = promhist.New(`outbox_batch_duration_seconds`, promhist.LatencyBuckets)
	eventLatency    = promhist.New(`outbox_event_latency_seconds`, []float64{
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600})
)

// initCounters creates every labelled series at zero, so that increase()
// and rate() see the first failure of a kind instead of a new series.
func initCounters(projections []string) {
	for _, p := range projections {
		processedTotal(p)
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
