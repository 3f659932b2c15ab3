// Package promhist is a Prometheus-style histogram (cumulative "le" buckets)
// exported through VictoriaMetrics/metrics. The library's own histogram uses
// "vmrange" buckets, which Prometheus' histogram_quantile cannot read.
package promhist

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// Histogram counts observations into fixed buckets.
type Histogram struct {
	name   string // without labels
	labels string // `k="v"` pairs without braces, may be empty
	bounds []float64

	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	count  uint64
}

// LatencyBuckets spans 1ms to 60s.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

var (
	registerOnce sync.Once
	regMu        sync.Mutex
	registered   []*Histogram
)

// New registers a histogram named like `name{label="x"}` with the given upper bounds.
func New(name string, bounds []float64) *Histogram {
	base, labels, _ := strings.Cut(name, "{")
	h := &Histogram{name: base, labels: strings.TrimSuffix(labels, "}"), bounds: bounds, counts: make([]uint64, len(bounds)+1)}
	regMu.Lock()
	registered = append(registered, h)
	regMu.Unlock()
	registerOnce.Do(func() { metrics.RegisterMetricsWriter(writeAll) })
	return h
}

// Observe records one value.
func (h *Histogram) Observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.count++
	h.mu.Unlock()
}

func writeAll(w io.Writer) {
	regMu.Lock()
	hs := append([]*Histogram(nil), registered...)
	regMu.Unlock()
	typed := map[string]bool{}
	for _, h := range hs {
		if !typed[h.name] {
			fmt.Fprintf(w, "# TYPE %s histogram\n", h.name)
			typed[h.name] = true
		}
		h.write(w)
	}
}

func (h *Histogram) write(w io.Writer) {
	h.mu.Lock()
	counts := append([]uint64(nil), h.counts...)
	sum, count := h.sum, h.count
	h.mu.Unlock()
	sep := ""
	if h.labels != "" {
		sep = ","
	}
	var cum uint64
	for i, c := range counts {
		cum += c
		le := "+Inf"
		if i < len(h.bounds) {
			le = strconv.FormatFloat(h.bounds[i], 'g', -1, 64)
		}
		fmt.Fprintf(w, "%s_bucket{%s%sle=%q} %d\n", h.name, h.labels, sep, le, cum)
	}
	braces := ""
	if h.labels != "" {
		braces = "{" + h.labels + "}"
	}
	fmt.Fprintf(w, "%s_sum%s %s\n", h.name, braces, strconv.FormatFloat(sum, 'g', -1, 64))
	fmt.Fprintf(w, "%s_count%s %d\n", h.name, braces, count)
}
