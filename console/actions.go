package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/replay"
)

// The actions on failed rows. Each is two POSTs: a dry run, which shows
// exactly which rows and how many, and the action itself, confirmed with a
// why and held to the dry run's rows by its token. Both go through replay's
// action path, as the CLI's replay and failed discard do.

// actionKinds are the actions on failed rows, by form value.
var actionKinds = map[string]struct {
	do    func(context.Context, replay.Beginner, replay.Request) (replay.Report, error)
	verb  string // "replay"
	done  string // "replayed"
	where string // " to pending"
}{
	"replay":  {replay.Replay, "replay", "replayed", " to pending"},
	"discard": {replay.Discard, "discard", "discarded", " (closed for good)"},
}

// confirmShown is how many of the selected rows a confirmation lists; the
// count and the token cover all of them.
const confirmShown = 50

// dryRunWhy is the why of a dry run: replay requires one, and a dry run
// writes no audit row for it to go to.
const dryRunWhy = "console dry run"

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
	given         typedFilter
	yes           bool
	token         string
	why           string
	resetAttempts bool
}

// actionFields are the fields of an action's form besides the filter.
var actionFields = []string{"csrf", "action", "scope", "id", "ids", "yes", "token", "why", "reset_attempts", "given"}

func parseActionForm(v url.Values) (actionForm, error) {
	a := actionForm{kind: v.Get("action"), yes: v.Get("yes") == "1", token: v.Get("token"),
		why: strings.TrimSpace(v.Get("why")), resetAttempts: v.Get("reset_attempts") == "1"}
	if _, ok := actionKinds[a.kind]; !ok {
		return a, badf("unknown action %q: replay or discard", a.kind)
	}
	if err := onlyKnown(v, filterFields, actionFields); err != nil {
		return a, err
	}
	switch v.Get("scope") {
	case "ids":
		for _, s := range v["id"] {
			id, err := strconv.ParseInt(s, 10, 64)
			if err != nil || id <= 0 {
				return a, badf("%q is not an event id", s)
			}
			a.ids = append(a.ids, id)
		}
		if s := v.Get("ids"); s != "" {
			ids, err := replay.ParseIDs(s)
			if err != nil {
				return a, badf("ids: %v", err)
			}
			a.ids = append(a.ids, ids...)
		}
		if len(a.ids) == 0 {
			return a, badf("no rows are selected: tick the rows to %s first", a.kind)
		}
	case "filter":
		var err error
		if a.typed, err = readFilter(v); err != nil {
			return a, err
		}
		if len(a.typed) == 0 {
			return a, badf("acting on every failed row needs a filter: with none it would take all of them; " +
				"filter first, e.g. by projection and reason")
		}
		a.given = a.typed
		if g := v.Get("given"); g != "" {
			gv, err := url.ParseQuery(g)
			if err != nil {
				return a, badf("given: %v", err)
			}
			if a.given, err = readFilter(gv); err != nil {
				return a, err
			}
		}
	default:
		return a, badf("say which rows: scope is ids or filter")
	}
	return a, nil
}

// request is the replay.Request of a, as user.
func (a actionForm) request(user string, now time.Time, dryRun bool) (replay.Request, error) {
	req := replay.Request{IDs: a.ids, By: user, Why: a.why, DryRun: dryRun, Yes: a.yes, Max: replay.MaxDefault,
		ResetAttempts: a.resetAttempts && a.kind == "replay", Given: map[string]string{"via": "console"}}
	if dryRun {
		req.Why = dryRunWhy
	} else {
		req.Expect = a.token
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
	req.Since, req.Until = f.Since, f.Until
	for k, v := range a.given {
		req.Given[k] = v
	}
	return req, nil
}

// describe says which rows a names, for people.
func (a actionForm) describe() string {
	if len(a.ids) > 0 {
		if len(a.ids) == 1 {
			return "event " + strconv.FormatInt(a.ids[0], 10)
		}
		return "the selected events " + replay.FormatIDs(a.ids)
	}
	return "every failed event matching " + a.given.describe()
}

// hidden are the form fields that name a's rows again, resolved, for the
// confirmation and for a new dry run.
func (a actionForm) hidden(now time.Time) []field {
	fs := []field{{Name: "action", Value: a.kind}}
	if len(a.ids) > 0 {
		return append(fs, field{Name: "scope", Value: "ids"}, field{Name: "ids", Value: replay.FormatIDs(a.ids)})
	}
	fs = append(fs, field{Name: "scope", Value: "filter"}, field{Name: "given", Value: a.given.values().Encode()})
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

// confirmView is the dry run's page: what would change, and the form that
// changes it.
type confirmView struct {
	Kind, Verb, Done string
	What             string
	Count            int
	Shown            []replay.FailedEvent
	Token            string
	Hidden           []field
	Why              string
	Replay           bool
	// Matching and Max are set when the cap refused: Yes lifts it.
	Matching int64
	Max      int
	Yes      bool
}

func (c *Console) dryRun(w http.ResponseWriter, r *http.Request) {
	a, err := parseActionForm(r.PostForm)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	c.confirm(w, r, a, http.StatusOK, "")
}

// confirm runs the dry run of a and shows its confirmation, with msg as
// the error line.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request, a actionForm, status int, msg string) {
	now := time.Now()
	kind := actionKinds[a.kind]
	req, err := a.request(requestOf(r).user.Name, now, true)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	rep, err := kind.do(r.Context(), c.deps.Pool, req)
	v := confirmView{Kind: a.kind, Verb: kind.verb, Done: kind.done, What: a.describe(), Hidden: a.hidden(now),
		Why: a.why, Replay: a.kind == "replay", Max: replay.MaxDefault, Yes: a.yes}
	var refused *replay.RefusedError
	switch {
	case errors.As(err, &refused) && refused.Max > 0:
		v.Matching = refused.Matching
		c.renderError(w, r, http.StatusOK, "confirm", "Dry run", v, msg)
		return
	case errors.As(err, &refused):
		c.refuse(w, r, http.StatusConflict, fmt.Sprintf("The dry run refused: %s. Nothing changed.",
			strings.Join(refused.Problems, "; ")))
		return
	case c.refused(w, r, err, len(rep.Events), a.describe(), kind.verb):
		return
	}
	v.Count, v.Token = len(rep.Events), rep.Token
	v.Shown = rep.Events[:min(len(rep.Events), confirmShown)]
	c.renderError(w, r, status, "confirm", "Dry run", v, msg)
}

// isBad says whether err is the request's fault, with a text to show.
func isBad(err error) bool {
	var bad badInput
	var field *bounds.FieldError
	return errors.As(err, &bad) || errors.As(err, &field) || errors.Is(err, replay.ErrNoSelector) ||
		errors.Is(err, replay.ErrAuditRequired)
}

// refuse shows msg on a page of its own: nothing was changed.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.renderError(w, r, status, "message", "Nothing changed", nil, msg)
}

// retryView is a refusal of a confirmed action, with the form that runs
// the dry run again.
type retryView struct {
	Hidden []field
}

func (c *Console) apply(w http.ResponseWriter, r *http.Request) {
	a, err := parseActionForm(r.PostForm)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if a.token == "" {
		c.refuse(w, r, http.StatusBadRequest, "Run the dry run first: an action needs the token of the dry run it confirms.")
		return
	}
	if a.why == "" {
		c.confirm(w, r, a, http.StatusBadRequest, "Say why: the reason goes to the audit row with your name.")
		return
	}
	u := requestOf(r).user
	now := time.Now()
	kind := actionKinds[a.kind]
	req, err := a.request(u.Name, now, false)
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	rep, err := kind.do(r.Context(), c.deps.Pool, req)
	var refused *replay.RefusedError
	switch {
	case errors.As(err, &refused):
		// The dry run saw these rows takeable: whatever refuses now changed
		// since, by someone else's hand or the leader's.
		why := strings.Join(refused.Problems, "; ")
		if refused.Changed {
			why = fmt.Sprintf("%d failed events match now, not the ones you confirmed", refused.Matching)
		}
		msg := fmt.Sprintf("The %s was refused because the rows changed since the dry run: %s. Nothing changed. "+
			"Run the dry run again to see the rows as they are now.", kind.verb, why)
		c.renderError(w, r, http.StatusConflict, "message", "Nothing changed", retryView{Hidden: a.hidden(now)}, msg)
		return
	case c.refused(w, r, err, len(rep.Events), a.describe(), kind.verb):
		return
	}
	c.deps.Log.Info().Str("user", u.Name).Str("action", a.kind).Int("events", len(rep.Events)).
		Int64("audit_id", rep.AuditID).Str("why", a.why).Msg("console action")
	http.Redirect(w, r, Prefix+"audit/"+strconv.FormatInt(rep.AuditID, 10)+"?notice="+kind.done, http.StatusSeeOther)
}

// refused answers a bad request, an error, or a selection of no rows (the
// token of no rows matched: nothing was there), and says whether it did.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, err error, rows int, described, verb string) bool {
	switch {
	case isBad(err):
		c.refuse(w, r, http.StatusBadRequest, err.Error())
	case err != nil:
		c.fail(w, r, err)
	case rows == 0:
		c.refuse(w, r, http.StatusOK, fmt.Sprintf("No failed events match %s: nothing to %s. Nothing changed.",
			strings.TrimPrefix(described, "every failed event matching "), verb))
	default:
		return false
	}
	return true
}
