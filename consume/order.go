package consume

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wlproj/wlproj/outbox"
)

// docKey names one document of one projection.
type docKey struct{ projection, entityType, entityID string }

func keyOf(e outbox.Event) docKey { return docKey{e.Projection, e.EntityType, e.EntityID} }

// flight is one claimed batch on its way to the engine.
type flight struct {
	events []outbox.Event
	// after are the done channels of earlier batches of this term that
	// share a document with this one.
	after []chan struct{}
	done  chan struct{}
	// span is the batch's trace span, from its claim to its last ack.
	span trace.Span
	// projected, if set, is called once the batch's projection writes have
	// returned, before its acks: it frees the batch's bulk lane.
	projected func()
	// readStart and readEnd bound the claim or read that took the batch.
	readStart, readEnd time.Time
}

// order keeps a term's batches of one document in claim order. The loop
// claims the next batch while others are in flight, so a batch's ledger
// entries, read at claim time, may miss what an earlier batch is about to
// apply: a delete in flight and an older upsert claimed behind it would both
// be sent, and only the engine's short memory of deletes would stop the
// upsert. A batch that shares a document with an earlier one therefore
// waits for it, and then takes the ledger advances the earlier one made.
type order struct {
	mu      sync.Mutex
	claimed map[docKey]*flight
	applied map[docKey]outbox.Applied
}

func newOrder() *order {
	return &order{claimed: map[docKey]*flight{}, applied: map[docKey]outbox.Applied{}}
}

// claim runs the claim and registers its batch under one lock with record,
// so an ack that commits while the claim reads is either seen by the claim
// or recorded for this batch afterwards.
func (o *order) claim(run func() ([]outbox.Event, error)) (*flight, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	events, err := run()
	if err != nil || len(events) == 0 {
		return nil, err
	}
	f := &flight{events: events, done: make(chan struct{})}
	waits := map[*flight]bool{f: true} // two events of one document in a batch
	for _, e := range events {
		k := keyOf(e)
		if prev := o.claimed[k]; prev != nil && !waits[prev] {
			waits[prev] = true
			f.after = append(f.after, prev.done)
		}
		o.claimed[k] = f
	}
	return f, nil
}

// wait blocks until the earlier batches sharing a document are done, then
// brings the batch's ledger entries up to date with what they applied.
func (o *order) wait(ctx context.Context, f *flight) error {
	for _, done := range f.after {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, e := range f.events {
		if a, ok := o.applied[keyOf(e)]; ok && above(a, e.Applied) {
			f.events[i].Applied = &a
		}
	}
	return nil
}

// record notes the ledger advances of acked events whose documents are
// still claimed by a batch of this term.
func (o *order) record(events []outbox.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range events {
		k := keyOf(e)
		if o.claimed[k] == nil {
			continue
		}
		a := outbox.Applied{Version: e.Version(), EventID: e.ID, Deleted: e.Op == outbox.OpDelete}
		if old, ok := o.applied[k]; !ok || above(a, &old) {
			o.applied[k] = a
		}
	}
}

// finish forgets the documents no later batch claimed and releases the
// batches waiting for this one.
func (o *order) finish(f *flight) {
	o.mu.Lock()
	for _, e := range f.events {
		k := keyOf(e)
		if o.claimed[k] == f {
			delete(o.claimed, k)
			delete(o.applied, k)
		}
	}
	o.mu.Unlock()
	close(f.done)
}

// above reports whether a is newer than b, nil being no entry.
func above(a outbox.Applied, b *outbox.Applied) bool {
	return b == nil || b.Before(a.Version, a.EventID)
}
