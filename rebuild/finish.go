package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wlproj/wlproj/projection"
)

const swappedSet = `, finished_at = now(), rows_loaded = $4, rows_refused = $5, rows_superseded = $6`

// finish makes the new index serve: its refresh interval as the old one's,
// refreshed, then the alias swapped to it and the rebuild closed, both
// while the current leader's fresh confirmation holds. A re-run after a
// crash between the swap and the close only closes.
func (r *runner) finish(ctx context.Context, row *Row) error {
	cur, err := r.eng.resolve(ctx, row.Alias)
	if err != nil {
		return err
	}
	swapped := !cur.Concrete && slices.Equal(cur.Indexes, []string{row.Target})
	if !swapped && !opened(cur, row) {
		// Adding the alias would leave it on two indexes: readers would
		// see both, and the leader write neither.
		return fmt.Errorf("%s names %s now, not %s as when rebuild #%d opened: something else moved it; "+
			"--abort the rebuild and start again", row.Alias, orNothing(cur.Indexes), orNothing(nonEmpty(row.OldIndex)), row.ID)
	}
	if !swapped {
		if err := r.guard(ctx, row); err != nil {
			return err
		}
		// Wait for the confirmation before the old index stops refreshing,
		// so that readers do not see it frozen for the wait.
		since, err := dbNow(ctx, r.cfg.Pool)
		if err != nil {
			return err
		}
		r.cfg.Progress.Note(fmt.Sprintf("waiting for the current leader to confirm again that it writes to %s too", row.Target))
		if err := underConfirmation(ctx, r.cfg, row, since, nil); err != nil {
			return err
		}
		return r.swap(ctx, row, since)
	}
	if err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error { return r.close(ctx, tx, row) }); err != nil {
		return err
	}
	return r.countAfter(ctx, row)
}

// countAfter counts the new index for the report, once the rebuild is
// closed, not in the transaction that closes it: a transaction open across
// a call to the engine would keep its xid, and with it the vacuum horizon,
// for as long as the engine takes. The rebuild is done by then, so a failed
// count is only noted.
func (r *runner) countAfter(ctx context.Context, row *Row) error {
	n, err := r.eng.count(ctx, row.Target)
	if err != nil {
		r.cfg.Progress.Note(fmt.Sprintf("could not count %s after the swap: %v", row.Target, err))
		return nil
	}
	r.rep.DocsAfter = n
	return nil
}

// opened reports whether cur is what the alias named when row opened.
func opened(cur named, row *Row) bool {
	return cur.Concrete == row.OldIsConcrete && slices.Equal(cur.Indexes, nonEmpty(row.OldIndex))
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// close records the swap in the row and the audit, in tx.
func (r *runner) close(ctx context.Context, tx pgx.Tx, row *Row) error {
	r.rep.Loaded, r.rep.Superseded, r.rep.Refused = row.RowsLoaded-r.emittedRefused(row), row.RowsSuperseded, row.RowsRefused
	tag, err := tx.Exec(ctx, `UPDATE outbox_rebuilds SET state = $3`+swappedSet+` WHERE id = $1 AND state = $2`,
		row.ID, StateOpen, StateSwapped, row.RowsLoaded, row.RowsRefused, row.RowsSuperseded)
	if err != nil || tag.RowsAffected() != 1 {
		return fmt.Errorf("close rebuild #%d: %v (rows changed: %d)", row.ID, err, tag.RowsAffected())
	}
	row.State = StateSwapped
	return audit(ctx, tx, r.cfg.By, r.cfg.Why, row.RowsLoaded, auditEntry{Step: "swap", Row: *row,
		Refused: r.rep.RefusedByReason, Lost: r.rep.Lost, LostIDs: r.rep.LostIDs, Behind: r.rep.Behind, Note: r.swapNote(row)})
}

func (r *runner) emittedRefused(row *Row) int64 {
	if row.Mode == ModeEmit {
		return row.RowsRefused
	}
	return 0
}

// swap moves the alias and closes the rebuild, under the current leader's
// confirmation (a heartbeat after since). The old index stops refreshing
// first, so that what readers see of it stops growing; the new index,
// refreshed after that, then shows at least as much (every write reaches
// it before the alias), and no reader sees fewer documents after the swap
// than before.
func (r *runner) swap(ctx context.Context, row *Row, since time.Time) error {
	final, err := r.finalRefresh(ctx, row)
	if err != nil {
		return err
	}
	if err := r.eng.setRefresh(ctx, row.Target, final); err != nil {
		return err
	}
	var restore func()
	if row.OldIndex != "" {
		prev, err := r.eng.refreshInterval(ctx, row.OldIndex)
		if err != nil {
			return err
		}
		if err := r.eng.setRefresh(ctx, row.OldIndex, "-1"); err != nil {
			return err
		}
		restore = func() { _ = r.eng.setRefresh(context.WithoutCancel(ctx), row.OldIndex, unfrozen(prev)) }
	}
	err = r.eng.refresh(ctx, row.Target)
	if err == nil && row.OldIndex != "" {
		r.rep.DocsBefore, err = r.eng.count(ctx, row.Alias)
	}
	if err == nil {
		err = underConfirmation(ctx, r.cfg, row, since, func(tx pgx.Tx) error {
			if err := r.eng.swap(ctx, row); err != nil {
				return err
			}
			return r.close(ctx, tx, row)
		})
	}
	if restore != nil && (err != nil || !row.OldIsConcrete) {
		// The old index refreshes again: a rollback's, until --cleanup.
		restore()
	}
	if err != nil {
		return err
	}
	r.cfg.Progress.Note(r.swapNote(row))
	return r.countAfter(ctx, row)
}

func (r *runner) swapNote(row *Row) string {
	lost := ""
	if r.rep.Lost > 0 {
		lost = fmt.Sprintf("; with --allow-refused, %s lacks %d documents %s had (lost_ids)", row.Target, r.rep.Lost, row.OldIndex)
	}
	switch {
	case row.OldIsConcrete && lost != "":
		return fmt.Sprintf("%s was a concrete index: replaced it, in the same _aliases call, by an alias of that name on %s "+
			"(the concrete index was deleted)%s", row.Alias, row.Target, lost)
	case row.OldIsConcrete:
		return fmt.Sprintf("%s was a concrete index: replaced it, in the same _aliases call, by an alias of that name on %s "+
			"(the concrete index was deleted; its documents are all in %s)", row.Alias, row.Target, row.Target)
	case row.OldIndex == "":
		return fmt.Sprintf("created alias %s on %s", row.Alias, row.Target)
	}
	return fmt.Sprintf("swapped alias %s from %s to %s; the leader keeps writing %s too, for a rollback "+
		"(wlproj rebuild --rollback), until wlproj rebuild --cleanup%s", row.Alias, row.OldIndex, row.Target, row.OldIndex, lost)
}

// finalRefresh is the refresh interval the new index serves with: the
// mapping file's, or the old index's (unless a crash left it frozen), or
// projection.RefreshIntervalDefault when neither sets one.
func (r *runner) finalRefresh(ctx context.Context, row *Row) (any, error) {
	body, err := r.cfg.mappingBody()
	if err != nil || body != nil || row.OldIndex == "" {
		return unfrozen(projection.RefreshInterval(body)), err
	}
	prev, err := r.eng.refreshInterval(ctx, row.OldIndex)
	return unfrozen(prev), err
}

// unfrozen is v, or projection.RefreshIntervalDefault for none, and for
// the -1 a crashed swap may have left.
func unfrozen(v any) any {
	if v == nil || v == "-1" {
		return projection.RefreshIntervalDefault
	}
	return v
}

// Abort closes the open rebuild without a swap: the alias stays, the leader
// stops writing to the new index, and Cleanup deletes that index after
// AbortGrace.
func Abort(ctx context.Context, cfg Config) (Row, error) {
	cfg, l, err := begin(ctx, cfg)
	if err != nil {
		return Row{}, err
	}
	defer l.release()
	row, err := Open(ctx, cfg.Pool, cfg.Projection)
	if err != nil {
		return Row{}, err
	}
	if row == nil {
		return Row{}, refusedf("no open rebuild of projection %q to abort", cfg.Projection)
	}
	row.State = StateAborted
	if err := transition(ctx, cfg.Pool, row.ID, StateOpen, StateAborted, `, finished_at = now(), released_at = now()`,
		cfg.By, cfg.Why, row.RowsLoaded, auditEntry{Step: "abort", Row: *row}); err != nil {
		return Row{}, err
	}
	return *row, nil
}

// Rollback moves the alias back to the index the newest rebuild replaced,
// which the leader kept writing since the swap, and closes the rebuild as
// rolled back: the leader stops writing the new index, and Cleanup deletes
// it after AbortGrace. It refuses (*RefusedError) when the old index is
// gone or released, or when some leader term since the load did not write
// both indexes (the old one may then miss events); it stops
// (*UnconfirmedError) when the current leader does not confirm in time.
func Rollback(ctx context.Context, cfg Config) (Row, error) {
	cfg, l, err := begin(ctx, cfg)
	if err != nil {
		return Row{}, err
	}
	defer l.release()
	row, err := newestRollbackable(ctx, cfg)
	if err != nil {
		return Row{}, err
	}
	eng := engine{client: cfg.Client}
	cur, err := eng.resolve(ctx, row.Alias)
	if err != nil {
		return Row{}, err
	}
	closeRow := func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE outbox_rebuilds SET state = $3, released_at = now() WHERE id = $1 AND state = $2`,
			row.ID, StateSwapped, StateRolledBack)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("close rebuild #%d: %v (rows changed: %d)", row.ID, err, tag.RowsAffected())
		}
		row.State = StateRolledBack
		return audit(ctx, tx, cfg.By, cfg.Why, 0, auditEntry{Step: "rollback", Row: row,
			Note: fmt.Sprintf("moved alias %s back from %s to %s", row.Alias, row.Target, row.OldIndex)})
	}
	switch {
	case !cur.Concrete && slices.Equal(cur.Indexes, []string{row.OldIndex}):
		// A rollback stopped after the alias moved: only the close is left.
		return row, pgx.BeginFunc(ctx, cfg.Pool, closeRow)
	case cur.Concrete || !slices.Equal(cur.Indexes, []string{row.Target}):
		return Row{}, refusedf("%s points at %s, not at %s of rebuild #%d: it moved since the swap", row.Alias,
			orNothing(cur.Indexes), row.Target, row.ID)
	}
	since, err := dbNow(ctx, cfg.Pool)
	if err != nil {
		return Row{}, err
	}
	err = underConfirmation(ctx, cfg, &row, since, func(tx pgx.Tx) error {
		if err := eng.refresh(ctx, row.OldIndex); err != nil {
			return err
		}
		if err := eng.rollback(ctx, &row); err != nil {
			return err
		}
		return closeRow(tx)
	})
	var interrupted *InterruptedError
	if errors.As(err, &interrupted) {
		return Row{}, refusedf("%v; the old index %s may miss events written since, so a rollback would serve stale "+
			"documents: rebuild again instead (the old index is kept until --cleanup)", err, row.OldIndex)
	}
	return row, err
}

// newestRollbackable is the projection's newest rebuild, which a rollback
// takes, or why it cannot.
func newestRollbackable(ctx context.Context, cfg Config) (Row, error) {
	rows, err := List(ctx, cfg.Pool, cfg.Projection)
	if err != nil {
		return Row{}, err
	}
	if len(rows) == 0 {
		return Row{}, refusedf("no rebuild of projection %q to roll back", cfg.Projection)
	}
	return rows[0], rollbackable(rows[0])
}

// rollbackable refuses a rollback of row, the newest rebuild, when it has
// no old index the leader keeps writing.
func rollbackable(row Row) error {
	switch {
	case row.State != StateSwapped:
		return refusedf("the newest rebuild of projection %q, #%d, is %s: only a swapped rebuild, the newest, can be rolled back",
			row.Projection, row.ID, row.State)
	case row.OldIsConcrete:
		return refusedf("rebuild #%d replaced the concrete index %s, which the swap deleted: there is nothing to roll back to; "+
			"rebuild again instead", row.ID, row.OldIndex)
	case row.OldIndex == "":
		return refusedf("%s did not exist before rebuild #%d: there is nothing to roll back to", row.Alias, row.ID)
	case row.ReleasedAt != nil:
		return refusedf("--cleanup released the old index %s of rebuild #%d at %s (the leader stopped writing it): "+
			"a rollback would serve stale documents; rebuild again instead", row.OldIndex, row.ID, row.ReleasedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

func orNothing(indexes []string) string {
	if len(indexes) == 0 {
		return "nothing"
	}
	return fmt.Sprint(indexes)
}

// Cleaned is what Cleanup did to one rebuild.
type Cleaned struct {
	Rebuild Row    `json:"rebuild"`
	Deleted string `json:"deleted_index,omitempty"`
	// Released is the old index of a swapped rebuild that the leader
	// stops writing now; a later Cleanup deletes it.
	Released string `json:"released_index,omitempty"`
	Note     string `json:"note,omitempty"`
}

// Cleanup deletes the indexes that swapped rebuilds replaced and that
// aborted or rolled-back rebuilds built, and closes those rebuilds. It
// never deletes an index the alias points at, nor one the leader may still
// be writing: the old index of a swapped rebuild, kept written for a
// rollback, is first released (the leader stops writing it) and deleted
// by a Cleanup AbortGrace later, as is an aborted or rolled-back
// rebuild's index. Nothing to clean is a *RefusedError.
func Cleanup(ctx context.Context, cfg Config) ([]Cleaned, error) {
	cfg, l, err := begin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer l.release()
	rows, err := List(ctx, cfg.Pool, cfg.Projection)
	if err != nil {
		return nil, err
	}
	eng := engine{client: cfg.Client}
	cur, err := eng.resolve(ctx, cfg.Alias)
	if err != nil {
		return nil, err
	}
	now, err := dbNow(ctx, cfg.Pool)
	if err != nil {
		return nil, err
	}
	var done []Cleaned
	var kept []string
	for _, row := range rows {
		c, note, err := cleanOne(ctx, cfg, eng, cur, row, now)
		if err != nil {
			return done, err
		}
		if note != "" {
			kept = append(kept, note)
		}
		if c != nil {
			done = append(done, *c)
		}
	}
	if len(done) == 0 {
		return nil, refusedf("nothing to clean for projection %q%s", cfg.Projection, keptText(kept))
	}
	return done, nil
}

func keptText(kept []string) string {
	if len(kept) == 0 {
		return ": no swapped, aborted or rolled-back rebuild keeps an index"
	}
	return ": " + fmt.Sprint(kept)
}

// cleanOne deletes what row keeps, if anything, and closes it; or releases
// it; or says why it keeps it for now. now is the database's clock, which
// wrote the rows' times.
func cleanOne(ctx context.Context, cfg Config, eng engine, cur named, row Row, now time.Time) (*Cleaned, string, error) {
	var index string
	released := row.ReleasedAt
	switch row.State {
	case StateSwapped:
		if row.OldIsConcrete || row.OldIndex == "" {
			break
		}
		if released == nil {
			return release(ctx, cfg, row)
		}
		index = row.OldIndex
	case StateAborted, StateRolledBack:
		if released == nil {
			released = row.FinishedAt // aborted before the leader's release was recorded
		}
		index = row.Target
	default:
		return nil, "", nil
	}
	if index != "" && released != nil {
		if until := released.Add(cfg.AbortGrace); now.Before(until) {
			return nil, fmt.Sprintf("index %s of %s rebuild #%d is kept until %s, for writes in flight",
				index, row.State, row.ID, until.UTC().Format(time.RFC3339)), nil
		}
	}
	if index != "" && live(cur, index) {
		return nil, fmt.Sprintf("%s of rebuild #%d is what %s points at", index, row.ID, cfg.Alias), nil
	}
	if index != "" {
		if err := eng.delete(ctx, index); err != nil {
			return nil, "", err
		}
	}
	entry := auditEntry{Step: "cleanup", Row: row}
	if index != "" {
		entry.Deleted = []string{index}
	}
	err := transition(ctx, cfg.Pool, row.ID, row.State, StateCleaned, `, cleaned_at = now()`, cfg.By, cfg.Why, 0, entry)
	if err != nil {
		return nil, "", err
	}
	row.State = StateCleaned
	return &Cleaned{Rebuild: row, Deleted: index}, "", nil
}

// release tells the leader to stop writing the old index of swapped rebuild
// row, which ends its rollback; Cleanup deletes the index AbortGrace later.
func release(ctx context.Context, cfg Config, row Row) (*Cleaned, string, error) {
	var at time.Time
	err := pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE outbox_rebuilds SET released_at = now() WHERE id = $1 AND state = $2 AND released_at IS NULL
			RETURNING released_at`, row.ID, StateSwapped).Scan(&at)
		if err != nil {
			return fmt.Errorf("release the old index of rebuild #%d: %w", row.ID, err)
		}
		row.ReleasedAt = &at
		return audit(ctx, tx, cfg.By, cfg.Why, 0, auditEntry{Step: "release", Row: row})
	})
	if err != nil {
		return nil, "", err
	}
	return &Cleaned{Rebuild: row, Released: row.OldIndex, Note: fmt.Sprintf("the leader stops writing %s (no rollback "+
		"to it any more); run --cleanup again after %s to delete it", row.OldIndex,
		at.Add(cfg.AbortGrace).UTC().Format(time.RFC3339))}, "", nil
}
