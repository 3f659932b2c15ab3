package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/replay"
)

// The actions on failed and archived rows. Each is two POSTs: a dry run,
// which shows exactly which rows and how many, and the action itself,
// confirmed with a why and held to the dry run's rows by its token. All go
// through replay's action path, as the CLI's replay, failed discard, failed
// archive and replay --archived do.

// actionKind is one action, with what its forms and messages need.
type actionKind struct {
	do   func(context.Context, replay.Beginner, replay.Request) (replay.Report, error)
	verb string // "replay"
	done string // "replayed", also the key of the notice after it
	// rows names the rows it takes: "No failed events match …".
	rows string
	// filters are the filter fields it selects by; none: by id only.
	filters []string
	// aged needs the form's older_than: archive moves only rows that failed
	// long ago, as the CLI's required --older-than.
	aged bool
	// resets offers resetting attempts.
	resets bool
	// list is the page of the rows it takes.
	list string
	// cli is the command that does the same, for a refusal by the database.
	cli string
}

// actionKinds are the actions, by form value.
var actionKinds = map[string]actionKind{
	"replay": {do: replay.Replay, verb: "replay", done: "replayed", rows: "failed", filters: filterFields,
		resets: true, list: "failed", cli: "wlproj replay"},
	"discard": {do: replay.Discard, verb: "discard", done: "discarded", rows: "failed", filters: filterFields,
		list: "failed", cli: "wlproj failed discard"},
	"archive": {do: archive, verb: "archive", done: "archived", rows: "failed or discarded",
		filters: []string{"projection", "reason"}, aged: true, list: "failed", cli: "wlproj failed archive"},
	"restore": {do: replay.Restore, verb: "restore", done: "restored", rows: "archived", resets: true,
		list: "archived", cli: "wlproj replay --archived"},
}

// actionNames are the keys of actionKinds, for messages.
const actionNames = "replay, discard, archive or restore"

// insufficientPrivilege is the SQLSTATE of a statement the database role
// may not run.
const insufficientPrivilege = "42501"

// confirmShown is how many of the selected rows a confirmation lists; the
// count and the token cover all of them.
const confirmShown = 50

// dryRunWhy is the why of a dry run: replay requires one, and a dry run
// writes no audit row for it to go to.
const dryRunWhy = "console dry run"

// archive is replay.Archive for a Request, whose Until is the cut-off a
// dry run resolved the form's older_than to; its Expect holds a confirmed
// archive to the dry run's rows, and Max caps it as replay and discard are.
func archive(ctx context.Context, db replay.Beginner, req replay.Request) (replay.Report, error) {
	return replay.Archive(ctx, db, replay.ArchiveRequest{Before: req.Until, IDs: req.IDs, Projection: req.Projection,
		Reason: req.Reason, By: req.By, Why: req.Why, DryRun: req.DryRun, Given: req.Given, Expect: req.Expect,
		Max: req.Max, Yes: req.Yes, Allowed: req.Allowed})
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
	Resets           bool
	// List is the page of the rows the action takes, where cancel goes.
	List string
	// Skipped says which ticked rows the action leaves alone, and why.
	Skipped string
	// Matching and Max are set when the cap refused: Yes lifts it.
	Matching int64
	Max      int
	Yes      bool
}

func (v confirmView) section() string { return v.List }

func (c *Console) dryRun(w http.ResponseWriter, r *http.Request) {
	a, err := parseActionForm(r.PostForm, time.Now())
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
	if !c.mayActOn(w, r, a, &req) {
		return
	}
	rep, err := kind.do(r.Context(), c.deps.Pool, req)
	v := confirmView{Kind: a.kind, Verb: kind.verb, Done: kind.done, What: a.describe(), Hidden: a.hidden(now),
		Why: a.why, Resets: kind.resets, List: kind.list, Max: replay.MaxDefault, Yes: a.yes}
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
	case c.refused(w, r, err, len(rep.Events), a):
		return
	}
	v.Count, v.Token = len(rep.Events), rep.Token
	if len(rep.Skipped) > 0 {
		// Only an archive's age leaves ticked rows out.
		v.Skipped = fmt.Sprintf("Left alone: %s: ticked, but failed after %s.", replay.FormatIDs(rep.Skipped), formatTime(a.cutoff))
	}
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
	a, err := parseActionForm(r.PostForm, time.Now())
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
	if !c.mayActOn(w, r, a, &req) {
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
			why = fmt.Sprintf("%d %s events match now, not the ones you confirmed", refused.Matching, kind.rows)
		}
		msg := fmt.Sprintf("The %s was refused because the rows changed since the dry run: %s. Nothing changed. "+
			"Run the dry run again to see the rows as they are now.", kind.verb, why)
		c.renderError(w, r, http.StatusConflict, "message", "Nothing changed", retryView{Hidden: a.hidden(now)}, msg)
		return
	case c.refused(w, r, err, len(rep.Events), a):
		return
	}
	notice := kind.done
	if len(rep.AuditIDs) > 1 {
		notice = kind.done + "-batches"
	}
	c.logOf(r).Info().Str("user", u.Name).Str("action", a.kind).Int("events", len(rep.Events)).
		Int64("audit_id", rep.AuditID).Str("why", a.why).Int("left_alone", len(rep.NotFailed)+len(rep.Skipped)+len(rep.Missing)).
		Msg("console action")
	http.Redirect(w, r, Prefix+"audit/"+strconv.FormatInt(rep.AuditID, 10)+"?notice="+notice, http.StatusSeeOther)
}

// refused answers a bad request, an error, or a selection of no rows (the
// token of no rows matched: nothing was there), and says whether it did.
func (c *Console) refused(w http.ResponseWriter, r *http.Request, err error, rows int, a actionForm) bool {
	var pgErr *pgconn.PgError
	switch {
	case isBad(err):
		c.refuse(w, r, http.StatusBadRequest, err.Error())
	case errors.As(err, &pgErr) && pgErr.Code == insufficientPrivilege:
		// The least-privilege runtime role (deploy/sql/roles.sql) may not
		// insert events, so a replica running as it cannot restore.
		kind := actionKinds[a.kind]
		c.logOf(r).Warn().Err(err).Str("action", a.kind).Msg("console action refused by the database role")
		c.refuse(w, r, http.StatusForbidden, fmt.Sprintf("This replica's database role may not %s these events (%s). "+
			"Nothing changed. Run %s as the owner role instead (--database-url \"$OWNER_DATABASE_URL\"), as the runbook shows.",
			kind.verb, pgErr.Message, kind.cli))
	case err != nil:
		c.fail(w, r, err)
	case rows == 0:
		c.refuse(w, r, http.StatusOK, a.none())
	default:
		return false
	}
	return true
}
