package rebuild

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/olivere/elastic/v7"

	"github.com/wlproj/wlproj/internal/serviceutil"
	"github.com/wlproj/wlproj/projection"
)

// confirmPoll is how often Run looks for the leader's confirmation.
const confirmPoll = 50 * time.Millisecond

// refusedKept bounds the refused rows a report lists; all are counted.
const refusedKept = 100

// Report is what a rebuild did.
type Report struct {
	Rebuild Row `json:"rebuild"`
	// Resumed is set when an open rebuild was taken up again.
	Resumed bool `json:"resumed"`
	// Converted is set when ELASTIC_INDEX was a concrete index, replaced
	// by an alias of the same name in the swap.
	Converted bool `json:"converted"`
	// Created is set when ELASTIC_INDEX did not exist before.
	Created bool `json:"created"`
	// Rows is the source rows read, counting those a resumed rebuild read
	// before. The table is read in pages while the application writes, so
	// it may differ from a count of the table at any one moment.
	Rows            int64            `json:"rows"`
	Loaded          int64            `json:"loaded"`
	Superseded      int64            `json:"superseded"`
	Refused         int64            `json:"refused"`
	RefusedByReason map[string]int64 `json:"refused_by_reason,omitempty"`
	// RefusedRows are the first refused rows, with their reasons.
	RefusedRows []Refused `json:"refused_rows,omitempty"`
	// Behind counts the source rows older than a live version the ledger
	// applied (see Behind), Copied those of them whose newer version the
	// old index held and the new one was sent (counted loaded too), and
	// BehindRows are the first of them: the source table broke its
	// contract for each.
	Behind     int64    `json:"behind"`
	Copied     int64    `json:"copied"`
	BehindRows []Behind `json:"behind_rows,omitempty"`
	// Lost counts the documents the old index had and the new one lacked
	// at the swap because their rows were refused, LostIDs the first of
	// them: a swap with them is refused unless Config.AllowRefused.
	Lost    int64    `json:"lost"`
	LostIDs []string `json:"lost_ids,omitempty"`
	// DocsBefore is what the alias counted just before the swap, DocsAfter
	// what the new index counts after it.
	DocsBefore int64   `json:"docs_before"`
	DocsAfter  int64   `json:"docs_after"`
	Seconds    float64 `json:"seconds"`

	// refusedDocs are the ids of this run's refused rows, at most
	// refusedDocsMax, for the check before the swap.
	refusedDocs map[string]bool
}

func (r *Report) refuse(rows []Refused, each func(Refused)) {
	for _, x := range rows {
		if r.RefusedByReason == nil {
			r.RefusedByReason, r.refusedDocs = map[string]int64{}, map[string]bool{}
		}
		if len(r.refusedDocs) < refusedDocsMax {
			r.refusedDocs[projection.DocumentID(x.EntityType, x.EntityID)] = true
		}
		r.RefusedByReason[x.Reason]++
		if len(r.RefusedRows) < refusedKept {
			r.RefusedRows = append(r.RefusedRows, x)
		}
		if each != nil {
			each(x)
		}
	}
}

// behind counts rows the source table is behind the ledger on.
func (r *Report) behind(rows []Behind) {
	for _, b := range rows {
		r.Behind++
		if b.CopiedVersion != 0 {
			r.Copied++
		}
		if len(r.BehindRows) < refusedKept {
			r.BehindRows = append(r.BehindRows, b)
		}
	}
}

// StoppedError is a rebuild that opened and then stopped before its swap
// (interrupted, the engine failing, no leader confirming): the alias is
// untouched, the rebuild stays open and dual-writes go on, so a re-run of
// the same command resumes it.
type StoppedError struct {
	Row Row
	Err error
}

func (e *StoppedError) Error() string {
	old := e.Row.OldIndex
	if old == "" {
		old = "nothing (it did not exist)"
	}
	return fmt.Sprintf("rebuild #%d stopped: %v; %s still points at %s. The rebuild stays open (the leader keeps writing "+
		"to %s too): run the same command again to resume, or --abort it", e.Row.ID, e.Err, e.Row.Alias, old, e.Row.Target)
}

func (e *StoppedError) Unwrap() error { return e.Err }

// runner is one Run.
type runner struct {
	cfg   Config
	eng   engine
	table string
	rep   *Report
}

// Run rebuilds the projection's index from the source table and swaps the
// alias to it, or resumes the open rebuild. Bad input is refused before
// anything changes (*InputError, *RefusedError, *BusyError,
// *bounds.FieldError); once the rebuild is open, a failure is a
// *StoppedError.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	start := time.Now()
	cfg, l, err := begin(ctx, cfg)
	if err != nil {
		return rep, err
	}
	defer l.release()
	r := &runner{cfg: cfg, eng: engine{client: cfg.Client}, rep: &rep}
	if r.table, err = checkSource(ctx, cfg.Pool, cfg.SourceTable); err != nil {
		return rep, err
	}
	row, err := r.openOrResume(ctx)
	if err != nil {
		return rep, err
	}
	defer func() { rep.Rebuild, rep.Seconds = *row, time.Since(start).Seconds() }()
	for reload := 0; ; reload++ {
		if err := r.waitDualWrite(ctx, row); err != nil {
			return rep, &StoppedError{Row: *row, Err: err}
		}
		if err := r.anchor(ctx, row); err != nil {
			return rep, &StoppedError{Row: *row, Err: err}
		}
		if err := r.fill(ctx, row); err != nil {
			return rep, &StoppedError{Row: *row, Err: err}
		}
		err := r.finish(ctx, row)
		var interrupted *InterruptedError
		if errors.As(err, &interrupted) && reload < maxReloads {
			r.cfg.Progress.Note(err.Error() + ": loading again from the start")
			continue
		}
		if err != nil {
			return rep, &StoppedError{Row: *row, Err: err}
		}
		return rep, nil
	}
}

// maxReloads bounds the loads a Run starts again after an interruption of
// the dual-writes before it stops, resumable.
const maxReloads = 2

// fill loads the source table into the new index, or enqueues it.
func (r *runner) fill(ctx context.Context, row *Row) error {
	if r.cfg.EmitOutbox {
		e := &emitter{cfg: r.cfg, pool: r.cfg.Pool, row: row, rep: r.rep, copier: r.copier(row)}
		if err := e.emit(ctx, r.table); err != nil {
			return err
		}
		return e.drain(ctx)
	}
	search, err := projection.NewSearch(projection.SearchConfig{Client: r.cfg.Client, Index: row.Target,
		MaxPayloadBytes: r.cfg.MaxPayloadBytes})
	if err != nil {
		return err
	}
	l := &loader{cfg: r.cfg, pool: r.cfg.Pool, search: search, copier: r.copier(row), row: row, rep: r.rep}
	return l.load(ctx, r.table)
}

// copier copies, from the index the alias named when row opened, the
// documents the source table is behind on.
func (r *runner) copier(row *Row) copier {
	return copier{eng: r.eng, old: row.OldIndex, projection: r.cfg.Projection}
}

func (r *runner) mode() string {
	if r.cfg.EmitOutbox {
		return ModeEmit
	}
	return ModeBulk
}

func (r *runner) openOrResume(ctx context.Context) (*Row, error) {
	open, err := Open(ctx, r.cfg.Pool, r.cfg.Projection)
	if err != nil {
		return nil, err
	}
	if open != nil {
		return open, r.resume(ctx, open)
	}
	return r.start(ctx)
}

// start creates the new index and opens the rebuild. The index exists
// before the row does: a leader that sees the row writes to the index at
// once, and the engine would create a missing one with a guessed mapping.
func (r *runner) start(ctx context.Context) (*Row, error) {
	cur, err := r.current(ctx)
	if err != nil {
		return nil, err
	}
	body, err := r.body(ctx, cur)
	if err != nil {
		return nil, err
	}
	now := r.cfg.Now().UTC()
	target := fmt.Sprintf("%s-%s-%03d", r.cfg.Alias, now.Format("20060102-150405"), now.Nanosecond()/1e6)
	if err := r.eng.create(ctx, target, withoutRefresh(body)); err != nil {
		if elastic.IsStatusCode(err, http.StatusBadRequest) {
			return nil, inputf("the engine refused the new index's mapping (%s): %s", r.mappingSource(cur), refusal(err))
		}
		return nil, fmt.Errorf("create index %s: %w", target, err)
	}
	row := Row{Projection: r.cfg.Projection, Alias: r.cfg.Alias, Target: target, OldIsConcrete: cur.Concrete,
		SourceTable: r.table, Mode: r.mode(), MappingSHA256: r.cfg.mappingSHA256(), StartedBy: r.cfg.By}
	if len(cur.Indexes) == 1 {
		row.OldIndex = cur.Indexes[0]
	}
	out, err := insertOpen(ctx, r.cfg.Pool, row, r.cfg.Why)
	if err != nil {
		_ = r.eng.delete(context.WithoutCancel(ctx), target)
		return nil, err
	}
	r.rep.Converted, r.rep.Created = cur.Concrete, len(cur.Indexes) == 0
	r.cfg.Progress.Note(fmt.Sprintf("opened rebuild #%d: new index %s with the mapping of %s", out.ID, target, r.mappingSource(cur)))
	return &out, nil
}

// current resolves ELASTIC_INDEX, refusing what a new rebuild cannot
// start from: an alias of several indexes, or no index for --emit-outbox.
func (r *runner) current(ctx context.Context) (named, error) {
	cur, err := r.eng.resolve(ctx, r.cfg.Alias)
	if err != nil {
		return cur, err
	}
	if len(cur.Indexes) > 1 {
		return cur, inputf("ELASTIC_INDEX %s is an alias of %d indexes (%s); a rebuild needs it on one",
			r.cfg.Alias, len(cur.Indexes), strings.Join(cur.Indexes, ", "))
	}
	if r.cfg.EmitOutbox && len(cur.Indexes) == 0 {
		return cur, inputf("--emit-outbox needs ELASTIC_INDEX %s to exist (the leader writes the events to it too): "+
			"rebuild without --emit-outbox first", r.cfg.Alias)
	}
	return cur, nil
}

func (r *runner) mappingSource(cur named) string {
	if r.cfg.Mapping != nil {
		return r.cfg.MappingFile
	}
	if len(cur.Indexes) == 1 {
		return cur.Indexes[0]
	}
	return "(none)"
}

// body is the new index's create-index body: the mapping file's, or a copy
// of the current index's mapping and settings.
func (r *runner) body(ctx context.Context, cur named) (map[string]any, error) {
	body, err := r.cfg.mappingBody()
	if err != nil || body != nil {
		return body, err
	}
	if len(cur.Indexes) == 0 {
		return nil, inputf("ELASTIC_INDEX %s does not exist, so there is no mapping to copy: give --mapping FILE", r.cfg.Alias)
	}
	return r.eng.indexBody(ctx, cur.Indexes[0])
}

// matches refuses to resume an open rebuild that this command did not
// open: another alias, source, mode or mapping, or its index gone.
func (r *runner) matches(ctx context.Context, row *Row) error {
	again := "run the command that opened it, or --abort it"
	switch {
	case row.Alias != r.cfg.Alias:
		return refusedf("rebuild #%d is open for ELASTIC_INDEX %s, not %s; %s", row.ID, row.Alias, r.cfg.Alias, again)
	case row.SourceTable != r.table:
		return refusedf("rebuild #%d is open from %s, not %s; %s", row.ID, row.SourceTable, r.table, again)
	case row.Mode != r.mode():
		return refusedf("rebuild #%d is open in mode %s, not %s; %s", row.ID, row.Mode, r.mode(), again)
	case r.cfg.Mapping != nil && row.MappingSHA256 != r.cfg.mappingSHA256():
		return refusedf("rebuild #%d was opened with another mapping; %s", row.ID, again)
	}
	exists, err := r.eng.exists(ctx, row.Target)
	if err != nil {
		return err
	}
	if !exists {
		return refusedf("index %s of open rebuild #%d is gone; --abort the rebuild and start again", row.Target, row.ID)
	}
	return nil
}

// resume takes up the open rebuild, if this command is the same rebuild.
func (r *runner) resume(ctx context.Context, row *Row) error {
	if err := r.matches(ctx, row); err != nil {
		return err
	}
	if err := transition(ctx, r.cfg.Pool, row.ID, StateOpen, StateOpen, "", r.cfg.By, r.cfg.Why, row.RowsLoaded,
		auditEntry{Step: "resume", Row: *row}); err != nil {
		return err
	}
	r.rep.Resumed, r.rep.Converted = true, row.OldIsConcrete
	r.cfg.Progress.Note(fmt.Sprintf("resuming rebuild #%d into %s after %d rows", row.ID, row.Target,
		row.RowsLoaded+row.RowsRefused+row.RowsSuperseded))
	return nil
}

// waitDualWrite waits until the current leader has confirmed that it writes
// to the new index too, and until 2×CacheTTL after the rebuild opened, so
// that no replica acts on a view of the rebuilds older than the row: only
// then is every event committed after a page was read sure to reach the new
// index.
func (r *runner) waitDualWrite(ctx context.Context, row *Row) error {
	r.cfg.Progress.Note(fmt.Sprintf("waiting for the leader to write to %s too", row.Target))
	deadline := time.Now().Add(r.cfg.ConfirmTimeout)
	for {
		c, err := readConfirmation(ctx, r.cfg.Pool, row.ID, time.Time{})
		if err != nil {
			return fmt.Errorf("wait for the leader: %w", err)
		}
		problem := c.problem(row)
		if problem == "" && c.aged {
			return nil
		}
		if time.Now().After(deadline) {
			if problem == "" {
				problem = "the replicas' views of the rebuilds did not age"
			}
			return fmt.Errorf("%s within %s: a `wlproj run` replica of this version must lead, with ELASTIC_INDEX=%s "+
				"(replicas with another index ignore this rebuild)", problem, r.cfg.ConfirmTimeout, row.Alias)
		}
		if err := serviceutil.Sleep(ctx, confirmPoll); err != nil {
			return err
		}
	}
}

// anchorSQL records the run of confirmations the load relies on, before
// its first page. A load begun under another run (one that broke
// since: some leader term did not confirm, and its events may have missed
// the new index) starts again from the beginning.
const anchorSQL = `
UPDATE outbox_rebuilds
   SET load_since = dual_write_since, loaded_type = NULL, loaded_id = NULL,
       rows_loaded = 0, rows_refused = 0, rows_superseded = 0, emit_first_id = NULL, emit_last_id = NULL
 WHERE id = $1 AND state = 'open' AND load_since IS DISTINCT FROM dual_write_since
RETURNING load_since`

// anchor ties the load to the present run of confirmations; see anchorSQL.
func (r *runner) anchor(ctx context.Context, row *Row) error {
	var since *time.Time
	err := r.cfg.Pool.QueryRow(ctx, anchorSQL, row.ID).Scan(&since)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("record the load's start: %w", err)
	}
	if row.LoadedType != nil || row.RowsLoaded+row.RowsRefused+row.RowsSuperseded > 0 || row.EmitFirstID != nil {
		r.cfg.Progress.Note(fmt.Sprintf("dual-writes to %s were interrupted since the load began (a leader term did not "+
			"confirm them): loading all rows again", row.Target))
	}
	r.rep.RefusedByReason, r.rep.RefusedRows, r.rep.refusedDocs = nil, nil, nil
	r.rep.Behind, r.rep.Copied, r.rep.BehindRows = 0, 0, nil
	row.LoadSince, row.LoadedType, row.LoadedID = since, nil, nil
	row.RowsLoaded, row.RowsRefused, row.RowsSuperseded, row.EmitFirstID, row.EmitLastID = 0, 0, 0, nil, nil
	return nil
}

// live reports whether index is one the alias points at now.
func live(cur named, index string) bool { return slices.Contains(cur.Indexes, index) }
