package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Queued rows (migration 00018) are never written when they succeed: no
// processed_at, processing_started_at or locked_by to read a lag or a drain's
// end from. The lag comes from the replicas' own histograms, scraped at a
// window's start and end; the end of a drain from the ledger and the
// positions (lastAck).

// The daemon's histograms (consume/metrics.go). latencyMetric is now() -
// created_at at the ack, observed for every event acked (superseded ones
// included): the definition processed_at - created_at had.
const (
	latencyMetric = "outbox_event_latency_seconds"
	claimMetric   = "outbox_claim_duration_seconds"
	batchMetric   = "outbox_batch_duration_seconds"
)

// bucket is one histogram bucket: the observations in (lo, hi].
type bucket struct{ lo, hi, n float64 }

// hist is one histogram's buckets by upper bound; counts are per bucket,
// not cumulative, so that two scrapes subtract and two replicas add.
type hist map[float64]bucket

// parseHist reads histogram name from a Prometheus text scrape. The
// daemon writes cumulative "le" buckets (internal/promhist); VictoriaMetrics'
// own "vmrange" buckets are read too, so that a histogram moved to
// metrics.Histogram keeps its figures here. A histogram missing from the
// scrape is an error, not an empty one: the daemon registers its histograms
// at start, so a renamed one would otherwise read as no events.
func parseHist(scrape, name string) (hist, error) {
	if !strings.Contains(scrape, name+"_bucket{") && !strings.Contains(scrape, name+"_count") {
		return nil, fmt.Errorf("no histogram %s in the scrape", name)
	}
	h := hist{}
	// "le" buckets are cumulative within a series: by series (the labels
	// but le), each in bound order.
	series := map[string][]bucket{}
	sc := bufio.NewScanner(strings.NewReader(scrape))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+"_bucket{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sc.Text(), err)
		}
		if le, others, ok := cutLabel(labels, "le"); ok {
			hi, err := strconv.ParseFloat(strings.Replace(le, "+Inf", "Inf", 1), 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sc.Text(), err)
			}
			series[others] = append(series[others], bucket{hi: hi, n: n})
		} else if r, _, ok := cutLabel(labels, "vmrange"); ok {
			b, err := vmrange(r)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sc.Text(), err)
			}
			b.n = n
			h.addBucket(b)
		}
	}
	for _, cumulative := range series {
		slices.SortFunc(cumulative, func(a, b bucket) int { return cmp.Compare(a.hi, b.hi) })
		var lo, below float64
		for _, c := range cumulative {
			h.addBucket(bucket{lo: lo, hi: c.hi, n: c.n - below})
			lo, below = c.hi, c.n
		}
	}
	return h, sc.Err()
}

// cutLabel finds key="value" among a sample's labels, and returns the
// others too.
func cutLabel(labels, key string) (value, others string, found bool) {
	var rest []string
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, key+`="`); ok {
			value, found = strings.TrimSuffix(v, `"`), true
		} else {
			rest = append(rest, kv)
		}
	}
	return value, strings.Join(rest, ","), found
}

// vmrange parses "1.000e-02...1.136e-02".
func vmrange(r string) (bucket, error) {
	lo, hi, ok := strings.Cut(r, "...")
	if !ok {
		return bucket{}, fmt.Errorf("vmrange %q", r)
	}
	l, err := strconv.ParseFloat(lo, 64)
	if err != nil {
		return bucket{}, err
	}
	u, err := strconv.ParseFloat(hi, 64)
	return bucket{lo: l, hi: u}, err
}

func (h hist) addBucket(b bucket) {
	old := h[b.hi]
	old.lo, old.hi, old.n = b.lo, b.hi, old.n+b.n
	h[b.hi] = old
}

// plus is h and o added, o's counts multiplied by sign.
func (h hist) plus(o hist, sign float64) hist {
	out := hist{}
	for _, b := range h {
		out.addBucket(b)
	}
	for _, b := range o {
		out.addBucket(bucket{lo: b.lo, hi: b.hi, n: sign * b.n})
	}
	return out
}

// since is what was observed between an earlier scrape and h.
func (h hist) since(earlier hist) hist { return h.plus(earlier, -1) }

// sumHists adds histograms of consecutive windows.
func sumHists(hs []hist) hist {
	sum := hist{}
	for _, h := range hs {
		sum = sum.plus(h, 1)
	}
	return sum
}

func (h hist) count() float64 {
	var n float64
	for _, b := range h {
		n += b.n
	}
	return n
}

func (h hist) sorted() []bucket {
	bs := make([]bucket, 0, len(h))
	for _, b := range h {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.hi, b.hi) })
	return bs
}

// quantile estimates quantile q as Prometheus' histogram_quantile does:
// linearly within the bucket that holds it, so the true value lies
// between that bucket's bounds; the top bucket (+Inf) gives its lower
// bound. 0 when nothing was observed.
func (h hist) quantile(q float64) float64 {
	total := h.count()
	if total <= 0 {
		return 0
	}
	rank, below := q*total, 0.0
	for _, b := range h.sorted() {
		if b.n > 0 && below+b.n >= rank {
			if math.IsInf(b.hi, 1) {
				return b.lo
			}
			return b.lo + (b.hi-b.lo)*(rank-below)/b.n
		}
		below += b.n
	}
	return 0
}

// max is the upper bound of the highest bucket with an observation (its
// lower bound for +Inf): a histogram keeps no maximum.
func (h hist) max() float64 {
	bs := h.sorted()
	for i := len(bs) - 1; i >= 0; i-- {
		if bs[i].n > 0 {
			if math.IsInf(bs[i].hi, 1) {
				return bs[i].lo
			}
			return bs[i].hi
		}
	}
	return 0
}

// ms is the quantile in milliseconds, to a tenth.
func (h hist) ms(q float64) float64 { return round1(h.quantile(q) * 1000) }

// scrapeHists sums histogram name over every replica the bench runs: the
// leader acks, but after a change of leader both have observations, and a
// standby's are zero. A replica that exited took its counts along, so a
// difference with an earlier scrape would be wrong: an error.
func (b *bench) scrapeHists(name string) (hist, error) {
	sum := hist{}
	for _, r := range b.replicas {
		if !r.Alive() {
			return nil, fmt.Errorf("%s exited: its %s went with it", r.Name, name)
		}
		scrape, err := r.Scrape()
		if err != nil {
			return nil, err
		}
		h, err := parseHist(scrape, name)
		if err != nil {
			return nil, err
		}
		sum = sum.plus(h, 1)
	}
	return sum, nil
}

// scrapeLag is scrapeHists of the insert-to-ack histogram.
func (b *bench) scrapeLag() (hist, error) { return b.scrapeHists(latencyMetric) }

// lastAck is when the last event was acked, on the database's clock, once
// the outbox is drained: the newest processed_at of a claimed row, or the
// newest applied_at of the ledger, which an ack of a queued row writes in
// the same statement with the same now() (exact where every event moves
// the ledger, as each document of a drained backlog does). Without either
// (a projection without a ledger), the last checkpoint that confirmed
// events: late by up to the loop's second between checkpoints.
func (b *bench) lastAck(ctx context.Context) (time.Time, error) {
	var at *time.Time
	err := b.pool.QueryRow(ctx, `
		SELECT coalesce(greatest((SELECT max(processed_at) FROM outbox_events WHERE status = 'done'),
		                         (SELECT max(applied_at) FROM outbox_ledger)),
		                (SELECT max(confirmed_at) FROM outbox_positions))`).Scan(&at)
	if err != nil || at == nil {
		return time.Time{}, err
	}
	return *at, nil
}

// doneRows counts the done rows once the outbox is drained (waitDrained,
// which reads outbox_event_states): every queued row is done then, and
// reading status keeps the count off the view's per-row position test.
func (b *bench) doneRows(ctx context.Context) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE status IN ('done', 'queued')`).Scan(&n)
	return n, err
}
