package replay

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseTime reads a time bound as an operator writes it: RFC3339, a date
// (UTC midnight), or a duration (ParseAgo) meaning that long before now.
// Empty is the zero time: no bound. The CLI's --since/--until and the
// console's time window both read it.
func ParseTime(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	if d, ok := ParseAgo(v); ok && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC3339 time (2006-01-02T15:04:05Z), a date, nor a duration like 24h or 7d", v)
}

// ParseAgo reads a duration in Go syntax or in whole days (7d). It may be
// negative; the caller decides what that means.
func ParseAgo(v string) (time.Duration, bool) {
	const day = 24 * time.Hour
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err == nil && n <= int64(math.MaxInt64/day) && n >= int64(math.MinInt64/day) {
			return time.Duration(n) * day, true
		}
		return 0, false
	}
	d, err := time.ParseDuration(v)
	return d, err == nil
}
