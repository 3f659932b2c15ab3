package replay

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/outbox"
)

// action is one kind of audited change to a set of rows: replay, discard,
// archive, restore. They share the selection, the locking, the cap, the
// refusal by id and the audit row; only the statement differs.
type action struct {
	// name is the audit row's action and the verb of messages.
	name string
	// doing names the action in AuditRequiredError.
	doing string
	rows  rowSet
	// capped applies Max to requests without IDs; archive moves in batches
	// instead.
	capped bool
	// oldest selects by the row set's oldest query (a batch) instead of
	// its locked one.
	oldest bool
	// sql changes the locked rows, with the named arguments of change.apply;
	// its WHERE checks the status again, so it is a compare-and-set.
	sql string
	// notify wakes the leader at commit (an INSERT does that by trigger).
	notify bool
	// lockedDryRun makes a dry run lock its rows as the action would
	// instead of reading them (preview): a restore's, whose rows are in the
	// dead letter, where no drain waits for them, and whose lock tells a
	// role that may not restore so at the dry run.
	lockedDryRun bool
}

// run checks req and applies the action: a dry run reads (preview); a
// confirmation of a dry run goes as confirmed says; otherwise in one
// transaction, or, for an uncapped request (Yes) by selector with no
// Limit, in batches.
func (a action) run(ctx context.Context, db Beginner, req Request) (Report, error) {
	if err := req.check(a.doing); err != nil {
		return Report{DryRun: req.DryRun}, err
	}
	switch {
	case req.DryRun && !a.lockedDryRun:
		return a.preview(ctx, db, req, req.Limit)
	case req.Expect != "":
		return a.confirmed(ctx, db, req, BatchDefault)
	case a.capped && req.Yes && len(req.IDs) == 0 && req.Limit == 0:
		return a.batches(ctx, db, req, BatchDefault)
	}
	return a.once(ctx, db, req, req.Limit)
}

// batches applies the action to the rows a checked req selects, oldest
// failure first, at most size of them a transaction, each committed with
// its own audit row, until a batch finds none. A transaction over a
// whole selection would hold its xid and its row locks, and so vacuum,
// for as long as it takes (ten seconds for 100,000 rows). Only rows that
// failed before the first batch are taken: a replayed row that fails again
// is not replayed again by the same command, and the batches end. A batch
// that comes back short does not end them: a row another transaction
// changed while the batch waited for its lock leaves the batch, not the
// rows behind it. A failure stops it after the batches already committed.
func (a action) batches(ctx context.Context, db Beginner, req Request, size int) (Report, error) {
	rep := Report{DryRun: req.DryRun}
	start, err := dbNow(ctx, db)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", a.name, err)
	}
	if req.Until.IsZero() || req.Until.After(start) {
		req.Until = start
	}
	batch := a
	batch.capped, batch.oldest = false, true
	for {
		b, err := batch.once(ctx, db, req, size)
		if err != nil {
			return rep, err
		}
		if b.AuditID != 0 {
			rep.Events = append(rep.Events, b.Events...)
			rep.AuditIDs = append(rep.AuditIDs, b.AuditID)
			rep.AuditID, rep.At = cmp.Or(rep.AuditID, b.AuditID), b.At
		}
		if len(b.Events) == 0 {
			return rep, nil
		}
	}
}

// dbNow is the database's clock, which updated_at is written by.
func dbNow(ctx context.Context, db Beginner) (time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	var now time.Time
	err = tx.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// once selects and locks the rows of a checked req, at most limit of them
// (0: no limit but the cap), and changes them with one audit row.
func (a action) once(ctx context.Context, db Beginner, req Request, limit int) (Report, error) {
	rep := Report{DryRun: req.DryRun}
	req.Max = cmp.Or(req.Max, MaxDefault)
	tx, err := db.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", a.name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	f := req.filter()
	if len(req.IDs) > 0 {
		err = a.selectByIDs(ctx, tx, req.IDs, limit, f, &rep)
	} else {
		err = a.selectBySelector(ctx, tx, req, limit, f, &rep)
	}
	if err != nil {
		return rep, err
	}
	rep.Token = SelectionToken(rep.IDs())
	if req.Expect != "" && req.Expect != rep.Token {
		// The rows stay locked until the rollback, so what the message
		// counts is what the action would have taken.
		n := len(rep.Events)
		rep.Events = nil
		return rep, a.changed(n)
	}
	if len(rep.Events) == 0 || req.DryRun {
		return rep, nil
	}
	c := a.on(rep.IDs(), req.By, req.Why, req.ResetAttempts, req.auditSelector())
	if rep.AuditID, rep.At, err = c.apply(ctx, tx); err != nil {
		return rep, err
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("%s: commit: %w", a.name, err)
	}
	return rep, nil
}

// changed is the refusal of a confirmation whose selection is not its dry
// run's any more; n rows match now.
func (a action) changed(n int) *RefusedError {
	return &RefusedError{Action: a.name, Changed: true, Matching: int64(n), Problems: []string{fmt.Sprintf(
		"the selection changed since the dry run: %d %s events match now, not the ones confirmed; "+
			"run the dry run again", n, a.rows.want)}}
}

// selectByIDs locks the rows of ids and refuses, as problems says, when
// any is missing or in another status.
func (a action) selectByIDs(ctx context.Context, tx pgx.Tx, ids []int64, limit int, f Filter, rep *Report) error {
	if err := a.collectByIDs(ctx, tx, a.rows.byIDs, sortedIDs(ids), limit, f, rep); err != nil {
		return err
	}
	if len(rep.Missing) > 0 {
		// The outbox's rotation moves a row it keeps (a failed one, say)
		// into the current partition by a DELETE and an INSERT. A lock
		// that waited for the move finds the row it saw deleted, and the
		// moved one came after its statement's snapshot: read the missing
		// ids once more, in a statement whose snapshot sees the move.
		missing := rep.Missing
		rep.Missing = nil
		if err := a.collectByIDs(ctx, tx, a.rows.byIDs, missing, limit, f, rep); err != nil {
			return err
		}
		slices.SortFunc(rep.Events, func(x, y FailedEvent) int { return cmp.Compare(x.ID, y.ID) })
	}
	if problems := a.problems(rep); len(problems) > 0 {
		rep.Events = nil
		return &RefusedError{Action: a.name, Problems: problems}
	}
	return nil
}

func sortedIDs(ids []int64) []int64 {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return slices.Compact(ids)
}

// collectByIDs reads the rows of sorted ids with query (byIDs or
// readByIDs) and sorts them into rep: taken, in another status, left out
// by the filter or the limit, or missing.
func (a action) collectByIDs(ctx context.Context, tx pgx.Tx, query string, ids []int64, limit int, f Filter, rep *Report) error {
	rows, err := tx.Query(ctx, query, append(f.args(), ids)...)
	if err != nil {
		return fmt.Errorf("%s: select ids: %w", a.name, err)
	}
	defer rows.Close()
	found := make(map[int64]bool, len(ids))
	for rows.Next() {
		var wanted, matches bool
		e, err := scanEvent(rows, &wanted, &matches)
		if err != nil {
			return fmt.Errorf("%s: select ids: %w", a.name, err)
		}
		found[e.ID] = true
		switch {
		case !wanted:
			rep.NotFailed = append(rep.NotFailed, IDStatus{ID: e.ID, Status: e.Status})
		case !matches || (limit > 0 && len(rep.Events) >= limit):
			rep.Skipped = append(rep.Skipped, e.ID)
		default:
			rep.Events = append(rep.Events, e)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: select ids: %w", a.name, err)
	}
	for _, id := range ids {
		if !found[id] {
			rep.Missing = append(rep.Missing, id)
		}
	}
	return nil
}

// problems says, by id, why requested rows cannot be taken: one line for the
// unknown ids and one per status, ids compacted, so a wide range stays
// readable.
func (a action) problems(rep *Report) []string {
	var problems []string
	if len(rep.Missing) > 0 {
		problems = append(problems, a.rows.unknown+": "+FormatIDs(rep.Missing))
	}
	byStatus := map[string][]int64{}
	var statuses []string
	for _, nf := range rep.NotFailed {
		if byStatus[nf.Status] == nil {
			statuses = append(statuses, nf.Status)
		}
		byStatus[nf.Status] = append(byStatus[nf.Status], nf.ID)
	}
	for _, st := range statuses {
		ids := byStatus[st]
		if a.rows.never != nil {
			if msg := a.rows.never(st, ids); msg != "" {
				problems = append(problems, msg)
				continue
			}
		}
		if len(ids) == 1 {
			problems = append(problems, fmt.Sprintf("id %d is %s, not %s", ids[0], st, a.rows.want))
		} else {
			problems = append(problems, fmt.Sprintf("ids %s are %s, not %s", FormatIDs(ids), st, a.rows.want))
		}
	}
	return problems
}

func (a action) selectBySelector(ctx context.Context, tx pgx.Tx, req Request, limit int, f Filter, rep *Report) error {
	capped, limit := a.capLimit(req, limit)
	var limitArg any
	if limit > 0 {
		limitArg = limit
	}
	query := a.rows.locked
	if a.oldest {
		query = a.rows.oldest
	}
	rows, err := tx.Query(ctx, query, append(f.args(), limitArg)...)
	if err != nil {
		return fmt.Errorf("%s: select: %w", a.name, err)
	}
	rep.Events, err = pgx.CollectRows(rows, scanFailed)
	if err != nil {
		return fmt.Errorf("%s: select: %w", a.name, err)
	}
	if !capped || len(rep.Events) <= req.Max {
		return nil
	}
	return a.overCap(ctx, tx, req, f, rep)
}

// capLimit is whether the cap applies to req, and the limit of its
// selection: without Yes, one row past the cap, enough to know it is
// exceeded without reading, or locking, the whole match.
func (a action) capLimit(req Request, limit int) (bool, int) {
	capped := a.capped && !req.Yes
	if capped && (limit == 0 || limit > req.Max) {
		limit = req.Max + 1
	}
	return capped, limit
}

// overCap is the refusal of a selection of more than req.Max rows, with
// their count.
func (a action) overCap(ctx context.Context, tx pgx.Tx, req Request, f Filter, rep *Report) error {
	rep.Events = nil
	if err := tx.QueryRow(ctx, a.rows.count, f.args()...).Scan(&rep.Matching); err != nil {
		return fmt.Errorf("%s: count: %w", a.name, err)
	}
	if req.Limit > 0 {
		rep.Matching = min(rep.Matching, int64(req.Limit))
	}
	return &RefusedError{Action: a.name, Matching: rep.Matching, Max: req.Max, Problems: []string{fmt.Sprintf(
		"%d %s events match, more than Max %d; narrow the selector, raise Max, or set Yes",
		rep.Matching, a.rows.want, req.Max)}}
}

// change is one application of an action to rows the caller has locked.
type change struct {
	action
	ids      []int64
	by, why  string
	reset    bool
	selector any
}

func (a action) on(ids []int64, by, why string, reset bool, selector any) change {
	return change{action: a, ids: ids, by: by, why: why, reset: reset, selector: selector}
}

// apply writes the audit row first, so the statement can stamp its id into
// each row, then runs the statement and insists that it touched exactly the
// audited rows. The caller commits.
func (c change) apply(ctx context.Context, tx pgx.Tx) (int64, time.Time, error) {
	auditID, at, err := outbox.WriteAudit(ctx, tx, outbox.Audit{Action: c.name, By: c.by, Why: c.why,
		Selector: c.selector, EventIDs: c.ids, Count: int64(len(c.ids))})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("%s: %w", c.name, err)
	}
	tag, err := tx.Exec(ctx, c.sql, pgx.NamedArgs{
		"ids": c.ids, "by": c.by, "why": c.why, "reset": c.reset, "audit_id": auditID, "keep": outbox.HistoryKeep,
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("%s: %w", c.name, err)
	}
	if tag.RowsAffected() != int64(len(c.ids)) {
		// Cannot happen while the rows are locked; refuse rather than audit a
		// count that is not true.
		return 0, time.Time{}, fmt.Errorf("%s: changed %d rows, expected %d; rolled back", c.name, tag.RowsAffected(), len(c.ids))
	}
	if c.notify {
		// A NOTIFY is delivered at commit and dropped on rollback, so the
		// leader wakes only for rows that are really pending.
		if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox_events', '')`); err != nil {
			return 0, time.Time{}, fmt.Errorf("%s: notify: %w", c.name, err)
		}
	}
	return auditID, at, nil
}

// SelectionToken names a set of rows by their ids, in any order: equal sets
// give equal tokens, and the token of a set of one size never equals one of
// another. It is short enough for a form field or a command line.
func SelectionToken(ids []int64) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	h := sha256.New()
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(len(ids)))
	h.Write(buf[:])
	for _, id := range ids {
		binary.BigEndian.PutUint64(buf[:], uint64(id))
		h.Write(buf[:])
	}
	return fmt.Sprintf("%d-%x", len(ids), h.Sum(nil)[:12])
}
