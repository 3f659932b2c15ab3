package harness

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// RunReport is what the reports of the drill and the bench start with.
type RunReport struct {
	StartedAt       time.Time `json:"started_at"`
	DurationSeconds float64   `json:"duration_seconds"`
	Versions        Versions  `json:"versions"`
	Database        string    `json:"database"`
	Index           string    `json:"index"`
	Problems        []string  `json:"problems,omitempty"`
}

// Problem records something that went wrong.
func (r *RunReport) Problem(p string) { r.Problems = append(r.Problems, p) }

// Stats summarises a few samples.
type Stats struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	// P99 is the nearest-rank 99th percentile: the maximum under 100
	// samples.
	P99     float64   `json:"p99"`
	Max     float64   `json:"max"`
	Samples []float64 `json:"samples"`
}

// NewStats is nil for no samples. Figures are rounded to 3 decimals.
func NewStats(samples []float64) *Stats {
	if len(samples) == 0 {
		return nil
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	rounded := make([]float64, len(samples))
	for i, v := range samples {
		rounded[i] = Round3(v)
	}
	p99 := s[int(math.Ceil(0.99*float64(len(s))))-1]
	return &Stats{Min: Round3(s[0]), Median: Round3(med), P99: Round3(p99), Max: Round3(s[len(s)-1]), Samples: rounded}
}

// Round3 rounds to 3 decimals, enough for milliseconds in seconds.
func Round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// Elapsed is the seconds since start, rounded for a report.
func Elapsed(start time.Time) float64 { return Round3(time.Since(start).Seconds()) }

// WriteJSON writes v, indented, to path, creating its directory.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
