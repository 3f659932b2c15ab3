package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Rebase makes the queue of a database that moved to another cluster
// readable again (see Home). No saved position can be trusted in the new
// counter, so none is kept: every queued row is settled by what can be
// known of it, in pages of one short transaction each, then the positions
// start again from a snapshot of this cluster.
//
//   - A row this cluster did not number (its tuple's xmin is not its xid:
//     pg_dump's COPY or a logical replication worker wrote it) came from
//     the old cluster with the old xid. Behind its projection's old done
//     position (judged in the old numbers, where both belong) it was sent
//     and confirmed there: it becomes done. Otherwise it becomes pending,
//     and the claim sends it.
//   - A row this cluster numbered and committed before the snapshot was
//     never read by anyone here: it becomes pending too.
//   - A row that commits after the snapshot stays queued: the new origin
//     reads it.
//
// Nothing is lost; a row sent in the old cluster whose confirmation the
// dump did not carry is sent again, which the engine's external versions
// (and the chronicle's unique event id) make a no-op.
//
// With KeptCounter the operator says the counter went on from the old
// cluster's (pg_upgrade, a file-level copy: the system identifier changed,
// the numbers did not): the positions are kept and only the record of the
// cluster changes. It is refused when any sign says otherwise: a position
// ahead of the counter, or a queued row behind a position that this
// cluster did not number.

// RebaseRequest is what Rebase takes.
type RebaseRequest struct {
	// By and Why go to the audit row. Required.
	By, Why string
	// KeptCounter keeps the positions (see Rebase).
	KeptCounter bool
	// DryRun counts what a rebase would do and changes nothing.
	DryRun bool
	// Page is how many queued rows one transaction settles. Defaults to
	// rebasePageDefault.
	Page int
}

const rebasePageDefault = 5000

// RebaseResult is what Rebase did, or would do (DryRun).
type RebaseResult struct {
	Home        Home   `json:"home"`
	KeptCounter bool   `json:"kept_counter"`
	DryRun      bool   `json:"dry_run"`
	Snapshot    string `json:"snapshot,omitempty"`
	// Done are rows from the old cluster behind its positions; Pending the
	// rows the claim now sends; Left the rows the new origin reads.
	Done    int64 `json:"done"`
	Pending int64 `json:"pending"`
	Left    int64 `json:"left"`
	AuditID int64 `json:"audit_id,omitempty"`
}

// RebaseRefusedError is a rebase that looked and refused; nothing changed.
type RebaseRefusedError struct{ Reason string }

func (e *RebaseRefusedError) Error() string { return e.Reason + "; nothing changed" }

// ErrNothingToRebase says the queue's positions belong to this cluster.
var ErrNothingToRebase = &RebaseRefusedError{Reason: "nothing to rebase: the queue's positions belong to this cluster"}

// Rebase settles the queue of a moved database (see above), audited.
func Rebase(ctx context.Context, conn *pgx.Conn, req RebaseRequest) (RebaseResult, error) {
	if req.By == "" || req.Why == "" {
		return RebaseResult{}, errors.New("by and why are required: the rebase is audited; nothing changed")
	}
	home, err := CheckHome(ctx, conn)
	if err != nil {
		return RebaseResult{}, err
	}
	res := RebaseResult{Home: home, KeptCounter: req.KeptCounter, DryRun: req.DryRun}
	switch {
	case home.Unchecked:
		return res, &RebaseRefusedError{Reason: "the schema is older than 23 (no outbox_queue_home): run wlproj migrate first"}
	case home.Problem() == "":
		return res, ErrNothingToRebase
	case req.KeptCounter:
		return keepCounter(ctx, conn, req, res)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&res.Snapshot); err != nil {
		return res, fmt.Errorf("rebase: snapshot: %w", err)
	}
	if !req.DryRun {
		// Whatever still leads here (a binary before 23 checks nothing)
		// is fenced: its acks and positions change nothing from now on.
		if _, err := conn.Exec(ctx, fenceAllSQL); err != nil {
			return res, fmt.Errorf("rebase: fence the leaders: %w", err)
		}
	}
	if err := settlePages(ctx, conn, req, &res); err != nil {
		return res, err
	}
	if req.DryRun {
		return res, nil
	}
	return res, recordHome(ctx, conn, req, &res, true)
}

// fenceAllSQL moves every leader group's epoch on, as a takeover would.
const fenceAllSQL = `UPDATE outbox_leader SET epoch = epoch + 1, holder = 'wlproj queue rebase', acquired_at = now()`

// settlePageSQL settles one page of queued rows, in id order past @after
// (see Rebase). Copied is judged per row: a row's xmin is the low 32 bits
// of the xid that wrote it here, and a queued row is never updated.
const settlePageSQL = `
WITH page AS (
  SELECT e.id, e.xid, e.projection,
         e.xmin::text::bigint <> (e.xid::text::numeric % 4294967296)::bigint AS copied
    FROM outbox_events e
   WHERE e.status = 'queued' AND e.id > @after
   ORDER BY e.id LIMIT @page
), judged AS (
  SELECT p.id, p.copied,
         p.copied AND coalesce(outbox_behind(p.xid, p.id, coalesce(q.done_prev, o.snapshot), coalesce(q.done_cur, o.snapshot),
                                             coalesce(q.done_xid, '0'), coalesce(q.done_id, 0)), false) AS behind,
         p.copied OR pg_visible_in_snapshot(p.xid, @snap::text::pg_snapshot) AS settle
    FROM page p LEFT JOIN outbox_queue_origin o ON true LEFT JOIN outbox_positions q ON q.projection = p.projection
), moved AS (
  UPDATE outbox_events e
     SET status = CASE WHEN j.behind THEN 'done' ELSE 'pending' END, next_retry_at = now(),
         processed_at = CASE WHEN j.behind THEN now() END, updated_at = now()
    FROM judged j
   WHERE e.id = j.id AND j.settle AND e.status = 'queued' AND NOT @dry
  RETURNING e.id
)
SELECT coalesce(max(id), -1), count(*) FILTER (WHERE behind), count(*) FILTER (WHERE settle AND NOT behind),
       count(*) FILTER (WHERE NOT settle) FROM judged`

// settlePages runs settlePageSQL page after page, each its own short
// transaction, so no snapshot is held across the table.
func settlePages(ctx context.Context, conn *pgx.Conn, req RebaseRequest, res *RebaseResult) error {
	page := cmp.Or(req.Page, rebasePageDefault)
	for after := int64(0); ; {
		var last, done, pending, left int64
		err := conn.QueryRow(ctx, settlePageSQL, pgx.NamedArgs{"after": after, "page": page, "snap": res.Snapshot,
			"dry": req.DryRun}).Scan(&last, &done, &pending, &left)
		if err != nil {
			return fmt.Errorf("rebase: settle rows past id %d: %w", after, err)
		}
		if last < 0 {
			return nil
		}
		res.Done, res.Pending, res.Left, after = res.Done+done, res.Pending+pending, res.Left+left, last
	}
}

// keepCounter records this cluster as the queue's home, keeping the
// positions, after checking that nothing says the counter was reset.
func keepCounter(ctx context.Context, conn *pgx.Conn, req RebaseRequest, res RebaseResult) (RebaseResult, error) {
	if res.Home.Furthest > res.Home.Next {
		return res, &RebaseRefusedError{Reason: fmt.Sprintf("--kept-counter refused: a saved position (transaction %d) lies "+
			"ahead of this cluster's counter (%d), so the counter did not go on; run the rebase without it", res.Home.Furthest, res.Home.Next)}
	}
	var copied int64
	if err := conn.QueryRow(ctx, copiedBehindSQL).Scan(&copied); err != nil {
		return res, fmt.Errorf("rebase: %w", err)
	}
	if copied > 0 {
		return res, &RebaseRefusedError{Reason: fmt.Sprintf("--kept-counter refused: %d queued rows behind the positions "+
			"were written by another cluster's transactions (restored or replicated rows), so the counter did not go on; "+
			"run the rebase without it", copied)}
	}
	if req.DryRun {
		return res, nil
	}
	return res, recordHome(ctx, conn, req, &res, false)
}

// copiedBehindSQL counts, among the newest queued rows of each projection
// behind its done position, those this cluster did not number.
const copiedBehindSQL = `
SELECT count(*) FROM outbox_positions q CROSS JOIN LATERAL (
  SELECT e.xmin, e.xid FROM outbox_events e
   WHERE e.status = 'queued' AND e.projection = q.projection AND e.xid < pg_snapshot_xmax(q.done_prev)
   ORDER BY e.xid DESC, e.id DESC LIMIT 100) e
 WHERE e.xmin::text::bigint <> (e.xid::text::numeric % 4294967296)::bigint`

// recordHome writes this cluster into outbox_queue_home and the audit row
// in one transaction; a full rebase (restart) also starts the positions
// again from its snapshot.
func recordHome(ctx context.Context, conn *pgx.Conn, req RebaseRequest, res *RebaseResult, restart bool) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if restart {
			if _, err := tx.Exec(ctx, restartPositionsSQL, res.Snapshot); err != nil {
				return fmt.Errorf("rebase: restart the positions: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, recordHomeSQL, req.By); err != nil {
			return fmt.Errorf("rebase: record the cluster: %w", err)
		}
		id, _, err := WriteAudit(ctx, tx, Audit{Action: "rebase", By: req.By, Why: req.Why, Count: res.Done + res.Pending,
			Selector: map[string]any{"from_cluster": res.Home.Recorded, "to_cluster": res.Home.Here,
				"kept_counter": req.KeptCounter, "snapshot": res.Snapshot, "done": res.Done, "pending": res.Pending, "left": res.Left}})
		res.AuditID = id
		return err
	})
}

const restartPositionsSQL = `
WITH gone AS (DELETE FROM outbox_positions)
INSERT INTO outbox_queue_origin (snapshot) VALUES ($1::text::pg_snapshot)
ON CONFLICT (one) DO UPDATE SET snapshot = excluded.snapshot, since = now()`

const recordHomeSQL = `
INSERT INTO outbox_queue_home (system_identifier, recorded_xid, recorded_by)
SELECT system_identifier, pg_current_xact_id(), 'rebase by ' || $1 FROM pg_control_system()
ON CONFLICT (one) DO UPDATE SET system_identifier = excluded.system_identifier, recorded_xid = excluded.recorded_xid,
       recorded_by = excluded.recorded_by, recorded_at = now()`
