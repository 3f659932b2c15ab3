package rebuild

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

const swappedSet = `, finished_at = now(), rows_loaded = $4, rows_refused = $5, rows_superseded = $6`

// finish makes the new index serve: its refresh interval as the old one's,
// refreshed, then the alias swapped to it, and the rebuild closed. A re-run
// after a crash between the swap and the close only closes.
func (r *runner) finish(ctx context.Context, row *Row) error {
	cur, err := r.eng.resolve(ctx, row.Alias)
	if err != nil {
		return err
	}
	if cur.Concrete || !slices.Equal(cur.Indexes, []string{row.Target}) {
		if err := r.swap(ctx, row); err != nil {
			return err
		}
	}
	if r.rep.DocsAfter, err = r.eng.count(ctx, row.Target); err != nil {
		return err
	}
	r.rep.Loaded, r.rep.Superseded, r.rep.Refused = row.RowsLoaded-r.emittedRefused(row), row.RowsSuperseded, row.RowsRefused
	return pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE outbox_rebuilds SET state = $3`+swappedSet+` WHERE id = $1 AND state = $2`,
			row.ID, StateOpen, StateSwapped, row.RowsLoaded, row.RowsRefused, row.RowsSuperseded)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("close rebuild #%d: %v (rows changed: %d)", row.ID, err, tag.RowsAffected())
		}
		row.State = StateSwapped
		return audit(ctx, tx, r.cfg.By, r.cfg.Why, row.RowsLoaded, auditEntry{Step: "swap", Row: *row,
			Refused: r.rep.RefusedByReason, Note: r.swapNote(row)})
	})
}

func (r *runner) emittedRefused(row *Row) int64 {
	if row.Mode == ModeEmit {
		return row.RowsRefused
	}
	return 0
}

// swap moves the alias. The old index stops refreshing first, so that what
// readers see of it stops growing; the new index, refreshed after that,
// then shows at least as much (every write reaches it before the alias),
// and no reader sees fewer documents after the swap than before.
func (r *runner) swap(ctx context.Context, row *Row) error {
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
		err = r.eng.swap(ctx, row)
	}
	if restore != nil && (err != nil || !row.OldIsConcrete) {
		restore()
	}
	if err != nil {
		return err
	}
	r.cfg.Progress.Note(r.swapNote(row))
	return nil
}

func (r *runner) swapNote(row *Row) string {
	switch {
	case row.OldIsConcrete:
		return fmt.Sprintf("%s was a concrete index: replaced it, in the same _aliases call, by an alias of that name on %s "+
			"(the concrete index was deleted; its documents are all in %s)", row.Alias, row.Target, row.Target)
	case row.OldIndex == "":
		return fmt.Sprintf("created alias %s on %s", row.Alias, row.Target)
	}
	return fmt.Sprintf("swapped alias %s from %s to %s; %s is kept until wlproj rebuild --cleanup",
		row.Alias, row.OldIndex, row.Target, row.OldIndex)
}

// finalRefresh is the refresh interval the new index serves with: the
// mapping file's, or the old index's (unless a crash left it frozen).
func (r *runner) finalRefresh(ctx context.Context, row *Row) (any, error) {
	body, err := r.cfg.mappingBody()
	if err != nil || body != nil || row.OldIndex == "" {
		return refreshInterval(body), err
	}
	prev, err := r.eng.refreshInterval(ctx, row.OldIndex)
	return unfrozen(prev), err
}

// unfrozen is v, or the default for the -1 a crashed swap may have left.
func unfrozen(v any) any {
	if v == "-1" {
		return nil
	}
	return v
}

// Abort closes the open rebuild without a swap: the alias stays, the leader
// stops writing to the new index, and Cleanup deletes that index after
// AbortGrace.
func Abort(ctx context.Context, cfg Config) (Row, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Row{}, err
	}
	l, err := acquire(ctx, cfg.Pool, cfg.Projection)
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
	if err := transition(ctx, cfg.Pool, row.ID, StateOpen, StateAborted, `, finished_at = now()`, cfg.By, cfg.Why,
		row.RowsLoaded, auditEntry{Step: "abort", Row: *row}); err != nil {
		return Row{}, err
	}
	return *row, nil
}

// Cleaned is what Cleanup did to one rebuild.
type Cleaned struct {
	Rebuild Row    `json:"rebuild"`
	Deleted string `json:"deleted_index,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Cleanup deletes the indexes that swapped rebuilds replaced and that
// aborted rebuilds built, and closes those rebuilds. It never deletes an
// index the alias points at. Nothing to clean is a *RefusedError.
func Cleanup(ctx context.Context, cfg Config) ([]Cleaned, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l, err := acquire(ctx, cfg.Pool, cfg.Projection)
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
	var done []Cleaned
	var kept []string
	for _, row := range rows {
		c, note, err := cleanOne(ctx, cfg, eng, cur, row)
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
		return ": no swapped or aborted rebuild keeps an index"
	}
	return ": " + fmt.Sprint(kept)
}

// cleanOne deletes what row keeps, if anything, and closes it; or says why
// it keeps it for now.
func cleanOne(ctx context.Context, cfg Config, eng engine, cur named, row Row) (*Cleaned, string, error) {
	var index string
	switch row.State {
	case StateSwapped:
		if !row.OldIsConcrete {
			index = row.OldIndex
		}
	case StateAborted:
		if until := row.FinishedAt.Add(cfg.AbortGrace); time.Now().Before(until) {
			return nil, fmt.Sprintf("index %s of aborted rebuild #%d is kept until %s, for dual-writes in flight",
				row.Target, row.ID, until.UTC().Format(time.RFC3339)), nil
		}
		index = row.Target
	default:
		return nil, "", nil
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
