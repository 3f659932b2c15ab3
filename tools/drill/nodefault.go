package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// What a node that stops answering, or answers 503, may cost (issue 31,
// items 6 and 7): the node list (projection/nodes.go) takes such a node
// out of the rotation after one short wait and sends its requests to
// another node, so the outbox sees nothing of it.
const (
	// nodeFaultBulkLimit is how many bulks a faulted node may get while
	// the fault lasts: those the leader's two bulk slots sent it before the
	// first one came back unanswered or 503. Before the node list a silent
	// node kept getting every other bulk, each waiting its whole deadline.
	nodeFaultBulkLimit = 2
	// nodeFaultLagLimit is the longest an event may wait from insert to
	// ack while a node is faulted: a silent node costs a bulk 1 s before
	// its node is probed and the probe's 3 s, then the resend. Before the
	// node list, 66 of 100 seconds had events waiting longer than this.
	nodeFaultLagLimit = 10 * time.Second
	// nodeReviveLimit is how soon after the fault ends the node must get
	// bulks again: its probes are at most 30 s apart and each waits at
	// most 3 s (the runbook's ~33 s), and a little for a busy machine.
	nodeReviveLimit = 35 * time.Second
)

// PhaseEvents is what the outbox and the replicas say of one phase of
// engine-node-loss, from its fault on.
type PhaseEvents struct {
	// Acked are the events the replicas acked from the phase's fault on
	// until the events written meanwhile were done (their latency
	// histograms, see lag.go); LagOverLimit of them waited longer than
	// nodeFaultLagLimit from insert to ack. LagP99Seconds is estimated
	// within its bucket, as histogram_quantile does; LagMaxSeconds is the
	// upper bound of the highest bucket that holds an ack.
	Acked         int64   `json:"events_acked"`
	LagOverLimit  int64   `json:"events_over_lag_limit"`
	LagP99Seconds float64 `json:"lag_p99_seconds"`
	LagMaxSeconds float64 `json:"lag_max_seconds"`
	// TransientFailures are events failed of a transient error since the
	// fault began.
	TransientFailures int64 `json:"events_failed_transient"`
	// WithErrors are events whose error history gained an entry since the
	// fault began: a failed attempt, or a reclaim. Reasons counts those
	// events by the entry's reason (a reclaim's is its event).
	WithErrors int64            `json:"events_with_errors"`
	Reasons    map[string]int64 `json:"error_reasons,omitempty"`
}

func (e PhaseEvents) notes() string {
	return fmt.Sprintf("%d events acked, lag p99 %.2f s, max %.2f s, %d over %s; %d with an error since, %d failed",
		e.Acked, e.LagP99Seconds, e.LagMaxSeconds, e.LagOverLimit, nodeFaultLagLimit, e.WithErrors, e.TransientFailures)
}

// errorsVerdict fails a phase in which an event failed of a transient
// error or used an attempt: one node lost while others answer must cost
// neither.
func (e PhaseEvents) errorsVerdict() []error {
	var errs []error
	if e.TransientFailures > 0 {
		errs = append(errs, fmt.Errorf("%d events failed of a transient error", e.TransientFailures))
	}
	if e.WithErrors > 0 {
		errs = append(errs, fmt.Errorf("%d events have an error in their history since the fault began (%v)", e.WithErrors, e.Reasons))
	}
	return errs
}

// NodeFault is one phase of engine-node-loss in which one node's fault
// proxy stopped answering ("silent") or answered every request 503, under
// load, and then forwarded again.
type NodeFault struct {
	Fault   string  `json:"fault"`
	Node    string  `json:"node"`
	Seconds float64 `json:"fault_seconds"`
	// BulksDuring are the bulks the node's proxy received while faulted.
	BulksDuring int `json:"bulks_to_node_during_fault"`
	// BackSeconds is from the end of the fault to the node's next bulk;
	// nil when none came within nodeReviveLimit.
	BackSeconds *float64 `json:"bulks_again_after_seconds"`
	PhaseEvents
}

func (f *NodeFault) notes() string {
	back := "no bulk within " + nodeReviveLimit.String() + " after"
	if f.BackSeconds != nil {
		back = fmt.Sprintf("bulks again %.1f s after", *f.BackSeconds)
	}
	return fmt.Sprintf("%s %s for %.0f s: %d bulks to it, %s; %s", f.Node, f.Fault, f.Seconds, f.BulksDuring, back, f.PhaseEvents.notes())
}

// verdict lists every promise the phase broke.
func (f *NodeFault) verdict() error {
	errs := f.errorsVerdict()
	if f.Acked == 0 {
		errs = append(errs, errors.New("no event was acked while the node was faulted: nothing was measured"))
	}
	if f.LagOverLimit > 0 {
		errs = append(errs, fmt.Errorf("%d events waited longer than %s from insert to ack (max at most %.1f s)", f.LagOverLimit, nodeFaultLagLimit, f.LagMaxSeconds))
	}
	if f.BulksDuring > nodeFaultBulkLimit {
		errs = append(errs, fmt.Errorf("the faulted node got %d bulks (limit %d): it stayed in the rotation", f.BulksDuring, nodeFaultBulkLimit))
	}
	if f.BackSeconds == nil || *f.BackSeconds > nodeReviveLimit.Seconds() {
		errs = append(errs, fmt.Errorf("the node got no bulk within %s after the fault ended: it was not brought back", nodeReviveLimit))
	}
	return phaseErr(f.Node+" "+f.Fault, errs)
}

// phaseErr is a phase's broken promises as one error naming the phase, nil
// if it broke none.
func phaseErr(phase string, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return fmt.Errorf("%s: %s", phase, strings.Join(msgs, "; "))
}

// nodeFault faults node i's proxy with f, of the kind named, for
// -node-outage under load, then clears it, waits for the node's bulks to
// come back and for the events written meanwhile to be done, and measures.
// The node itself stays in the cluster: only the replicas' path to it is
// faulted, so whatever the outbox sees comes from the client.
func (d *drill) nodeFault(ctx context.Context, sc *Scenario, i int, kind string, f faultproxy.Fault) (*NodeFault, error) {
	p := d.nodeProxies[i]
	nf := &NodeFault{Fault: kind, Node: d.cfg.Nodes.Names[i]}
	if _, _, _, err := d.settled(ctx); err != nil {
		return nf, err
	}
	t0, err := harness.Now(ctx, d.s.DB.Pool)
	if err != nil {
		return nf, err
	}
	mark, err := d.markLag()
	if err != nil {
		return nf, err
	}
	set := time.Now()
	p.Set(f)
	d.say("engine-node-loss: %s's proxy %s for %s", nf.Node, kind, d.cfg.NodeOutage)
	err = d.sampleUntil(ctx, sc, set.Add(d.cfg.NodeOutage))
	nf.BulksDuring, _ = bulksSince(p, set)
	cleared := time.Now()
	p.Clear()
	nf.Seconds = harness.Round3(cleared.Sub(set).Seconds())
	if err != nil {
		return nf, err
	}
	err = harness.PollAt(ctx, 100*time.Millisecond, nodeReviveLimit, nf.Node+"'s next bulk", func(context.Context) (bool, error) {
		n, first := bulksSince(p, cleared)
		if n > 0 {
			nf.BackSeconds = ptr(harness.Round3(first.Sub(cleared).Seconds()))
		}
		return n > 0, nil
	})
	if ctx.Err() != nil {
		return nf, err
	}
	if err := d.waitWritten(ctx, sc, "the events written during the fault to be done", nil); err != nil {
		return nf, err
	}
	nf.PhaseEvents, err = d.phaseEventsSince(ctx, t0, mark)
	d.say("engine-node-loss: %s", nf.notes())
	return nf, err
}

// bulksSince counts the bulks p received from since on, and says when
// the first of them came.
func bulksSince(p *faultproxy.Proxy, since time.Time) (n int, first time.Time) {
	for _, r := range p.Received() {
		if strings.HasSuffix(r.Path, "/_bulk") && !r.Start.Before(since) {
			if n == 0 {
				first = r.Start
			}
			n++
		}
	}
	return n, first
}

// phaseEventsSince is phaseEvents of a phase whose fault began at from
// (Postgres' clock), when the replicas' lag was marked.
func (d *drill) phaseEventsSince(ctx context.Context, from time.Time, mark lagMark) (PhaseEvents, error) {
	lag, err := d.lagSince(mark)
	if err != nil {
		return PhaseEvents{}, err
	}
	return d.phaseEvents(ctx, from, lag)
}

// phaseEvents is what the replicas' latency histograms observed in a phase
// whose fault began at from (Postgres' clock), and what the outbox says of
// the events that failed or gained an error since. It reads the whole
// outbox, as the drill does once per phase.
func (d *drill) phaseEvents(ctx context.Context, from time.Time, lag harness.Histogram) (PhaseEvents, error) {
	over, err := lag.Above(nodeFaultLagLimit.Seconds())
	if err != nil {
		return PhaseEvents{}, err
	}
	e := PhaseEvents{Acked: int64(lag.Count()), LagOverLimit: int64(over),
		LagP99Seconds: harness.Round3(lag.Interpolated(0.99)), LagMaxSeconds: lag.Max()}
	pool := d.s.DB.Pool
	if err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'failed' AND error_class = 'transient' AND updated_at >= $1),
		       count(*) FILTER (WHERE EXISTS (SELECT FROM jsonb_array_elements(error_history) h
		                                       WHERE (h->>'at')::timestamptz >= $1))
		  FROM `+harness.ArchivedEventStates, from).Scan(&e.TransientFailures, &e.WithErrors); err != nil {
		return e, err
	}
	rows, err := pool.Query(ctx, `
		SELECT coalesce(h->>'reason', h->>'event', '?'), count(DISTINCT o.id)
		  FROM `+harness.ArchivedEventStates+` o, jsonb_array_elements(o.error_history) h
		 WHERE (h->>'at')::timestamptz >= $1
		 GROUP BY 1`, from)
	if err != nil {
		return e, err
	}
	defer rows.Close()
	for rows.Next() {
		var reason string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			return e, err
		}
		if e.Reasons == nil {
			e.Reasons = map[string]int64{}
		}
		e.Reasons[reason] = n
	}
	return e, rows.Err()
}
