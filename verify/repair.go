package verify

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

const (
	// RepairMaxDefault is the most documents a repair queues without Yes,
	// as replay's cap; the CLI's --max takes its default from here.
	RepairMaxDefault = 1000
	// RepairBatch is the most events one repair transaction queues, with
	// its audit row.
	RepairBatch = 1000
	// auditIDsMax bounds the document ids the scheduled repair's audit row
	// lists.
	auditIDsMax = 10000
)

// RepairMaxRange is what RepairRequest.Max accepts.
var RepairMaxRange = bounds.Range[int]{Min: 1, Max: 100_000_000}

// Reasons a drifted document gets no repair event.
const (
	NoSource  = "no_source"  // missing or stale without a source table: no document to send
	NoEntity  = "no_entity"  // the _id is not entity_type:entity_id, which no event addresses
	NoVersion = "no_version" // the source row's version is NULL
	// LedgerLive is an extra document the ledger says is live at the
	// version a delete would take, or a newer one: the source table lacks
	// a row the outbox wrote. The leader never sends such a delete
	// (outbox.Event.Stale); the source or the producer needs fixing.
	LedgerLive = "ledger_live"
	// IndexAhead is a document the index holds at a newer version than
	// the source row: the engine refuses the row's older version, so no
	// event puts it right; a rebuild's fresh index does.
	IndexAhead = "index_ahead"
)

// RepairRequest is a repair: the audit's who and why, and its guards.
type RepairRequest struct {
	// By and Why go to the audit row. Required.
	By, Why string
	// DryRun verifies and says what would be queued; nothing changes.
	DryRun bool
	// Max is the most documents repaired unless Yes. Defaults to 1000.
	Max int
	// Yes lifts Max.
	Yes bool
}

// RepairReport is what a repair found and queued.
type RepairReport struct {
	Report
	// Queued counts the repair events by kind: enqueued, or on a dry run,
	// the ones that would be.
	Queued map[Kind]int64 `json:"queued"`
	// Unrepairable counts the drifted documents no event can put right, by
	// reason (NoSource, NoEntity, NoVersion).
	Unrepairable map[string]int64 `json:"unrepairable"`
	// FirstEventID and LastEventID bound the queued events' ids.
	FirstEventID int64 `json:"first_event_id,omitempty"`
	LastEventID  int64 `json:"last_event_id,omitempty"`
	// AuditID is the first audit row, AuditIDs all of them: one per
	// transaction of at most RepairBatch events.
	AuditID  int64   `json:"audit_id,omitempty"`
	AuditIDs []int64 `json:"audit_ids,omitempty"`
	DryRun   bool    `json:"dry_run"`
}

// QueuedTotal is the total of Queued.
func (r RepairReport) QueuedTotal() int64 {
	var n int64
	for _, k := range Kinds {
		n += r.Queued[k]
	}
	return n
}

// RefusedError is a repair over its cap: nothing was queued.
type RefusedError struct {
	Queued int64
	Max    int
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("repair refused, nothing changed: %d documents would be repaired, more than Max %d; "+
		"read the samples, then raise Max or set Yes", e.Queued, e.Max)
}

// repairEvent is one event of a repair.
type repairEvent struct {
	kind                 Kind
	entityType, entityID string
	op                   string
	version              int64
	payload              string
}

// repairOf is the event that puts d right, or why there is none. A
// missing or stale document is upserted from its source row at the row's
// version; an extra or resurrected one is deleted at the newest version
// the index or the ledger holds, which the engine (external_gte) and the
// loop (a repair is sent at the ledger's version) both take, unless the
// ledger says the document is live at that version (LedgerLive). A delete
// at that version, not above it, leaves a producer's next version free.
func repairOf(d Drift) (repairEvent, string) {
	ev := repairEvent{kind: d.Kind, entityType: d.EntityType, entityID: d.EntityID, payload: "{}"}
	switch {
	case d.EntityType == "":
		return ev, NoEntity
	case d.Kind == Ahead:
		return ev, IndexAhead
	case d.Kind == Missing || d.Kind == Stale:
		switch {
		case d.Source == nil:
			return ev, NoSource
		case d.Source.Version < 0:
			return ev, NoVersion
		}
		ev.op, ev.version, ev.payload = outbox.OpUpsert, d.Source.Version, string(d.Source.Doc)
		return ev, ""
	}
	ev.op, ev.version = outbox.OpDelete, d.IndexVersion
	if d.Ledger != nil {
		ev.version = max(ev.version, d.Ledger.Version)
	}
	if d.Ledger != nil && !d.Ledger.Deleted && d.Ledger.Version >= ev.version {
		return ev, LedgerLive
	}
	return ev, ""
}

// repairSQL queues a batch of repair events. Producers never set repair;
// the loop sends such an event even at the version the ledger holds.
const repairSQL = `
INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload, repair)
SELECT $1, u.entity_type, u.entity_id, u.op, u.version, u.payload::jsonb, true
  FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) AS u(entity_type, entity_id, op, version, payload)
RETURNING id`

// Repair verifies as Run does and queues an outbox event for each drifted
// document it can put right: the leader applies them through the normal
// path (ledger, fencing). Events are queued in short transactions of at
// most RepairBatch events, each with its own audit row (action repair), so
// that no transaction stays open across the verify: its xid would hold
// vacuum back for the whole run. Without Yes the events wait in memory
// until the verify is over, and none is queued when there are more than
// Max; with Yes each batch of drift is queued as it is found, and a
// failure stops the repair after the batches already committed. A dry run
// queues nothing. A repair queues events, so it runs as a role that may
// insert them.
func Repair(ctx context.Context, cfg Config, req RepairRequest) (RepairReport, error) {
	rp := &repairer{rep: RepairReport{Queued: map[Kind]int64{}, Unrepairable: map[string]int64{}, DryRun: req.DryRun}}
	req.Max = cmp.Or(req.Max, RepairMaxDefault)
	cfg = cfg.withDefaults()
	if err := req.check(); err != nil {
		return rp.rep, err
	}
	rp.req, rp.projection, rp.pool = req, cfg.Projection, cfg.Pool
	rp.selector = map[string]any{"projection": cfg.Projection, "index": cfg.Index, "source_table": cfg.SourceTable}
	if req.DryRun {
		rp.pool = nil
	}
	cfg.Docs, cfg.OnDrift = true, rp.onDrift
	var err error
	rp.rep.Report, err = Run(ctx, cfg)
	for _, k := range Kinds {
		rp.rep.Queued[k] += 0 // every kind, zero or not
	}
	if err != nil {
		return rp.rep, err
	}
	total := rp.rep.QueuedTotal()
	if total > int64(req.Max) && !req.Yes {
		return rp.rep, &RefusedError{Queued: total, Max: req.Max}
	}
	for len(rp.held) > 0 {
		n := min(len(rp.held), RepairBatch)
		if err := rp.queue(ctx, rp.held[:n]); err != nil {
			return rp.rep, err
		}
		rp.held = rp.held[n:]
	}
	return rp.rep, nil
}

func (req RepairRequest) check() error {
	switch {
	case strings.TrimSpace(req.By) == "":
		return bounds.Invalid("By", "is required: say who is repairing")
	case strings.TrimSpace(req.Why) == "":
		return bounds.Invalid("Why", "is required: say why")
	}
	return bounds.Check("Max", req.Max, RepairMaxRange)
}

// repairer queues a repair's events as the verify finds drift, and keeps
// the report.
type repairer struct {
	rep RepairReport
	req RepairRequest
	// selector is what each audit row says the repair was of: the
	// projection, the index and the source table.
	selector   map[string]any
	projection string
	// pool is nil on a dry run: nothing is queued.
	pool *pgxpool.Pool
	// held are the events that wait for the end of the verify, without
	// Yes, while they are no more than Max.
	held []repairEvent
}

// onDrift is the verify's Config.OnDrift: it counts each drifted document
// by what a repair can do for it, and queues the repairable ones, or holds
// them until the verify is over.
func (rp *repairer) onDrift(ctx context.Context, drift []Drift) error {
	var batch []repairEvent
	for _, d := range drift {
		ev, why := repairOf(d)
		if why != "" {
			rp.rep.Unrepairable[why]++
			continue
		}
		rp.rep.Queued[ev.kind]++
		batch = append(batch, ev)
	}
	switch {
	case rp.pool == nil || len(batch) == 0:
	case rp.req.Yes:
		return rp.queue(ctx, batch)
	case rp.rep.QueuedTotal() <= int64(rp.req.Max):
		rp.held = append(rp.held, batch...)
	default:
		rp.held = nil // over Max: nothing will be queued
	}
	return nil
}

// queue inserts a batch of repair events and its audit row in one
// transaction, and asks the leader to claim from the head at once: the
// events fall due at the transaction's start, behind the claim cursor
// once the leader claimed anything committed meanwhile, where only a claim
// from the head finds them (a poll interval later, without the request).
func (rp *repairer) queue(ctx context.Context, batch []repairEvent) error {
	n := len(batch)
	types, ids, ops, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions := make([]int64, n)
	queued := map[Kind]int64{}
	for i, ev := range batch {
		types[i], ids[i], ops[i], versions[i], payloads[i] = ev.entityType, ev.entityID, ev.op, ev.version, ev.payload
		queued[ev.kind]++
	}
	var got []int64
	var auditID int64
	err := pgx.BeginFunc(ctx, rp.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, repairSQL, rp.projection, types, ids, ops, versions, payloads)
		if err != nil {
			return fmt.Errorf("queue repair events: %w", err)
		}
		if got, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return fmt.Errorf("queue repair events: %w", err)
		}
		if _, err := tx.Exec(ctx, outbox.NotifyHeadSQL); err != nil {
			return fmt.Errorf("queue repair events: %w", err)
		}
		selector := maps.Clone(rp.selector)
		selector["queued"], selector["batch"] = queued, len(rp.rep.AuditIDs)+1
		selector["first_event_id"], selector["last_event_id"] = slices.Min(got), slices.Max(got)
		auditID, _, err = outbox.WriteAudit(ctx, tx, outbox.Audit{Action: "repair", By: rp.req.By, Why: rp.req.Why,
			Selector: selector, EventIDs: got, Count: int64(len(got))})
		return err
	})
	if err != nil {
		return fmt.Errorf("repair: %w", err)
	}
	r := &rp.rep
	r.FirstEventID = min(cmp.Or(r.FirstEventID, slices.Min(got)), slices.Min(got))
	r.LastEventID = max(r.LastEventID, slices.Max(got))
	r.AuditID = cmp.Or(r.AuditID, auditID)
	r.AuditIDs = append(r.AuditIDs, auditID)
	return nil
}
