// Package projection defines what the consume loop calls for each claimed
// batch, and holds the implementations (the search index first). The loop
// only pulls events, calls the handler registered for the event's projection
// and records the outcome; it never branches on projection or business fields.
package projection

import (
	"context"

	"github.com/wlproj/wlproj/outbox"
)

// Result is the outcome of one event.
type Result struct {
	ID int64
	// Superseded is set when a newer version of the document was already
	// there (or in the same batch); the event counts as done.
	Superseded bool
	// Err is nil when the event was applied. Otherwise classify.Classify
	// turns it into a class and a reason.
	Err error
}

// Handler projects a batch of events of one projection. It returns exactly
// one Result per event, in any order. A whole-request failure is reported as
// the same error on every event.
type Handler interface {
	Handle(ctx context.Context, events []outbox.Event) []Result
}

// Registry maps a projection name to its handler.
type Registry map[string]Handler
