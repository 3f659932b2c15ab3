// Package metrichelp holds the HELP text of every wlproj series, written by
// the package that owns the series next to where it creates them:
// VictoriaMetrics/metrics exposes no help text of its own, and promtool's
// linter wants one. health's /metrics reads it back.
package metrichelp

import "sync"

var (
	mu   sync.RWMutex
	help = map[string]string{}
)

// Describe records the help text of each series name (without labels).
func Describe(texts map[string]string) {
	mu.Lock()
	defer mu.Unlock()
	for name, text := range texts {
		help[name] = text
	}
}

// Help returns the text Describe recorded for name.
func Help(name string) (string, bool) {
	mu.RLock()
	defer mu.RUnlock()
	text, ok := help[name]
	return text, ok
}
