package replay

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// previewPage is the most rows one statement of a preview reads.
const previewPage = 1000

// preview reads the rows a checked req selects, as once would take them,
// and refuses as once would (an id missing or in another status, the cap),
// but locks nothing and reads a page per transaction of its own: a dry
// run, and a confirmation's check of its selection. A dry run that locked
// its selection in one transaction held every matching row, and vacuum,
// for as long as it read, and made a replay or an ack of those rows wait.
func (a action) preview(ctx context.Context, db Beginner, req Request, limit int) (Report, error) {
	rep := Report{DryRun: req.DryRun}
	req.Max = cmp.Or(req.Max, MaxDefault)
	var err error
	if len(req.IDs) > 0 {
		err = a.previewIDs(ctx, db, req, limit, &rep)
	} else {
		err = a.previewSelector(ctx, db, req, limit, &rep)
	}
	if err != nil {
		return rep, err
	}
	rep.Token = SelectionToken(rep.IDs())
	return rep, nil
}

func (a action) previewIDs(ctx context.Context, db Beginner, req Request, limit int, rep *Report) error {
	f := req.filter()
	for chunk := range slices.Chunk(sortedIDs(req.IDs), previewPage) {
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return a.collectByIDs(ctx, tx, a.rows.readByIDs, chunk, limit, f, rep)
		})
		if err != nil {
			return err
		}
	}
	if problems := a.problems(rep); len(problems) > 0 {
		rep.Events = nil
		return &RefusedError{Action: a.name, Problems: problems}
	}
	return nil
}

// previewSelector reads a selection by selector. With a limit (the
// request's, or one past the cap) it reads the lowest ids in one
// statement, as once takes them; without one, pages in the order of
// failure along the partial indexes, each after the last, until one
// comes back short.
func (a action) previewSelector(ctx context.Context, db Beginner, req Request, limit int, rep *Report) error {
	capped, limit := a.capLimit(req, limit)
	f := req.filter()
	at, after := time.Unix(0, 0).UTC(), int64(0)
	for {
		query, args := a.rows.page, append(f.args(), previewPage, at, after)
		if limit > 0 {
			query, args = a.rows.lowest, append(f.args(), limit)
		}
		var page []FailedEvent
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, query, args...)
			if err == nil {
				page, err = pgx.CollectRows(rows, scanFailed)
			}
			if err == nil && capped && len(page) > req.Max {
				err = a.overCap(ctx, tx, req, f, rep)
			}
			return err
		})
		if err != nil {
			return err
		}
		rep.Events = append(rep.Events, page...)
		if limit > 0 || len(page) < previewPage {
			break
		}
		at, after = page[len(page)-1].UpdatedAt, page[len(page)-1].ID
	}
	// A row that failed again between two pages is read twice.
	slices.SortFunc(rep.Events, func(x, y FailedEvent) int { return cmp.Compare(x.ID, y.ID) })
	rep.Events = slices.CompactFunc(rep.Events, func(x, y FailedEvent) bool { return x.ID == y.ID })
	return nil
}

// confirmed applies an action held to its dry run (req.Expect): the
// selection, read again as the dry run read it, must be the dry run's, or
// nothing changes. A selection of at most size rows is then taken as once
// takes it, in one transaction that checks it again under lock. A larger
// one goes in transactions of size of its ids, each with its own audit
// row, each changing those rows still in the status the action takes and
// still matching, and leaving the others (changed by someone else since)
// alone, reported as NotFailed, Skipped or Missing: one transaction over
// the whole selection would hold its row locks, and vacuum, for as long.
func (a action) confirmed(ctx context.Context, db Beginner, req Request, size int) (Report, error) {
	seen, err := a.preview(ctx, db, req, req.Limit)
	seen.DryRun = false
	switch {
	case err != nil:
		return seen, err
	case seen.Token != req.Expect:
		n := len(seen.Events)
		seen.Events = nil
		return seen, a.changed(n)
	case len(seen.Events) <= size:
		return a.once(ctx, db, req, req.Limit)
	}
	rep := Report{Token: seen.Token}
	f := req.filter()
	for chunk := range slices.Chunk(seen.IDs(), size) {
		var b Report
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := a.collectByIDs(ctx, tx, a.rows.byIDs, chunk, 0, f, &b); err != nil || len(b.Events) == 0 {
				return err
			}
			var err error
			b.AuditID, b.At, err = a.on(b.IDs(), req.By, req.Why, req.ResetAttempts, req.auditSelector()).apply(ctx, tx)
			return err
		})
		if err != nil {
			return rep, err
		}
		rep.Events, rep.NotFailed = append(rep.Events, b.Events...), append(rep.NotFailed, b.NotFailed...)
		rep.Skipped, rep.Missing = append(rep.Skipped, b.Skipped...), append(rep.Missing, b.Missing...)
		if b.AuditID != 0 {
			rep.AuditIDs = append(rep.AuditIDs, b.AuditID)
			rep.AuditID, rep.At = cmp.Or(rep.AuditID, b.AuditID), b.At
		}
	}
	return rep, nil
}
