package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/wlproj/wlproj/replay"
)

// lastErrorColumn is how much of an error message a table shows.
const lastErrorColumn = 60

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func formatAge(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// snippet is replay.Snippet with a dash for nothing.
func snippet(s string, n int) string { return dash(replay.Snippet(s, n)) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func optional(show bool, s string) string {
	if show {
		return s
	}
	return ""
}

// writeJSONLines prints each item as one line of JSON.
func writeJSONLines[T any](w io.Writer, items []T) error {
	enc := json.NewEncoder(w)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			return err
		}
	}
	return nil
}

// writeJSON prints v as one line.
func writeJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", b)
}
