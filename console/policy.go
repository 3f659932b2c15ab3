package console

import (
	"context"
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
	"github.com/wlproj/wlproj/replay"
)

// The console asks the policy here, and only here: who the request's
// actor is (actorOf), what it may see (viewAllowed) and do (mayAct,
// mayActOn, mayPause, mayView), and the audited refusal (deny). Every
// list, count and action then carries the actor's grants down to its SQL
// (replay.Filter.Allowed, outbox.AuditFilter.Allowed), so that a filter,
// an id typed by hand or a stale form can narrow what a person sees and
// changes, never widen it.

// policyActions are the policy's actions of the action forms.
var policyActions = map[string]policy.Action{
	"replay": policy.Replay, "discard": policy.Discard, "archive": policy.Archive, "restore": policy.Restore,
}

// actorOf is the signed-in user u as the policy sees them: the roles the
// policy file gives their name and groups, or, without a file, operator or
// viewer as the users file says.
func (c *Console) actorOf(r *http.Request, u *user, requestID string) *policy.Actor {
	a := &policy.Actor{User: u.Name, Groups: u.Groups, Auth: u.auth(), Via: policy.ViaConsole,
		Remote: clientIP(r), RequestID: requestID}
	switch {
	case c.policy != nil:
		return a.WithGrants(c.policy.For(u.Name, u.Groups))
	case u.ReadOnly:
		return a.WithGrants(policy.Viewer)
	default:
		return a.WithGrants(policy.Operator)
	}
}

// mayActSomewhere reports whether g allows any action but view: what the
// pages offer forms for. Each action is checked again when it is taken.
func mayActSomewhere(g *policy.Grants) bool {
	for _, a := range policy.Actions {
		if a != policy.View && a != policy.Unmask && g.CanAnywhere(a) {
			return true
		}
	}
	return false
}

// grantsOf is the grants of the request's actor; nil (nothing) if none.
func grantsOf(r *http.Request) *policy.Grants {
	if a := policy.From(r.Context()); a != nil {
		return a.Grants
	}
	return nil
}

// viewAllowed is what the request's reads are held to.
func viewAllowed(r *http.Request) *policy.Allowed { return grantsOf(r).Allowed(policy.View) }

// mayActOn checks the action form a against the policy: the action
// somewhere, and every id it names. It refuses, audited, and reports
// false when the policy does not allow it; req gets the grants' Allowed.
func (c *Console) mayActOn(w http.ResponseWriter, r *http.Request, a actionForm, req *replay.Request) bool {
	act := policyActions[a.kind]
	g := grantsOf(r)
	if !g.CanAnywhere(act) {
		c.deny(w, r, act, fmt.Sprintf("%s events", act), a.ids)
		return false
	}
	req.Allowed = g.Allowed(act)
	if len(a.ids) == 0 {
		return true
	}
	outside, err := replay.NotAllowed(r.Context(), c.deps.Pool, a.kind == "restore", a.ids, req.Allowed)
	if err != nil {
		c.fail(w, r, err)
		return false
	}
	if len(outside) > 0 {
		c.deny(w, r, act, fmt.Sprintf("%s events %s", act, replay.FormatIDs(outside)), outside)
		return false
	}
	return true
}

// mayPause checks a pause or resume of projection: it takes every scope
// of it at once, so only a grant of every scope allows it.
func (c *Console) mayPause(w http.ResponseWriter, r *http.Request, projection string) bool {
	if grantsOf(r).Whole(policy.Pause, projection) {
		return true
	}
	c.deny(w, r, policy.Pause, "pause or resume "+projection, nil)
	return false
}

// mayView checks a read of one event of projection and scope key.
func (c *Console) mayView(w http.ResponseWriter, r *http.Request, id int64, projection, scope string) bool {
	if grantsOf(r).Can(policy.View, projection, scope) {
		return true
	}
	c.deny(w, r, policy.View, fmt.Sprintf("view event %d", id), []int64{id})
	return false
}

// deny refuses what the policy does not allow: a 403 that says so and
// changes nothing, a log line and an audit row (action refused: who, what
// they asked, when, and the request id). A refusal is not a confirmation
// that the rows exist: the message is the same for rows of another scope
// and rows that are not there.
func (c *Console) deny(w http.ResponseWriter, r *http.Request, act policy.Action, what string, ids []int64) {
	rq := requestOf(r)
	c.logOf(r).Warn().Str("action", string(act)).Str("what", what).Str("path", r.URL.Path).Msg("console: refused by the policy")
	if err := c.auditRefusal(r.Context(), rq.user.Name, act, what, r.URL.Path, ids); err != nil {
		c.fail(w, r, fmt.Errorf("audit the refusal: %w", err))
		return
	}
	c.renderError(w, r, http.StatusForbidden, "message", "Refused", nil,
		fmt.Sprintf("Refused: the policy does not allow %s to %s. Nothing changed; the refusal is audited.", rq.user.Name, what))
}

func (c *Console) auditRefusal(ctx context.Context, by string, act policy.Action, what, path string, ids []int64) error {
	tx, err := c.deps.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, _, err := outbox.WriteAudit(ctx, tx, outbox.Audit{Action: "refused", By: by, Why: "refused by the policy: " + what,
		Selector: map[string]any{"action": act, "path": path}, EventIDs: ids, Count: int64(len(ids))}); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// logOf is the console's logger with the request's id and user, so that
// one id finds a request's log lines, its audit row and its trace.
func (c *Console) logOf(r *http.Request) *zerolog.Logger {
	l := c.deps.Log
	if a := policy.From(r.Context()); a != nil {
		l = l.With().Str("request_id", a.RequestID).Str("user", a.User).Logger()
	}
	return &l
}

// loadPolicy reads the policy file, if one is given, and refuses one that
// names a projection this replica does not run.
func loadPolicy(path string, projections []string) (*policy.Policy, error) {
	if path == "" {
		return nil, nil
	}
	p, err := policy.Load(path)
	if err != nil {
		return nil, err
	}
	if err := p.CheckProjections(projections); err != nil {
		return nil, err
	}
	return p, nil
}

// mayViewAudit checks a read of the audit row a: the rows of the audit log
// the actor's grants allow (outbox.AuditFilter.Allowed) are the ones it
// may read one by one.
func (c *Console) mayViewAudit(w http.ResponseWriter, r *http.Request, a outbox.AuditEntry) bool {
	allowed := viewAllowed(r)
	if allowed == nil {
		return true
	}
	same, err := outbox.AuditLog(r.Context(), c.deps.Pool, outbox.AuditFilter{Before: a.ID + 1, Limit: 1, Allowed: allowed})
	if err != nil {
		c.fail(w, r, err)
		return false
	}
	if len(same) == 1 && same[0].ID == a.ID {
		return true
	}
	c.deny(w, r, policy.View, fmt.Sprintf("view audit row %d", a.ID), nil)
	return false
}
