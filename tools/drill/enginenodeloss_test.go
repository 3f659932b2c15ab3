package main

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// passingNodeLoss is an engine-node-loss run that kept every promise, each
// figure at its limit where it has one.
func passingNodeLoss() *NodeLoss {
	events := PhaseEvents{Acked: 8000, LagP99Seconds: 0.4, LagMaxSeconds: 4.1}
	return &NodeLoss{
		Faults: []*NodeFault{
			{Fault: "silent", Node: "es1", Seconds: 40, BulksDuring: 1, BackSeconds: ptr(7.2), PhaseEvents: events},
			{Fault: "503", Node: "es2", Seconds: 40, BulksDuring: nodeFaultBulkLimit, BackSeconds: ptr(nodeReviveLimit.Seconds()), PhaseEvents: events},
		},
		KilledNode: "es3", ReadsOK: 300, BulksToKilledNode: nodeFaultBulkLimit, Killed: events,
	}
}

// engine-node-loss fails on each broken promise of each phase, and names
// the phase; the run engine-node-loss makes on a three-node stack is too
// slow for `make test`, so its verdict is tested here on fabricated
// figures.
func TestNodeLossVerdict(t *testing.T) {
	t.Parallel()
	require.NoError(t, passingNodeLoss().verdict())
	for _, tc := range []struct {
		name   string
		mutate func(n *NodeLoss)
		want   string
	}{
		{"silent node: an event failed", func(n *NodeLoss) { n.Faults[0].TransientFailures = 1 },
			"es1 silent: 1 events failed of a transient error"},
		{"503 node: an attempt used", func(n *NodeLoss) {
			n.Faults[1].WithErrors, n.Faults[1].Reasons = 3, map[string]int64{"server_error": 3}
		}, "es2 503: 3 events have an error in their history since the fault began (map[server_error:3])"},
		{"an event waited too long", func(n *NodeLoss) { n.Faults[0].LagOverLimit, n.Faults[0].LagMaxSeconds = 2, 30 },
			"es1 silent: 2 events waited longer than 10s from insert to ack (max at most 30.0 s)"},
		{"nothing acked during the fault", func(n *NodeLoss) { n.Faults[1].Acked = 0 },
			"es2 503: no event was acked while the node was faulted"},
		{"the faulted node stayed in the rotation", func(n *NodeLoss) { n.Faults[0].BulksDuring = nodeFaultBulkLimit + 1 },
			"es1 silent: the faulted node got 3 bulks (limit 2)"},
		{"the node never came back", func(n *NodeLoss) { n.Faults[1].BackSeconds = nil },
			"es2 503: the node got no bulk within 35s after the fault ended"},
		{"the node came back late", func(n *NodeLoss) { n.Faults[0].BackSeconds = ptr(nodeReviveLimit.Seconds() + 1) },
			"es1 silent: the node got no bulk within 35s"},
		{"kill: an event failed", func(n *NodeLoss) { n.Killed.TransientFailures = 2 },
			"es3 killed: 2 events failed of a transient error"},
		{"kill: an attempt used", func(n *NodeLoss) { n.Killed.WithErrors = 1 },
			"es3 killed: 1 events have an error in their history"},
		{"kill: no read answered", func(n *NodeLoss) { n.ReadsOK = 0 },
			"es3 killed: no read of the index answered"},
		{"kill: a read failed", func(n *NodeLoss) { n.ReadsFailed = 4 },
			"es3 killed: 4 of 304 reads through the remaining nodes failed"},
		{"kill: the dead node stayed in the rotation", func(n *NodeLoss) { n.BulksToKilledNode = 9 },
			"es3 killed: the killed node got 9 bulks while down (limit 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := passingNodeLoss()
			tc.mutate(n)
			require.ErrorContains(t, n.verdict(), tc.want)
		})
	}
}

// A phase's figures count what happened from its fault on: the acks the
// replicas' latency histograms observed in it, failures and error history
// entries since it began.
func TestPhaseEvents(t *testing.T) {
	t.Parallel()
	db := harness.NewDatabase(t)
	// As the drill's: phaseEvents reads the outbox with the rotation archive.
	require.NoError(t, harness.InstallRotationArchive(context.Background(), db.Pool))
	d := &drill{s: &harness.Session{DB: db}}
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(secs float64) time.Time { return from.Add(time.Duration(secs * float64(time.Second))) }
	entry := func(secs float64, key, value string) string {
		return `{"at": "` + at(secs).Format(time.RFC3339Nano) + `", "` + key + `": "` + value + `"}`
	}
	for _, e := range []struct {
		status, class string
		updated       float64
		history       []string
	}{
		{"done", "", 0.5, nil},
		{"failed", "transient", 5, []string{entry(5, "reason", "timeout")}},
		{"failed", "transient", -5, []string{entry(-5, "reason", "connection")}}, // before
		{"failed", "deterministic", 3, []string{entry(3, "reason", "mapping_error")}},
		{"done", "", 3, []string{entry(-10, "reason", "connection"), entry(2, "reason", "server_error")}},
		{"pending", "", 7, []string{entry(7, "event", "stuck_reclaimed")}},
	} {
		db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, status, error_class, updated_at, error_history)
			VALUES ('book', 'b', 'upsert', $1, nullif($2, ''), $3, $4::jsonb)`,
			e.status, e.class, at(e.updated), "["+strings.Join(e.history, ",")+"]")
	}
	// Three acks in the phase: 1.5 s, 3 s and 12 s from insert to ack.
	lag, err := harness.ParseHistogram(`lag_bucket{le="1"} 0
lag_bucket{le="2.5"} 1
lag_bucket{le="5"} 2
lag_bucket{le="10"} 2
lag_bucket{le="30"} 3
lag_bucket{le="+Inf"} 3
`, "lag")
	require.NoError(t, err)
	got, err := d.phaseEvents(context.Background(), from, lag)
	require.NoError(t, err)
	want := PhaseEvents{Acked: 3, LagOverLimit: 1, LagP99Seconds: 29.4, LagMaxSeconds: 30, TransientFailures: 1, WithErrors: 4,
		Reasons: map[string]int64{"timeout": 1, "mapping_error": 1, "server_error": 1, "stuck_reclaimed": 1}}
	require.Equal(t, want, got)

	// The rotation empties their partition: the archive still counts them.
	db.Exec(t, `UPDATE outbox_events_rotation SET slot = 2`)
	db.Exec(t, `TRUNCATE outbox_events_1`)
	require.Zero(t, db.Int(t, `SELECT count(*) FROM outbox_events`))
	got, err = d.phaseEvents(context.Background(), from, lag)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// Each process's acks count from its own mark on; one started after the
// first mark counts whole, one dead by the second counts nothing.
func TestLagBetween(t *testing.T) {
	t.Parallel()
	hist := func(cum ...float64) harness.Histogram {
		return harness.Histogram{Bounds: []float64{1, 10, math.Inf(1)}, Cum: cum}
	}
	a, b, dead := &proc{}, &proc{}, &proc{}
	from := lagMark{a: hist(5, 6, 6), dead: hist(1, 1, 1)}
	to := lagMark{a: hist(8, 9, 10), b: hist(1, 2, 2)}
	require.Equal(t, []float64{4, 5, 6}, lagBetween(from, to).Cum)
	require.Zero(t, lagBetween(to, lagMark{}).Count(), "no process left")
}

// bulksSince counts a proxy's bulks from a time on, whatever their index,
// and no other request.
func TestBulksSince(t *testing.T) {
	t.Parallel()
	p := faultproxy.Start(t, harness.ElasticURL(t))
	post := func(path string) {
		resp, err := http.Post(p.URL()+path, "application/x-ndjson", strings.NewReader("\n"))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	post("/_bulk")
	since := time.Now()
	post("/i/_bulk")
	post("/_cluster/health")
	post("/_bulk")
	n, first := bulksSince(p, since)
	require.Equal(t, 2, n)
	require.Equal(t, p.Received()[1].Start, first)
	n, _ = bulksSince(p, time.Now())
	require.Zero(t, n)
}
