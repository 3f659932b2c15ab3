package main

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// startProducer writes rate events per second, each the bench's generated
// document: upserts of new books numbered from first, or, when docs is not
// zero, updates of books first..first+docs-1 in turn, each pass with a
// version one higher, so the ledger never finds one stale.
func (b *bench) startProducer(ctx context.Context, rate, first, docs int) *harness.Producer {
	n := 0
	return harness.Produce(ctx, b.pool, harness.ProducerConfig{Rate: rate, Next: func(count int) []harness.Event {
		events := make([]harness.Event, count)
		for i := range events {
			book, version := first+n, int64(1)
			if docs > 0 {
				book, version = first+n%docs, int64(n/docs+1)
			}
			events[i] = harness.Event{EntityType: "book", EntityID: entityID(book), Op: "upsert", Version: version,
				Payload: json.RawMessage(doc(book, b.cfg.DocBytes)), ScopeKey: "lib-" + strconv.Itoa(book%97)}
			n++
		}
		return events
	}})
}
