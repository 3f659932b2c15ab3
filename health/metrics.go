package health

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/VictoriaMetrics/metrics"

	"github.com/wlproj/wlproj/internal/buildinfo"
	"github.com/wlproj/wlproj/internal/metrichelp"
)

func init() { metrics.ExposeMetadata(true) }

func init() {
	metrichelp.Describe(map[string]string{
		"outbox_lag_events":              "Pending outbox events (due or waiting for a retry); exact up to 10000, estimated from the ids above.",
		"outbox_oldest_age_seconds":      "Age of the oldest pending outbox event.",
		"outbox_inflight_events":         "Outbox events in processing.",
		"outbox_stuck_processing_events": "Processing events past their lease or the max-processing cap.",
		"outbox_ready":                   "1 while this replica's readiness checks pass, else 0.",
		"wlproj_build_info":              "Always 1; its labels say which build of wlproj this replica runs.",
	})
	bi := buildinfo.Get()
	metrics.NewGauge(fmt.Sprintf(`wlproj_build_info{version=%q,revision=%q,goversion=%q}`, bi.Version, bi.Revision, bi.GoVersion),
		func() float64 { return 1 })
}

// dropped are library series that promtool's linter rejects for their names
// (a counter without _total, or a gauge with it); the rest of the Go and
// process metrics stay.
func dropped(name string) bool {
	switch name {
	case "go_cgo_calls_count", "go_cpu_count", "go_gc_forced_count":
		return true
	}
	return strings.HasPrefix(name, "process_io_")
}

func serveMetrics(w http.ResponseWriter, _ *http.Request) {
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, true)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeLintClean(w, &buf)
}

// writeLintClean fills empty HELP lines, adds missing ones, and drops the
// series in dropped.
func writeLintClean(w io.Writer, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	helped := map[string]bool{}
	out := bufio.NewWriter(w)
	defer out.Flush()
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, text, _ := strings.Cut(rest, " ")
			if dropped(name) {
				continue
			}
			if text == "" {
				text = helpFor(name)
			}
			helped[name] = true
			out.WriteString("# HELP " + name + " " + text + "\n")
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, _, _ := strings.Cut(rest, " ")
			if dropped(name) {
				continue
			}
			if !helped[name] {
				helped[name] = true
				out.WriteString("# HELP " + name + " " + helpFor(name) + "\n")
			}
			out.WriteString(line + "\n")
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if dropped(name) {
			continue
		}
		out.WriteString(line + "\n")
	}
}

func helpFor(name string) string {
	if h, ok := metrichelp.Help(name); ok {
		return h
	}
	return "Go runtime or process metric."
}
