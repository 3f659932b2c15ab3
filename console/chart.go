package console

import (
	"fmt"

	"github.com/wlproj/wlproj/outbox"
)

// The overview's charts are SVG drawn on the server: a bar per minute, each
// with a <title> the browser shows on hover. No script, no library.

const (
	chartWidth  = 600.0
	chartHeight = 100.0
)

type chart struct {
	Title string
	Class string
	Total int64
	Max   int64
	Bars  []bar
	// Width and Height are the plot's; the SVG adds room for the labels.
	Width, Height float64
	From, To      string
}

type bar struct {
	X, Y, W, H float64
	Title      string
}

// activityCharts draws the acks and the terminal failures per bucket, each
// on its own scale: failures are few next to acks, and must not vanish.
func activityCharts(buckets []outbox.Bucket) (done, failed chart) {
	done = barChart("acked done per minute", "done", buckets, func(b outbox.Bucket) int64 { return b.Done })
	failed = barChart("failed per minute", "failed", buckets, func(b outbox.Bucket) int64 { return b.Failed })
	return done, failed
}

func barChart(title, class string, buckets []outbox.Bucket, value func(outbox.Bucket) int64) chart {
	c := chart{Title: title, Class: class, Width: chartWidth, Height: chartHeight}
	for _, b := range buckets {
		v := value(b)
		c.Total += v
		c.Max = max(c.Max, v)
	}
	if len(buckets) == 0 {
		return c
	}
	c.From, c.To = buckets[0].At.UTC().Format("15:04"), buckets[len(buckets)-1].At.UTC().Format("15:04")
	w := chartWidth / float64(len(buckets))
	for i, b := range buckets {
		v := value(b)
		h := 0.0
		if c.Max > 0 {
			h = chartHeight * float64(v) / float64(c.Max)
		}
		if v > 0 && h < 1 {
			h = 1 // a count is never drawn as nothing
		}
		c.Bars = append(c.Bars, bar{X: round2(float64(i) * w), Y: round2(chartHeight - h), W: round2(w * 0.85), H: round2(h),
			Title: fmt.Sprintf("%s UTC: %d", b.At.UTC().Format("15:04"), v)})
	}
	return c
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
