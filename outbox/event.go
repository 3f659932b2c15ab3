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
