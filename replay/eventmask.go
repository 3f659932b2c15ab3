package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
)

// Mask hides d's masked values (m, its projection's mask) and reports
// whether there were any to hide. The error texts are masked with the
// payload they may quote: the loop stores them masked, and a row that
// failed before the mask was set is masked here. unmasked leaves the
// payload whole (the audited read), never the error texts.
func (d *EventDetail) Mask(m *mask.Mask, unmasked bool) bool {
	if m.Empty() {
		return false
	}
	payload := []byte(d.Payload)
	d.LastError = m.Text(payload, d.LastError)
	for i := range d.History {
		d.History[i].Error = m.Text(payload, d.History[i].Error)
	}
	if !unmasked {
		d.Payload = maskedPayload(m, payload)
	}
	return true
}

// maskedPayload is payload masked and indented, or a note that it cannot
// be shown: what is not JSON cannot be masked.
func maskedPayload(m *mask.Mask, payload []byte) string {
	out, err := m.Payload(payload)
	var indented bytes.Buffer
	if err == nil {
		err = json.Indent(&indented, out, "", "    ")
	}
	if err != nil {
		return mask.Marker + " (not shown: the payload could not be masked)"
	}
	return indented.String()
}

// AuditUnmask is the audit action of a read of a payload unmasked.
const AuditUnmask = "unmask"

// UnmaskAudit is the audit row of a read of d's payload unmasked: it
// names the event and its projection, who read it and why.
func UnmaskAudit(d EventDetail, by, why string) outbox.Audit {
	return outbox.Audit{Action: AuditUnmask, By: by, Why: why,
		Selector: map[string]any{"event": d.ID, "projection": d.Projection}, EventIDs: []int64{d.ID}, Count: 1}
}

// payloadsSQL reads the payloads of ids from the outbox and the dead
// letter, by primary key.
const payloadsSQL = `
SELECT id, payload FROM outbox_events WHERE id = ANY($1)
UNION ALL
SELECT id, payload FROM outbox_dead_letter WHERE id = ANY($1)`

// MaskLastErrors masks each listed row's LastError with its payload and
// its projection's mask (masks, by projection). The loop stores errors
// masked; a row that failed before its projection had a mask holds what
// the engine quoted, and is masked here.
func MaskLastErrors(ctx context.Context, db outbox.Querier, masks map[string]*mask.Mask, events []FailedEvent) error {
	var ids []int64
	for _, e := range events {
		if !masks[e.Projection].Empty() {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := db.Query(ctx, payloadsSQL, ids)
	if err != nil {
		return fmt.Errorf("read the payloads to mask the errors: %w", err)
	}
	payloads := map[int64][]byte{}
	for rows.Next() {
		var id int64
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			return fmt.Errorf("read the payloads to mask the errors: %w", err)
		}
		payloads[id] = payload
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the payloads to mask the errors: %w", err)
	}
	for i, e := range events {
		if m := masks[e.Projection]; !m.Empty() {
			events[i].LastError = m.Text(payloads[e.ID], e.LastError)
		}
	}
	return nil
}
