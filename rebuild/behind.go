package rebuild

import (
	"context"
	"fmt"
	"time"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/serviceutil"
	"github.com/wlproj/wlproj/mask"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
)

// Behind is a source row older than the version the ledger says the
// projection applied, live: the application wrote the document's newer
// event without its row, or before it (the source table's contract
// broken). Dual-write brings only versions applied after the rebuild
// opened, so the load keeps the newer version by copying the document the
// old index holds, at the old index's version, to the new index.
type Behind struct {
	EntityType string `json:"entity_type"`
	EntityID   string `json:"entity_id"`
	// SourceVersion is the source row's version; LedgerVersion the newer
	// one the ledger applied.
	SourceVersion int64 `json:"source_version"`
	LedgerVersion int64 `json:"ledger_version"`
	// CopiedVersion is the version the old index held and the new one was
	// sent; 0 when the old index did not hold the document (nor could the
	// new one lose it).
	CopiedVersion int64 `json:"copied_version,omitempty"`
}

// copier reads the documents the source table is behind on from the old
// index.
type copier struct {
	eng        engine
	old        string // empty when there was no old index
	projection string
}

// copies returns an upsert event, numbered from firstID, of each document
// of behind that the old index holds, at the old index's version and with
// its _source, and sets those rows' CopiedVersion. Under external_gte a
// newer version that dual-write brings meanwhile wins, and a delete it
// brings leaves a tombstone that refuses the copy.
func (c copier) copies(ctx context.Context, behind []Behind, firstID int64) ([]outbox.Event, error) {
	if c.old == "" || len(behind) == 0 {
		return nil, nil
	}
	ids := make([]string, len(behind))
	for i, b := range behind {
		ids[i] = projection.DocumentID(b.EntityType, b.EntityID)
	}
	docs, err := c.eng.mget(ctx, c.old, ids, true)
	if err != nil {
		return nil, fmt.Errorf("copy the documents the source table is behind on: %w", err)
	}
	var events []outbox.Event
	for i := range behind {
		d, ok := docs[ids[i]]
		if !ok {
			continue
		}
		v := d.Version
		behind[i].CopiedVersion = v
		events = append(events, outbox.Event{ID: firstID + int64(len(events)), Projection: c.projection,
			EntityType: behind[i].EntityType, EntityID: behind[i].EntityID, Op: outbox.OpUpsert, EventVersion: &v, Payload: d.Source})
	}
	return events, nil
}

// sent is what the engine made of a set of events.
type sent struct {
	loaded, superseded int64
	refused            []Refused
}

// sendAll sends events to target through the search handler (the daemon's
// bulk building, versioning and reading of answers), transient failures
// (429, 5xx, timeouts) again after the daemon's backoff; after loadTries
// it stops with an error. inFlight, if set, bounds the bulks in flight. A
// refused row's message is masked with m: the engine's error may quote a
// masked value.
func sendAll(ctx context.Context, search *projection.Search, m *mask.Mask, target string, events []outbox.Event, inFlight chan struct{}) (sent, error) {
	var out sent
	for try := 0; len(events) > 0; try++ {
		var retry []outbox.Event
		var retryAfter time.Duration
		if inFlight != nil {
			inFlight <- struct{}{}
		}
		results := search.Handle(ctx, events)
		if inFlight != nil {
			<-inFlight
		}
		for i, r := range results {
			ev := events[i]
			ce := classify.Classify(r.Err)
			switch {
			case r.Err == nil && r.Superseded:
				out.superseded++
			case r.Err == nil:
				out.loaded++
			case ce.Class == classify.Deterministic:
				out.refused = append(out.refused, Refused{EntityType: ev.EntityType, EntityID: ev.EntityID,
					Version: *ev.EventVersion, Reason: ce.Reason, Message: m.Text(ev.Payload, ce.Message)})
			default:
				retry, retryAfter = append(retry, ev), max(retryAfter, ce.RetryAfter)
				if try+1 >= loadTries || ctx.Err() != nil {
					return out, fmt.Errorf("loading %s:%s into %s: %w (after %d tries)", ev.EntityType, ev.EntityID, target, r.Err, try+1)
				}
			}
		}
		events = retry
		if len(events) > 0 && serviceutil.Sleep(ctx, classify.Backoff(try, loadBackoffBase, loadBackoffMax, retryAfter)) != nil {
			return out, ctx.Err()
		}
	}
	return out, nil
}
