package verify

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/outbox"
)

const (
	// RepairMaxDefault is the most documents a repair queues without Yes,
	// as replay's cap; the CLI's --max takes its default from here.
	RepairMaxDefault = 1000
	// auditIDsMax bounds the event ids one audit row lists; the selector
	// keeps the first and last id of a larger repair.
	auditIDsMax = 10000
)

// RepairMaxRange is what RepairRequest.Max accepts.
var RepairMaxRange = bounds.Range[int]{Min: 1, Max: 100_000_000}

// Reasons a drifted document gets no repair event.
const (
	NoSource  = "no_source"  // missing or stale without a source table: no document to send
	NoEntity  = "no_entity"  // the _id is not entity_type:entity_id, which no event addresses
	NoVersion = "no_version" // the source row's version is NULL
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
	AuditID      int64 `json:"audit_id,omitempty"`
	DryRun       bool  `json:"dry_run"`
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
// loop (a repair is sent at the ledger's version) both take. A delete at
// that version, not above it, leaves a producer's next version free.
func repairOf(d Drift) (repairEvent, string) {
	ev := repairEvent{kind: d.Kind, entityType: d.EntityType, entityID: d.EntityID, payload: "{}"}
	switch {
	case d.EntityType == "":
		return ev, NoEntity
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
// document it can put right, in one transaction with one audit row (action
// repair): the leader applies them through the normal path (ledger,
// fencing). Over Max without Yes, or on a dry run, nothing is queued. A
// repair queues events, so it runs as a role that may insert them.
func Repair(ctx context.Context, cfg Config, req RepairRequest) (RepairReport, error) {
	rp := &repairer{rep: RepairReport{Queued: map[Kind]int64{}, Unrepairable: map[string]int64{}, DryRun: req.DryRun}}
	req.Max = cmp.Or(req.Max, RepairMaxDefault)
	cfg = cfg.withDefaults()
	if err := req.check(); err != nil {
		return rp.rep, err
	}
	if !req.DryRun && cfg.Pool != nil {
		var err error
		if rp.tx, err = cfg.Pool.Begin(ctx); err != nil {
			return rp.rep, fmt.Errorf("repair: %w", err)
		}
		defer rp.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	}
	rp.projection = cfg.Projection
	cfg.Docs, cfg.OnDrift = true, rp.onDrift
	var err error
	if rp.rep.Report, err = Run(ctx, cfg); err != nil {
		return rp.rep, err
	}
	for _, k := range Kinds {
		rp.rep.Queued[k] += 0 // every kind, zero or not
	}
	total := rp.rep.QueuedTotal()
	if total > int64(req.Max) && !req.Yes {
		rp.rep.FirstEventID, rp.rep.LastEventID = 0, 0
		return rp.rep, &RefusedError{Queued: total, Max: req.Max}
	}
	if rp.tx == nil || total == 0 {
		return rp.rep, nil
	}
	return rp.rep, rp.commit(ctx, req, total)
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

// repairer queues a repair's events as the verify finds drift, in one
// transaction (none on a dry run), and keeps the report.
type repairer struct {
	rep        RepairReport
	tx         pgx.Tx
	projection string
	// ids are the first events queued, for the audit row.
	ids []int64
}

// onDrift is the verify's Config.OnDrift: it counts each drifted document
// by what a repair can do for it, and queues the repairable ones.
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
	if rp.tx == nil || len(batch) == 0 {
		return nil
	}
	got, err := queue(ctx, rp.tx, rp.projection, batch)
	if err != nil {
		return err
	}
	for _, id := range got {
		if rp.rep.FirstEventID == 0 || id < rp.rep.FirstEventID {
			rp.rep.FirstEventID = id
		}
		rp.rep.LastEventID = max(rp.rep.LastEventID, id)
	}
	if room := auditIDsMax - len(rp.ids); room > 0 {
		rp.ids = append(rp.ids, got[:min(room, len(got))]...)
	}
	return nil
}

// commit writes the audit row of total queued events and commits.
func (rp *repairer) commit(ctx context.Context, req RepairRequest, total int64) error {
	rep := &rp.rep
	selector := map[string]any{"projection": rep.Projection, "index": rep.Index, "source_table": rep.SourceTable,
		"drift": rep.Counts, "queued": rep.Queued, "unrepairable": rep.Unrepairable, "checked": rep.Checked,
		"first_event_id": rep.FirstEventID, "last_event_id": rep.LastEventID, "event_ids_listed": len(rp.ids)}
	var err error
	if rep.AuditID, _, err = outbox.WriteAudit(ctx, rp.tx, outbox.Audit{Action: "repair", By: req.By, Why: req.Why,
		Selector: selector, EventIDs: rp.ids, Count: total}); err != nil {
		return err
	}
	if err := rp.tx.Commit(ctx); err != nil {
		return fmt.Errorf("repair: commit: %w", err)
	}
	return nil
}

// queue inserts a batch of repair events and returns their ids.
func queue(ctx context.Context, tx pgx.Tx, projection string, batch []repairEvent) ([]int64, error) {
	n := len(batch)
	types, ids, ops, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions := make([]int64, n)
	for i, ev := range batch {
		types[i], ids[i], ops[i], versions[i], payloads[i] = ev.entityType, ev.entityID, ev.op, ev.version, ev.payload
	}
	rows, err := tx.Query(ctx, repairSQL, projection, types, ids, ops, versions, payloads)
	if err != nil {
		return nil, fmt.Errorf("queue repair events: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("queue repair events: %w", err)
	}
	return got, nil
}
