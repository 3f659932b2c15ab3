package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

// ChronicleName is the chronicle projection's name, as producers write it
// in outbox_events.projection.
const ChronicleName = "chronicle"

// ChronicleMaxPayloadBytesDefault is ChronicleConfig.MaxPayloadBytes'
// default; the CLI's flag takes it from here, and
// ChronicleMaxPayloadBytesRange is what it accepts.
const ChronicleMaxPayloadBytesDefault = 256 << 10

var ChronicleMaxPayloadBytesRange = bounds.Range[int]{Min: 1, Max: 100 << 20}

// ChronicleConfig configures the chronicle projection.
type ChronicleConfig struct {
	// Pool reaches the database that holds chronicle_events (the outbox's).
	// Required.
	Pool *pgxpool.Pool
	// MaxPayloadBytes is the largest payload appended; a larger one fails as
	// payload_invalid. Defaults to 256 KiB.
	MaxPayloadBytes int
	// Table receives the events: table or schema.table, unquoted, with
	// ChronicleColumns and a unique index on event_id. Defaults to
	// ChronicleTableDefault.
	Table string
}

// ChronicleTableDefault is the chronicle's table unless configured
// otherwise (migrations/00006 creates it).
const ChronicleTableDefault = "chronicle_events"

// ChronicleColumns are the columns a chronicle's table must have;
// event_id must be unique (a resend appends nothing).
var ChronicleColumns = []string{"event_id", "projection", "entity_type", "entity_id", "op", "version", "payload", "scope_key", "occurred_at"}

// Chronicle appends every event, in full, to the chronicle_events table: a
// timeline of what happened to each entity. Unlike the search index it keeps
// every version, so it does not implement LatestOnly and the ledger never
// drops its events. It is idempotent on the outbox id: a resend after a
// crash or a replay appends nothing and counts as superseded.
type Chronicle struct {
	pool            *pgxpool.Pool
	maxPayloadBytes int
	insertSQL       string
}

var _ Handler = (*Chronicle)(nil)

// NewChronicle validates cfg and returns the handler.
func NewChronicle(cfg ChronicleConfig) (*Chronicle, error) {
	cfg.MaxPayloadBytes = cmp.Or(cfg.MaxPayloadBytes, ChronicleMaxPayloadBytesDefault)
	if cfg.Pool == nil {
		return nil, errors.New("chronicle projection: a database pool is required")
	}
	if err := bounds.Check("MaxPayloadBytes", cfg.MaxPayloadBytes, ChronicleMaxPayloadBytesRange); err != nil {
		return nil, err
	}
	table := pgx.Identifier(strings.Split(cmp.Or(cfg.Table, ChronicleTableDefault), ".")).Sanitize()
	return &Chronicle{pool: cfg.Pool, maxPayloadBytes: cfg.MaxPayloadBytes,
		insertSQL: strings.Replace(chronicleInsertSQL, "INSERT INTO chronicle_events", "INSERT INTO "+table, 1)}, nil
}

// chronicleInsertSQL appends a whole batch in one statement; RETURNING
// names the rows it added, so the others were there already.
const chronicleInsertSQL = `
INSERT INTO chronicle_events (event_id, projection, entity_type, entity_id, op, version, payload, scope_key, occurred_at)
SELECT id, projection, entity_type, entity_id, op, version, payload::jsonb, scope_key, occurred_at
  FROM unnest(@ids::bigint[], @projections::text[], @entity_types::text[], @entity_ids::text[], @ops::text[],
              @versions::bigint[], @payloads::text[], @scope_keys::text[], @occurred_at::timestamptz[])
       AS u(id, projection, entity_type, entity_id, op, version, payload, scope_key, occurred_at)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id`

// Handle appends the valid events of the batch in one statement and returns
// one Result per event, in the order of events.
func (c *Chronicle) Handle(ctx context.Context, events []outbox.Event) []Result {
	results := make([]Result, len(events))
	idx := make([]int, 0, len(events))
	for i, ev := range events {
		results[i].ID = ev.ID
		if err := c.check(ev); err != nil {
			results[i].Err = err
			continue
		}
		idx = append(idx, i)
	}
	c.append(ctx, idx, events, results)
	return results
}

// check refuses what would never be appended, before anything is sent.
func (c *Chronicle) check(ev outbox.Event) error {
	switch {
	case ev.EntityType == "" || ev.EntityID == "":
		return classify.New(classify.PayloadInvalid, "empty entity_type or entity_id")
	case ev.Op != outbox.OpUpsert && ev.Op != outbox.OpDelete:
		return classify.New(classify.PayloadInvalid, fmt.Sprintf("unknown op %q", ev.Op))
	case len(ev.Payload) > c.maxPayloadBytes:
		return classify.New(classify.PayloadInvalid,
			fmt.Sprintf("payload is %d bytes, the chronicle's limit is %d", len(ev.Payload), c.maxPayloadBytes))
	}
	return nil
}

// append inserts the events at idx and fills in their results. When the
// batch fails deterministically (one event's data), each event is appended
// on its own, so one bad event does not fail its neighbours.
func (c *Chronicle) append(ctx context.Context, idx []int, events []outbox.Event, results []Result) {
	if len(idx) == 0 {
		return
	}
	added, err := c.insert(ctx, idx, events)
	if err != nil {
		ce := classify.Classify(err)
		if ce.Class == classify.Deterministic && len(idx) > 1 && ctx.Err() == nil {
			for _, i := range idx {
				c.append(ctx, []int{i}, events, results)
			}
			return
		}
		for _, i := range idx {
			e := *ce
			results[i].Err = &e
		}
		return
	}
	for _, i := range idx {
		// Not added: appended before, by a leader that died before its ack
		// or by the first run of a replayed event.
		results[i].Superseded = !added[events[i].ID]
	}
}

// insert runs chronicleInsertSQL for the events at idx and returns the ids
// it added.
func (c *Chronicle) insert(ctx context.Context, idx []int, events []outbox.Event) (map[int64]bool, error) {
	n := len(idx)
	ids, versions := make([]int64, n), make([]int64, n)
	projections, types, entityIDs, ops := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads, scopes, at := make([]string, n), make([]*string, n), make([]time.Time, n)
	for k, i := range idx {
		ev := events[i]
		ids[k], versions[k], projections[k] = ev.ID, ev.Version(), ev.Projection
		types[k], entityIDs[k], ops[k] = ev.EntityType, ev.EntityID, ev.Op
		payloads[k], scopes[k], at[k] = string(ev.Payload), ev.ScopeKey, ev.CreatedAt
		if len(ev.Payload) == 0 {
			payloads[k] = "{}"
		}
	}
	rows, err := c.pool.Query(ctx, c.insertSQL, pgx.NamedArgs{
		"ids": ids, "projections": projections, "entity_types": types, "entity_ids": entityIDs, "ops": ops,
		"versions": versions, "payloads": payloads, "scope_keys": scopes, "occurred_at": at,
	})
	if err != nil {
		return nil, err
	}
	added, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	set := make(map[int64]bool, len(added))
	for _, id := range added {
		set[id] = true
	}
	return set, nil
}
