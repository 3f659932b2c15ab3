package console

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/policy"
	"github.com/wlproj/wlproj/replay"
)

// The event page shows a payload with its projection's masked fields
// hidden (Deps.Masks), and the error texts with the values they may quote
// hidden too: the loop stores them masked, and a row written before the
// mask was configured is masked here. The unmasked read shows the payload
// whole on its one response, to a user mayUnmask allows, audited; a
// refusal is the policy's (deny: a 403 and a refused audit row).

// mayUnmask is the one permission decision of the unmasked read: the
// policy's unmask action on the event's projection and scope key
// (operators hold it without a policy file, read-only users do not).
func mayUnmask(r *http.Request, d replay.EventDetail) bool {
	return grantsOf(r).Can(policy.Unmask, d.Projection, d.ScopeKey)
}

// unmasked is the audited read of an event's payload unmasked: a why is
// required, the audit row names the event, its projection, who and why,
// and only this response shows the payload whole.
func (c *Console) unmasked(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "event")
	if err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := onlyKnown(r.PostForm, []string{"csrf", "why"}); err != nil {
		c.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	why := strings.TrimSpace(r.PostFormValue("why"))
	if why == "" {
		c.refuse(w, r, http.StatusBadRequest, "Say why: the reason goes to the audit row with your name. Nothing was shown.")
		return
	}
	d, ok := c.readEvent(w, r, id)
	if !ok {
		return
	}
	if !mayUnmask(r, d) {
		c.deny(w, r, policy.Unmask, fmt.Sprintf("read event %d unmasked", id), []int64{id})
		return
	}
	u := requestOf(r).user
	if c.deps.Masks[d.Projection].Empty() {
		c.refuse(w, r, http.StatusBadRequest, "Projection "+d.Projection+" masks nothing: the event page shows its payload whole.")
		return
	}
	auditID, err := c.auditUnmasked(r, d, u.Name, why)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.deps.Log.Info().Str("user", u.Name).Int64("event_id", id).Str("projection", d.Projection).
		Int64("audit_id", auditID).Str("why", why).Msg("console unmasked read")
	c.eventPage(w, r, d, true)
}

// auditUnmasked records the unmasked read of d; the payload is shown only
// once the row is committed.
func (c *Console) auditUnmasked(r *http.Request, d replay.EventDetail, by, why string) (int64, error) {
	tx, err := c.deps.Pool.Begin(r.Context())
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(r.Context()) //nolint:errcheck // a no-op after Commit
	id, _, err := outbox.WriteAudit(r.Context(), tx, replay.UnmaskAudit(d, by, why))
	if err != nil {
		return 0, err
	}
	return id, tx.Commit(r.Context())
}
