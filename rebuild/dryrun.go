package rebuild

import (
	"context"
	"fmt"
)

// Plan is what a rebuild would do, found without changing anything.
type Plan struct {
	Steps []string `json:"steps"`
	// Rows is the source table's row count now.
	Rows int64 `json:"rows"`
	// Resume is the open rebuild a run would take up, nil if it would open one.
	Resume *Row `json:"resume,omitempty"`
}

// DryRun checks what Run checks before it changes anything (the lock, the
// source table and its columns, the mapping file, the alias, an open
// rebuild) and says what Run would do. The engine checks a mapping only
// when the index is created; Run stops there, changing nothing, if it refuses.
func DryRun(ctx context.Context, cfg Config) (Plan, error) {
	cfg, l, err := begin(ctx, cfg)
	if err != nil {
		return Plan{}, err
	}
	defer l.release()
	r := &runner{cfg: cfg, eng: engine{client: cfg.Client}, rep: &Report{}}
	if r.table, err = checkSource(ctx, cfg.Pool, cfg.SourceTable); err != nil {
		return Plan{}, err
	}
	var p Plan
	if p.Rows, err = countSource(ctx, cfg.Pool, r.table, nil); err != nil {
		return p, err
	}
	p.Steps = append(p.Steps, fmt.Sprintf("source %s: %d rows", r.table, p.Rows))
	if p.Resume, err = Open(ctx, cfg.Pool, cfg.Projection); err != nil {
		return p, err
	}
	if p.Resume != nil {
		if err := r.matches(ctx, p.Resume); err != nil {
			return p, err
		}
		return p, r.planResume(&p)
	}
	return p, r.planStart(ctx, &p)
}

func (r *runner) planResume(p *Plan) error {
	row := p.Resume
	p.Steps = append(p.Steps, fmt.Sprintf("would resume open rebuild #%d into %s after the %d rows it has",
		row.ID, row.Target, row.RowsLoaded+row.RowsRefused+row.RowsSuperseded), r.planFill(), planSwap(row.Alias, row.OldIndex, row.OldIsConcrete))
	return nil
}

func (r *runner) planStart(ctx context.Context, p *Plan) error {
	cur, err := r.current(ctx)
	if err != nil {
		return err
	}
	if _, err := r.body(ctx, cur); err != nil {
		return err
	}
	old := ""
	if len(cur.Indexes) == 1 {
		old = cur.Indexes[0]
	}
	p.Steps = append(p.Steps, fmt.Sprintf("would create index %s-<UTC time> with the mapping of %s", r.cfg.Alias, r.mappingSource(cur)),
		r.planFill(), planSwap(r.cfg.Alias, old, cur.Concrete))
	return nil
}

func (r *runner) planFill() string {
	wait := fmt.Sprintf("would wait (up to %s) for the leader to write live events to it too, then ", r.cfg.ConfirmTimeout)
	if r.cfg.EmitOutbox {
		return wait + fmt.Sprintf("enqueue an upsert event per row, at most %d a second and %d pending, and wait for them",
			r.cfg.EmitRate, r.cfg.EmitBacklog)
	}
	return wait + fmt.Sprintf("load the rows in bulks of %d, %d in flight", r.cfg.BulkSize, r.cfg.Concurrency)
}

func planSwap(alias, old string, concrete bool) string {
	switch {
	case concrete:
		return fmt.Sprintf("would replace the concrete index %s by an alias %s on the new index, deleting the concrete index "+
			"in the same _aliases call", alias, alias)
	case old == "":
		return fmt.Sprintf("would create alias %s on the new index", alias)
	}
	return fmt.Sprintf("would swap alias %s from %s to the new index; %s kept, and written, for a rollback until --cleanup",
		alias, old, old)
}
