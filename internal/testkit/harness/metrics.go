package harness

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ParseMetric finds one sample in a Prometheus text scrape; name includes
// its labels, as the scrape spells them.
func ParseMetric(scrape, name string) (float64, bool, error) {
	sc := bufio.NewScanner(strings.NewReader(scrape))
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			if err != nil {
				return 0, false, fmt.Errorf("%s: %w", sc.Text(), err)
			}
			return f, true, nil
		}
	}
	return 0, false, sc.Err()
}

// HistogramQuantile is the upper bound of the bucket of an unlabelled
// Prometheus histogram in scrape that holds quantile q of its observations
// (0 when it has none), as histogram_quantile would bound it.
func HistogramQuantile(scrape, name string, q float64) (float64, error) {
	h, err := ParseHistogram(scrape, name)
	if err != nil {
		return 0, err
	}
	return h.Quantile(q), nil
}

// Scrape is the replica's /metrics.
func (r *Replica) Scrape() (string, error) {
	code, body, err := r.Get("/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("%s /metrics: %d %s", r.Name, code, body)
	}
	return string(body), nil
}

// Metric is one sample of the replica's /metrics.
func (r *Replica) Metric(name string) (float64, bool, error) {
	scrape, err := r.Scrape()
	if err != nil {
		return 0, false, err
	}
	return ParseMetric(scrape, name)
}

// Peak is the highest value a replica served for one metric. A killed
// process takes its counters along, so it is scraped all along its life.
type Peak struct {
	r    *Replica
	name string
	mu   sync.Mutex
	max  float64
}

// WatchPeak scrapes name every interval until the process exits.
func (r *Replica) WatchPeak(name string, every time.Duration) *Peak {
	p := &Peak{r: r, name: name}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			p.Scrape()
			select {
			case <-r.exited:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// Scrape reads the metric now: just before a kill, say.
func (p *Peak) Scrape() {
	v, ok, err := p.r.Metric(p.name)
	if err != nil || !ok {
		return
	}
	p.mu.Lock()
	p.max = max(p.max, v)
	p.mu.Unlock()
}

// Max is the highest value seen so far.
func (p *Peak) Max() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max
}
