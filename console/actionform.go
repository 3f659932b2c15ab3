package console

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/replay"
)

// The form of an action (a dry run or the action itself): what it selects,
// by ticked ids or by a filter the action accepts, read into an actionForm
// and turned into a replay.Request; its words for people; the hidden fields
// that carry it from the dry run to the confirmation.

// actionForm is the POST of a dry run or an action.
type actionForm struct {
	kind string
	// One of ids (a row or a selection) or typed (every row the filter
	// matches).
	ids   []int64
	typed typedFilter
	// given is the filter as first typed ("since 24h"), where typed holds
	// it resolved ("since 2025-…"), so a confirmation acts on the window
	// its dry run saw.
	given typedFilter
	// cutoff is an archive's older_than resolved: rows that failed before
	// it move. olderThan is what was first typed ("30d").
	cutoff        time.Time
	olderThan     string
	yes           bool
	token         string
	why           string
	resetAttempts bool
}

// actionFields are the fields of an action's form besides the filter.
var actionFields = []string{"csrf", "action", "scope", "id", "ids", "yes", "token", "why", "reset_attempts", "given",
	"older_than"}

func parseActionForm(v url.Values, now time.Time) (actionForm, error) {
	a := actionForm{kind: v.Get("action"), yes: v.Get("yes") == "1", token: v.Get("token"),
		why: strings.TrimSpace(v.Get("why")), resetAttempts: v.Get("reset_attempts") == "1"}
	kind, ok := actionKinds[a.kind]
	if !ok {
		return a, badf("unknown action %q: %s", a.kind, actionNames)
	}
	if err := onlyKnown(v, filterFields, actionFields); err != nil {
		return a, err
	}
	var given url.Values
	if g := v.Get("given"); g != "" {
		var err error
		if given, err = url.ParseQuery(g); err != nil {
			return a, badf("given: %v", err)
		}
	}
	if kind.aged {
		var err error
		if a.cutoff, err = parseOlderThan(v.Get("older_than"), now); err != nil {
			return a, err
		}
		a.olderThan = cmp.Or(given.Get("older_than"), strings.TrimSpace(v.Get("older_than")))
	}
	switch v.Get("scope") {
	case "ids":
		return a, a.readIDs(v)
	case "filter":
		return a, a.readFilter(v, kind, given)
	}
	return a, badf("say which rows: scope is ids or filter")
}

// readIDs reads the ticked rows (id, repeated) and the typed ones (ids).
func (a *actionForm) readIDs(v url.Values) error {
	for _, s := range v["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return badf("%q is not an event id", s)
		}
		a.ids = append(a.ids, id)
	}
	if s := v.Get("ids"); s != "" {
		ids, err := replay.ParseIDs(s)
		if err != nil {
			return badf("ids: %v", err)
		}
		a.ids = append(a.ids, ids...)
	}
	if len(a.ids) == 0 {
		return badf("no rows are selected: tick the rows to %s first", a.kind)
	}
	return nil
}

// readFilter reads the filter an action by filter takes: one the action
// accepts, and not empty unless the action is aged (archive). given is
// what the person first typed, when a confirmation sends it back.
func (a *actionForm) readFilter(v url.Values, kind actionKind, given url.Values) error {
	if kind.filters == nil {
		return badf("%s takes ticked rows only: %s events are chosen by id", a.kind, kind.rows)
	}
	var err error
	if a.typed, err = readFilter(v); err != nil {
		return err
	}
	if len(a.typed) == 0 && !kind.aged {
		return badf("acting on every failed row needs a filter: with none it would take all of them; " +
			"filter first, e.g. by projection and reason")
	}
	var other []string
	for _, f := range filterFields {
		if _, ok := a.typed[f]; ok && !slices.Contains(kind.filters, f) {
			other = append(other, filterLabels[f])
		}
	}
	if len(other) > 0 {
		return badf("%s selects by %s only, as the CLI's %s does: take %s out of the filter, or tick the rows",
			a.kind, strings.Join(labels(kind.filters), " and "), kind.cli, strings.Join(other, ", "))
	}
	a.given = a.typed
	if given != nil {
		if a.given, err = readFilter(given); err != nil {
			return err
		}
	}
	return nil
}

// parseOlderThan reads an archive's age: a duration ago as typed, or the
// time a dry run resolved it to, which its confirmation sends back.
func parseOlderThan(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, badf("say how long ago the rows must have failed to be archived: older than, e.g. 30d " +
			"(the CLI's --older-than)")
	}
	if d, ok := replay.ParseAgo(s); ok {
		if d <= 0 {
			return time.Time{}, badf("older than %q: must be positive, e.g. 30d", s)
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, badf("older than %q is not a duration like 720h or 30d", s)
}

// labels are the filter fields' names for people.
func labels(fields []string) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = filterLabels[f]
	}
	return out
}

// request is the replay.Request of a, as user. An archive's cut-off is its
// Until, which archive passes on as the cut-off.
func (a actionForm) request(user string, now time.Time, dryRun bool) (replay.Request, error) {
	kind := actionKinds[a.kind]
	req := replay.Request{IDs: a.ids, By: user, Why: a.why, DryRun: dryRun, Yes: a.yes, Max: replay.MaxDefault,
		ResetAttempts: a.resetAttempts && kind.resets, Given: map[string]string{"via": "console"}}
	if dryRun {
		req.Why = dryRunWhy
	} else {
		req.Expect = a.token
	}
	if kind.aged {
		req.Until = a.cutoff
		req.Given["older-than"] = a.olderThan
	}
	if len(a.ids) > 0 {
		req.Given["ids"] = replay.FormatIDs(a.ids)
		return req, nil
	}
	f, err := a.typed.filter(now)
	if err != nil {
		return req, err
	}
	req.Projection, req.Reason, req.Class, req.ScopeKey, req.EntityType, req.Text =
		f.Projection, f.Reason, f.Class, f.ScopeKey, f.EntityType, f.Text
	if !kind.aged {
		req.Since, req.Until = f.Since, f.Until
	}
	for k, v := range a.given {
		req.Given[k] = v
	}
	return req, nil
}

// describe says which rows a names, for people.
func (a actionForm) describe() string {
	if len(a.ids) == 0 {
		return "every " + actionKinds[a.kind].rows + " event matching " + a.criteria()
	}
	s := "the selected events " + replay.FormatIDs(a.ids)
	if len(a.ids) == 1 {
		s = "event " + strconv.FormatInt(a.ids[0], 10)
	}
	if !a.cutoff.IsZero() {
		s += " that failed " + a.age()
	}
	return s
}

// criteria is a filter's selectors in words: "reason = timeout, failed
// more than 30d ago (before …)".
func (a actionForm) criteria() string {
	var parts []string
	if len(a.given) > 0 {
		parts = append(parts, a.given.describe())
	}
	if !a.cutoff.IsZero() {
		parts = append(parts, "failed "+a.age())
	}
	return strings.Join(parts, ", ")
}

// age is an archive's cut-off in words: "more than 30d ago (before …)".
func (a actionForm) age() string {
	if _, ok := replay.ParseAgo(a.olderThan); ok {
		return fmt.Sprintf("more than %s ago (before %s)", a.olderThan, formatTime(a.cutoff))
	}
	return "before " + formatTime(a.cutoff)
}

// none says that nothing matched a.
func (a actionForm) none() string {
	kind := actionKinds[a.kind]
	what := a.describe()
	if len(a.ids) == 0 {
		what = a.criteria()
	}
	return fmt.Sprintf("No %s events match %s: nothing to %s. Nothing changed.", kind.rows, what, kind.verb)
}

// hidden are the form fields that name a's rows again, resolved, for the
// confirmation and for a new dry run.
func (a actionForm) hidden(now time.Time) []field {
	fs := []field{{Name: "action", Value: a.kind}}
	given := a.given.values()
	if !a.cutoff.IsZero() {
		fs = append(fs, field{Name: "older_than", Value: a.cutoff.UTC().Format(time.RFC3339Nano)})
		given.Set("older_than", a.olderThan)
	}
	if len(given) > 0 {
		fs = append(fs, field{Name: "given", Value: given.Encode()})
	}
	if len(a.ids) > 0 {
		return append(fs, field{Name: "scope", Value: "ids"}, field{Name: "ids", Value: replay.FormatIDs(a.ids)})
	}
	fs = append(fs, field{Name: "scope", Value: "filter"})
	resolved, _ := a.typed.filter(now)
	for _, f := range filterFields {
		v, ok := a.typed[f]
		if !ok {
			continue
		}
		switch f {
		case "since":
			v = resolved.Since.UTC().Format(time.RFC3339Nano)
		case "until":
			v = resolved.Until.UTC().Format(time.RFC3339Nano)
		}
		fs = append(fs, field{Name: f, Value: v})
	}
	return fs
}

// field is a form field: a hidden one, or an input of a filter form.
type field struct {
	Name, Label, Value, Placeholder string
	Options                         []option
}

type option struct {
	Value, Label string
	Selected     bool
}
