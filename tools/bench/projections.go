package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// TwoProjections is step 17: the same documents drained end to end by one
// leader into one search projection, and split between two search
// projections of a projections file, each with an index of its own on the
// same engine, in turn, -pairs times.
type TwoProjections struct {
	Events int           `json:"events"`
	One    []*Throughput `json:"one_projection"`
	Two    []*Throughput `json:"two_projections"`
	// Ratios are each round's two ÷ one total events/s.
	Ratios      []float64 `json:"ratios"`
	MedianRatio float64   `json:"median_ratio"`
}

// twoProjectionsGoal is the issue's: two projections sharing a leader
// drain at least this share of one projection's total events/s.
const twoProjectionsGoal = 0.9

// twoProjectionNames are the file's search projections; the events
// alternate between them.
var twoProjectionNames = []string{"books", "blocks"}

// 17. One projection against two sharing one leader.
func (b *bench) twoProjections(ctx context.Context) error {
	tp := &TwoProjections{Events: b.cfg.Docs}
	file, err := b.projectionsFile()
	if err != nil {
		return err
	}
	for round := range b.cfg.Pairs {
		// Every other round the other way round, so that neither side
		// always runs on a warmer engine.
		one, two, err := b.projectionsRound(ctx, file, round%2 == 1)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		tp.One, tp.Two = append(tp.One, one), append(tp.Two, two)
		tp.Ratios = append(tp.Ratios, harness.Round3(two.EventsPerSec/one.EventsPerSec))
		b.say("projections, round %d: one %.0f events/s, two %.0f events/s: %.3f", round+1, one.EventsPerSec, two.EventsPerSec,
			tp.Ratios[round])
	}
	tp.MedianRatio = harness.Round3(median(tp.Ratios))
	b.rep.TwoProjections = tp
	return nil
}

// projectionsRound runs one projection, then two (twoFirst: the other
// way round).
func (b *bench) projectionsRound(ctx context.Context, file string, twoFirst bool) (one, two *Throughput, err error) {
	runOne := func() error {
		one, _, err = b.e2eRun(ctx, "")
		return err
	}
	runTwo := func() error {
		two, err = b.twoProjectionsRun(ctx, file)
		return err
	}
	runs := []func() error{runOne, runTwo}
	if twoFirst {
		runs = []func() error{runTwo, runOne}
	}
	for _, run := range runs {
		if err := run(); err != nil {
			return nil, nil, err
		}
	}
	return one, two, nil
}

// projectionsFile writes the projections file of the two search
// projections, on the bench's engine.
func (b *bench) projectionsFile() (string, error) {
	var body strings.Builder
	body.WriteString("projections:\n")
	for _, name := range twoProjectionNames {
		fmt.Fprintf(&body, "  %s:\n    kind: search\n    engine: {urls: [%s]}\n    index: %s\n", name, b.cfg.ElasticURL, b.index+"-"+name)
	}
	dir, err := os.MkdirTemp("", "wlproj-bench-projections.")
	if err != nil {
		return "", err
	}
	b.s.OnClose(func() { _ = os.RemoveAll(dir) })
	file := filepath.Join(dir, "projections.yaml")
	return file, os.WriteFile(file, []byte(body.String()), 0o644)
}

// twoProjectionsRun loads the documents as queued events, alternating
// between the two projections, and times a leader of the file draining
// them; then it checks each index holds its half and drops both.
func (b *bench) twoProjectionsRun(ctx context.Context, file string) (*Throughput, error) {
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	if err := b.loadEventsTo(ctx, b.cfg.Docs, twoProjectionNames); err != nil {
		return nil, err
	}
	if err := b.vacuum(ctx); err != nil {
		return nil, err
	}
	cpu0 := b.sampleCPU()
	r, t0, err := b.startLeader(ctx, "two", "OUTBOX_PROJECTIONS_FILE="+file)
	if err != nil {
		return nil, err
	}
	if err := waitProcessedAll(ctx, r, twoProjectionNames, b.cfg.Docs, b.drainTimeout(b.cfg.Docs)); err != nil {
		return nil, err
	}
	last, failed, err := b.waitDrained(ctx, stepTimeout)
	if err != nil {
		return nil, err
	}
	cpu := b.sampleCPU().since(cpu0)
	b.stopReplicas()
	if failed > 0 {
		return nil, fmt.Errorf("%d events failed", failed)
	}
	for i, name := range twoProjectionNames {
		index := b.index + "-" + name
		n, err := harness.DocCount(ctx, b.cfg.ElasticURL, index)
		if err != nil {
			return nil, err
		}
		if want := (b.cfg.Docs + len(twoProjectionNames) - 1 - i) / len(twoProjectionNames); n != want {
			return nil, fmt.Errorf("%s holds %d documents, want %d", index, n, want)
		}
		if err := harness.DeleteIndex(ctx, b.cfg.ElasticURL, index+"*"); err != nil {
			return nil, err
		}
	}
	return newThroughput(b.cfg.Docs, last.Sub(t0).Seconds(), cpu), nil
}

// waitProcessedAll is waitProcessed over the sum of projections' counters.
func waitProcessedAll(ctx context.Context, r *harness.Replica, projections []string, n int, timeout time.Duration) error {
	return harness.PollAt(ctx, 200*time.Millisecond, timeout, fmt.Sprintf("%s to ack %d events", r.Name, n),
		func(context.Context) (bool, error) {
			var acked float64
			for _, p := range projections {
				v, _, err := r.Metric(fmt.Sprintf(`outbox_processed_total{projection=%q}`, p))
				if err != nil {
					return false, err
				}
				acked += v
			}
			return acked >= float64(n), nil
		})
}

func twoProjectionsTargets(r *Report, add addTarget) {
	tp := r.TwoProjections
	if tp == nil || len(tp.Ratios) == 0 {
		return
	}
	add(fmt.Sprintf("two search projections sharing one leader ÷ one, total events/s, median of %d rounds", len(tp.Ratios)),
		fmt.Sprintf(">= %.1f", twoProjectionsGoal), tp.MedianRatio, "ratio", tp.MedianRatio >= twoProjectionsGoal)
}

func twoProjectionsRows(r *Report, tw io.Writer) {
	tp := r.TwoProjections
	if tp == nil || len(tp.Ratios) == 0 {
		return
	}
	one, two := make([]string, len(tp.One)), make([]string, len(tp.Two))
	for i := range tp.One {
		one[i], two[i] = fmt.Sprintf("%.0f", tp.One[i].EventsPerSec), fmt.Sprintf("%.0f", tp.Two[i].EventsPerSec)
	}
	fmt.Fprintf(tw, "17 two projections ÷ one, %d events\tmedian %.3f (one %s; two %s; min %.3f)\t\n", tp.Events, tp.MedianRatio,
		strings.Join(one, ", "), strings.Join(two, ", "), slices.Min(tp.Ratios))
}
