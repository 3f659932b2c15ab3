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
	// Applied is the ledger's entry for the event's document when the event
	// was claimed, nil if the projection never applied one.
	Applied *Applied
}

// Applied is what the ledger (outbox_applied) remembers of a document: the
// newest version its projection confirmed, by which event.
type Applied struct {
	Version int64
	EventID int64
	Deleted bool
}

// Stale reports whether the ledger already holds this event's version or a
// newer one. Events are ordered by (version, outbox id): of two events with
// one version the later outbox row wins, as the search handler's coalescing
// does, and an event never applies twice.
func (e Event) Stale() bool {
	if e.Applied == nil {
		return false
	}
	return !e.Applied.Before(e.Version(), e.ID)
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
