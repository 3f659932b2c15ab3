package console

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// pause is the POST of the overview's pause and resume buttons. It goes
// through outbox.SetPaused, as wlproj pause and resume do: one transaction
// with the state row and the audit row, a compare-and-set, so of two people
// pausing at once one pauses and the other is told it already was.
func (c *Console) pause(w http.ResponseWriter, r *http.Request) {
	if err := onlyKnown(r.PostForm, []string{"csrf", "projection", "op", "why"}); err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	projection, op, why := r.PostFormValue("projection"), r.PostFormValue("op"), strings.TrimSpace(r.PostFormValue("why"))
	switch {
	case op != "pause" && op != "resume":
		c.refuse(w, r, http.StatusBadRequest, "Say pause or resume. Nothing changed.")
		return
	case why == "":
		c.refuse(w, r, http.StatusBadRequest, "Say why: the reason goes to the audit row with your name. Nothing changed.")
		return
	}
	if !c.mayPause(w, r, projection) {
		return
	}
	u := requestOf(r).user
	res, err := outbox.SetPaused(r.Context(), c.deps.Pool, outbox.PauseRequest{Projection: projection, Paused: op == "pause",
		By: u.Name, Why: why, Known: c.deps.Projections})
	var field *bounds.FieldError
	var unknown *outbox.UnknownProjectionError
	switch {
	case errors.As(err, &field), errors.As(err, &unknown):
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		c.fail(w, r, err)
		return
	case !res.Changed:
		st := res.State
		msg := fmt.Sprintf("%s is not paused; nothing changed.", projection)
		if st.Paused {
			msg = fmt.Sprintf("%s is already paused, since %s by %s: %s. Nothing changed.",
				projection, formatTime(st.ChangedAt), st.ChangedBy, st.Why)
		}
		c.refuse(w, r, http.StatusConflict, msg)
		return
	}
	c.logOf(r).Info().Str("user", u.Name).Str("op", op).Str("projection", projection).Int64("audit_id", res.AuditID).
		Str("why", why).Msg("console pause")
	http.Redirect(w, r, Prefix+"?notice="+op+"d", http.StatusSeeOther)
}
