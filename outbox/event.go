package outbox

import (
	"encoding/json"
	"time"
)

// Event is a claimed outbox row, as a projection sees it.
type Event struct {
	ID           int64
	Projection   string
	EntityType   string
	EntityID     string
	Op           string
	EventVersion *int64
	Payload      json.RawMessage
	ScopeKey     *string
	Attempts     int
	CreatedAt    time.Time
	// DueAt is when the row fell due (next_retry_at): with ID, its place in
	// the order claims take rows (Cursor).
	DueAt time.Time
	// Repair marks an event of `wlproj verify --repair` or of `wlproj
	// rebuild --emit-outbox`: it is sent even at the version the ledger
	// holds, and
	// wins over other events of that version; a repair delete never wins
	// over a live document (Stale).
	Repair bool
	// Claim numbers the claim that took the event; its acks name it. A
	// queued event (Queued) has none: it was read by position, not claimed.
	Claim int64
	// Queued marks an event read by position (status 'queued'): its acks
	// match the row while it is still queued, and its success writes no
	// row. XID is its producer's transaction, its place in the position.
	Queued bool
	XID    uint64
	// Traceparent is the W3C trace context the producer wrote, if any: the
	// batch's span links to it.
	Traceparent string
	// Applied is the ledger's entry for the event's document when the event
	// was claimed, nil if the projection never applied one.
	Applied *Applied
}

// Applied is what the ledger (outbox_ledger) remembers of a document: the
// newest version its projection confirmed, by which event.
type Applied struct {
	Version int64
	EventID int64
	Deleted bool
}

// Stale reports whether the ledger already holds this event's version or a
// newer one, by (version, outbox id): an event never applies twice. A
// repair is sent at the ledger's own version, but a repair delete never
// undoes an applied upsert of its version or a newer one: the verify that
// queued it judged on reads the ledger has moved past since (the document
// re-created while the delete waited), and the engine, under external_gte,
// would take it and lose a live document for good.
func (e Event) Stale() bool {
	if e.Applied == nil {
		return false
	}
	if e.Repair && e.Op == OpDelete && !e.Applied.Deleted {
		return e.Applied.Version >= e.Version()
	}
	if e.Repair {
		return e.Applied.Version > e.Version()
	}
	return !e.Applied.Before(e.Version(), e.ID)
}

// ReusesVersion reports whether the ledger holds this event's version from
// another event of the document: producers must not reuse a version, since
// under external_gte either copy would overwrite the other in the engine.
func (e Event) ReusesVersion() bool {
	return !e.Repair && e.Applied != nil && e.Applied.Version == e.Version() && e.Applied.EventID != e.ID
}

// Before reports whether the entry orders before the event (version,
// eventID): the one order of events, by version, then outbox id.
func (a Applied) Before(version, eventID int64) bool {
	return a.Version < version || (a.Version == version && a.EventID < eventID)
}

// Ops a producer may write.
const (
	OpUpsert = "upsert"
	OpDelete = "delete"
)

// Version orders events of one entity: the producer's event_version, or the
// outbox id when the producer gave none.
func (e Event) Version() int64 {
	if e.EventVersion != nil {
		return *e.EventVersion
	}
	return e.ID
}
