package harness

import (
	"bufio"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// LatencyMetric is the daemon's histogram of insert-to-ack times: now() -
// created_at at the ack, the same definition as processed_at - created_at.
// A queued row that succeeds gets no processed_at, so tests and tools
// measure lag with this histogram instead.
const LatencyMetric = "outbox_event_latency_seconds"

// Histogram is an unlabelled Prometheus histogram as one scrape shows it:
// cumulative counts by upper bound ("le"), the last bound +Inf.
type Histogram struct {
	Bounds []float64
	Cum    []float64
}

// ParseHistogram reads histogram name from a Prometheus text scrape.
func ParseHistogram(scrape, name string) (Histogram, error) {
	var h Histogram
	sc := bufio.NewScanner(strings.NewReader(scrape))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			return h, fmt.Errorf("%s: malformed bucket %q", name, sc.Text())
		}
		bound, err := strconv.ParseFloat(strings.Replace(le, "+Inf", "Inf", 1), 64)
		if err != nil {
			return h, fmt.Errorf("%s: %w", sc.Text(), err)
		}
		c, err := strconv.ParseFloat(strings.TrimSpace(count), 64)
		if err != nil {
			return h, fmt.Errorf("%s: %w", sc.Text(), err)
		}
		h.Bounds, h.Cum = append(h.Bounds, bound), append(h.Cum, c)
	}
	if err := sc.Err(); err != nil {
		return h, err
	}
	if len(h.Bounds) == 0 {
		return h, fmt.Errorf("no histogram %s in the scrape", name)
	}
	return h, nil
}

// Histogram scrapes the replica's histogram name.
func (r *Replica) Histogram(name string) (Histogram, error) {
	scrape, err := r.Scrape()
	if err != nil {
		return Histogram{}, err
	}
	return ParseHistogram(scrape, name)
}

// Count is the number of observations.
func (h Histogram) Count() float64 {
	if len(h.Cum) == 0 {
		return 0
	}
	return h.Cum[len(h.Cum)-1]
}

// Add is the observations of h and o, two processes' histograms with the
// same buckets; either may be the zero Histogram (nothing observed).
func (h Histogram) Add(o Histogram) Histogram {
	return h.combine(o, 1)
}

// Sub is what was observed between an earlier scrape of the same process
// and h; the zero Histogram as earlier subtracts nothing.
func (h Histogram) Sub(earlier Histogram) Histogram {
	return h.combine(earlier, -1)
}

func (h Histogram) combine(o Histogram, sign float64) Histogram {
	if len(o.Bounds) == 0 {
		return h
	}
	if len(h.Bounds) == 0 {
		h = Histogram{Bounds: o.Bounds, Cum: make([]float64, len(o.Cum))}
	}
	out := Histogram{Bounds: h.Bounds, Cum: make([]float64, len(h.Cum))}
	for i := range h.Cum {
		out.Cum[i] = h.Cum[i] + sign*o.Cum[i]
	}
	return out
}

// Above is the number of observations greater than bound, which must be
// one of the bucket bounds: between two bounds a count cannot be told.
func (h Histogram) Above(bound float64) (float64, error) {
	for i, b := range h.Bounds {
		if b == bound {
			return h.Count() - h.Cum[i], nil
		}
	}
	return 0, fmt.Errorf("%v is no bucket bound of %v", bound, h.Bounds)
}

// Quantile is the upper bound of the bucket holding quantile q of the
// observations, as histogram_quantile would bound it; 0 with none.
func (h Histogram) Quantile(q float64) float64 {
	total := h.Count()
	if total == 0 {
		return 0
	}
	for i, c := range h.Cum {
		if c >= q*total {
			return h.Bounds[i]
		}
	}
	return math.Inf(1)
}

// Max bounds the largest observation: the upper bound of the highest
// bucket that holds one; 0 with none.
func (h Histogram) Max() float64 {
	for i := len(h.Cum) - 1; i > 0; i-- {
		if h.Cum[i] > h.Cum[i-1] {
			return h.Bounds[i]
		}
	}
	if len(h.Cum) > 0 && h.Cum[0] > 0 {
		return h.Bounds[0]
	}
	return 0
}

// Interpolated estimates quantile q as Prometheus' histogram_quantile
// does: linearly within the bucket that holds it, from the bound below
// (0 below the first); the highest finite bound if it is in +Inf's. A
// trend between two scrapes shows in it where the bucket bounds alone
// would jump by a factor of 2.5.
func (h Histogram) Interpolated(q float64) float64 {
	total := h.Count()
	if total == 0 {
		return 0
	}
	rank := q * total
	var below, belowCum float64
	for i, c := range h.Cum {
		if c >= rank && c > belowCum {
			if math.IsInf(h.Bounds[i], 1) {
				return below
			}
			return below + (h.Bounds[i]-below)*(rank-belowCum)/(c-belowCum)
		}
		below, belowCum = h.Bounds[i], c
	}
	return below
}
