package console

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/replay"
)

// filterFields are the fields of a failed-row filter, in the order a page
// shows them; the same names in a URL, a form and the audit row's "given".
var filterFields = []string{"projection", "reason", "class", "scope_key", "entity_type", "since", "until", "text"}

// filterLabels name the fields for people.
var filterLabels = map[string]string{
	"projection": "projection", "reason": "reason", "class": "class", "scope_key": "scope key",
	"entity_type": "entity type", "since": "failed since", "until": "failed until", "text": "last error contains",
}

// pageFields are the failed page's other parameters.
var pageFields = []string{"sort", "after", "before", "size"}

// classes are the error classes a filter may name.
var classes = []string{string(classify.Transient), string(classify.Deterministic)}

// badInput is a request the person can fix; its text is shown on the page.
type badInput struct{ msg string }

func (e badInput) Error() string { return e.msg }

func badf(format string, args ...any) error { return badInput{fmt.Sprintf(format, args...)} }

// typedFilter is a filter as typed: field to value, empty fields left out.
type typedFilter map[string]string

// readFilter takes the filter fields out of v, each at most once. It does
// not look at other fields.
func readFilter(v url.Values) (typedFilter, error) {
	t := typedFilter{}
	for _, f := range filterFields {
		vals := v[f]
		if len(vals) > 1 {
			return t, badf("the filter %s is given %d times; give it once", filterLabels[f], len(vals))
		}
		if len(vals) == 1 {
			if s := strings.TrimSpace(vals[0]); s != "" {
				t[f] = s
			}
		}
	}
	return t, nil
}

// onlyKnown refuses a URL with parameters the page does not know, so a
// misspelt filter is never silently ignored.
func onlyKnown(v url.Values, known ...[]string) error {
	var unknown []string
	for k := range v {
		if !slices.ContainsFunc(known, func(fs []string) bool { return slices.Contains(fs, k) }) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return badf("unknown filter %s: the failed rows filter by %s", strings.Join(quoteAll(unknown), ", "),
		strings.Join(filterFields, ", "))
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

// filter resolves the typed filter: times relative to now, class checked,
// an empty window refused.
func (t typedFilter) filter(now time.Time) (replay.Filter, error) {
	f := replay.Filter{Projection: t["projection"], Reason: t["reason"], Class: t["class"],
		ScopeKey: t["scope_key"], EntityType: t["entity_type"], Text: t["text"]}
	if f.Class != "" && !slices.Contains(classes, f.Class) {
		return f, badf("class %q is neither %s", f.Class, strings.Join(classes, " nor "))
	}
	var err error
	f.Since, f.Until, err = parseWindow(t["since"], t["until"], "failed ", now)
	return f, err
}

// parseWindow reads a time window's two ends (replay.ParseTime) and
// refuses an empty one; label prefixes the ends' names in messages.
func parseWindow(since, until, label string, now time.Time) (time.Time, time.Time, error) {
	s, err := replay.ParseTime(since, now)
	if err != nil {
		return s, time.Time{}, badf("%ssince: %v", label, err)
	}
	u, err := replay.ParseTime(until, now)
	if err != nil {
		return s, u, badf("%suntil: %v", label, err)
	}
	if !s.IsZero() && !u.IsZero() && !s.Before(u) {
		return s, u, badf("the time window is empty: %ssince %s is not before %suntil %s",
			label, formatTime(s), label, formatTime(u))
	}
	return s, u, nil
}

// describe is the filter in words, for a confirmation: "reason =
// mapping_error, failed since = 24h".
func (t typedFilter) describe() string {
	var parts []string
	for _, f := range filterFields {
		if v, ok := t[f]; ok {
			parts = append(parts, filterLabels[f]+" = "+v)
		}
	}
	if len(parts) == 0 {
		return "no filter"
	}
	return strings.Join(parts, ", ")
}

// values is t as URL parameters.
func (t typedFilter) values() url.Values {
	v := url.Values{}
	for k, s := range t {
		v.Set(k, s)
	}
	return v
}

// failedQuery is the request of the failed page or the archived page,
// parsed.
type failedQuery struct {
	// page is "failed" or "archived".
	page   string
	typed  typedFilter
	filter replay.Filter
	sort   replay.Sort
	after  *replay.Cursor
	before *replay.Cursor
	size   int
}

func parseFailedQuery(v url.Values, now time.Time, archived bool) (failedQuery, error) {
	q := failedQuery{page: "failed", sort: replay.SortDefault, size: replay.PageSizeDefault}
	if archived {
		q.page = "archived"
	}
	if err := onlyKnown(v, filterFields, pageFields); err != nil {
		return q, err
	}
	var err error
	if q.typed, err = readFilter(v); err != nil {
		return q, err
	}
	if q.filter, err = q.typed.filter(now); err != nil {
		return q, err
	}
	q.filter.Archived = archived
	if q.sort, err = replay.ParseSort(v.Get("sort")); err != nil {
		return q, badInput{err.Error()}
	}
	for _, c := range []struct {
		name string
		dst  **replay.Cursor
	}{{"after", &q.after}, {"before", &q.before}} {
		if s := v.Get(c.name); s != "" {
			cur, err := replay.ParseCursor(s)
			if err != nil {
				return q, badInput{err.Error()}
			}
			*c.dst = &cur
		}
	}
	if q.after != nil && q.before != nil {
		return q, badf("after and before exclude each other")
	}
	if s := v.Get("size"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || !replay.PageSizeRange.Contains(n) {
			return q, badf("size %q is not a number from %d to %d", s, replay.PageSizeRange.Min, replay.PageSizeRange.Max)
		}
		q.size = n
	}
	return q, nil
}

// url is q's page with its filter, sort and size, and extra.
func (q failedQuery) url(extra ...string) string {
	v := q.typed.values()
	if q.sort != replay.SortDefault {
		v.Set("sort", q.sort.String())
	}
	if q.size != replay.PageSizeDefault {
		v.Set("size", strconv.Itoa(q.size))
	}
	for i := 0; i+1 < len(extra); i += 2 {
		v.Set(extra[i], extra[i+1])
	}
	if len(v) == 0 {
		return Prefix + q.page
	}
	return Prefix + q.page + "?" + v.Encode()
}
