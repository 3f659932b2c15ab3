package main

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// The daemon's histograms are cumulative "le" buckets (internal/promhist):
// two scrapes subtract to the observations between them, two replicas add,
// and the quantile lies within the bucket that holds it.
func TestHistFromLeBuckets(t *testing.T) {
	t.Parallel()
	scrape := func(c1, c2, c3, inf int) string {
		return "# TYPE outbox_event_latency_seconds histogram\n" +
			"outbox_event_latency_seconds_bucket{le=\"0.01\"} " + itoa(c1) + "\n" +
			"outbox_event_latency_seconds_bucket{le=\"0.1\"} " + itoa(c2) + "\n" +
			"outbox_event_latency_seconds_bucket{le=\"1\"} " + itoa(c3) + "\n" +
			"outbox_event_latency_seconds_bucket{le=\"+Inf\"} " + itoa(inf) + "\n" +
			"outbox_event_latency_seconds_sum 1\noutbox_event_latency_seconds_count " + itoa(inf) + "\n" +
			"outbox_claim_duration_seconds_bucket{le=\"0.01\"} 999\n"
	}
	before, err := parseHist(scrape(10, 10, 10, 10), latencyMetric)
	require.NoError(t, err)
	after, err := parseHist(scrape(10, 110, 210, 210), latencyMetric)
	require.NoError(t, err)
	h := after.since(before)
	require.Equal(t, 200.0, h.count(), "the other histogram's buckets are not read")
	require.InDelta(t, 0.055, h.quantile(0.25), 1e-9, "rank 50 of the 100 in (0.01, 0.1]: half way")
	require.InDelta(t, 0.1, h.quantile(0.5), 1e-9)
	require.InDelta(t, 0.1+0.9*98.0/100, h.quantile(0.99), 1e-9)
	require.Equal(t, 1.0, h.max(), "the upper bound of the highest bucket with an observation")
	require.Equal(t, 400.0, h.plus(h, 1).count())
	require.Zero(t, hist{}.quantile(0.99), "nothing observed")
	labelled, err := parseHist(`y_bucket{projection="a",le="1"} 2
y_bucket{projection="a",le="+Inf"} 3
y_bucket{projection="b",le="1"} 5
y_bucket{projection="b",le="+Inf"} 5
`, "y")
	require.NoError(t, err)
	require.Equal(t, hist{1: {lo: 0, hi: 1, n: 7}, math.Inf(1): {lo: 1, hi: math.Inf(1), n: 1}}, labelled,
		"each series' cumulative counts apart, then added")
	_, err = parseHist(scrape(1, 1, 1, 1), "outbox_renamed_seconds")
	require.ErrorContains(t, err, "no histogram outbox_renamed_seconds")
}

// VictoriaMetrics' own histograms have non-cumulative "vmrange" buckets.
func TestHistFromVMRangeBuckets(t *testing.T) {
	t.Parallel()
	h, err := parseHist(`x_bucket{vmrange="1.000e-02...1.136e-02"} 3
x_bucket{vmrange="1.000e+00...1.136e+00"} 1
x_bucket{projection="a",vmrange="1.000e-02...1.136e-02"} 1
x_sum 1
x_count 5
`, "x")
	require.NoError(t, err)
	require.Equal(t, 5.0, h.count())
	require.InDelta(t, 0.01+0.00136*2.5/4, h.quantile(0.5), 1e-9)
	require.Equal(t, 1.136, h.max())
}

func itoa(n int) string { return fmt.Sprint(n) }
