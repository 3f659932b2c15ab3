package replay

import (
	"bytes"
	"encoding/json"

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
