// Package projection defines what the consume loop calls for each claimed
// batch, and holds the implementations: Search (an Elasticsearch index, one
// document per entity) and Chronicle (a Postgres timeline of every event).
// The loop only pulls events, calls the handler registered for the event's
// projection and records the outcome; it never branches on projection or
// business fields, only on what a handler declares (LatestOnly).
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

// LatestOnly is implemented by a handler whose projection keeps only the
// newest version of each document, as the search index does. The loop drops
// the events of such a projection that the applied-version ledger already
// holds a version of (or a newer one), and moves the ledger forward for what
// it applied. A handler that keeps every event (an append-only timeline such
// as Chronicle) does not implement it, or returns false: none of its events
// is dropped and the ledger is never written for it.
type LatestOnly interface {
	LatestOnly() bool
}

// IsLatestOnly reports whether h opts in to the ledger (see LatestOnly).
func IsLatestOnly(h Handler) bool {
	lo, ok := h.(LatestOnly)
	return ok && lo.LatestOnly()
}

// LatestOnly implements LatestOnly: one document per entity, at its newest
// version.
func (*Search) LatestOnly() bool { return true }

// Waits is implemented by a handler that may not take events yet, such as a
// search projection whose index is not set up: while Waiting says why (""
// when it may), the loop reads none of its events, which stay where they
// are, unsent and without an attempt counted.
type Waits interface {
	Waiting() string
}

// WaitingFor is why h's events wait, "" when they do not (see Waits).
func WaitingFor(h Handler) string {
	if w, ok := h.(Waits); ok {
		return w.Waiting()
	}
	return ""
}

// Registry maps a projection name to its handler.
type Registry map[string]Handler

// LatestOnly returns the names of the registered projections that opt in to
// the ledger.
func (r Registry) LatestOnly() map[string]bool {
	names := make(map[string]bool, len(r))
	for name, h := range r {
		if IsLatestOnly(h) {
			names[name] = true
		}
	}
	return names
}
