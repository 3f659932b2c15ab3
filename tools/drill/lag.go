package main

import (
	"fmt"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// The lag from insert to ack is what the replicas measured at each ack
// (harness.LatencyMetric, now() - created_at then): a queued row that
// succeeds is never written, so it has no processed_at to read it from.

// lagMark is every live replica process's latency histogram at one moment.
type lagMark map[*proc]harness.Histogram

// markLag scrapes the latency histogram of every live replica process. A
// process that dies while it is scraped is left out, as if it had died
// just before.
func (d *drill) markLag() (lagMark, error) {
	d.procsMu.Lock()
	procs := append([]*proc(nil), d.procs...)
	d.procsMu.Unlock()
	m := lagMark{}
	for _, p := range procs {
		if !p.r.Alive() {
			continue
		}
		h, err := p.r.Histogram(harness.LatencyMetric)
		if err != nil && p.r.Alive() {
			return nil, fmt.Errorf("%s's %s: %w", p.r.Name, harness.LatencyMetric, err)
		}
		if err == nil {
			m[p] = h
		}
	}
	return m, nil
}

// lagBetween is what the processes observed from mark from to the later
// mark to: each one's histogram at to less its own at from (a process
// started in between counts whole). A process that died in between took
// its observations along: the figures are a lower bound then.
func lagBetween(from, to lagMark) harness.Histogram {
	var sum harness.Histogram
	for p, h := range to {
		sum = sum.Add(h.Sub(from[p]))
	}
	return sum
}

// lagSince is lagBetween from and now.
func (d *drill) lagSince(from lagMark) (harness.Histogram, error) {
	now, err := d.markLag()
	if err != nil {
		return harness.Histogram{}, err
	}
	return lagBetween(from, now), nil
}
