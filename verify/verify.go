package verify

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/olivere/elastic/v7"
	"golang.org/x/time/rate"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

// Kind is how a document differs from the truth.
type Kind string

// The kinds of drift; see the package doc.
const (
	Missing     Kind = "missing"
	Stale       Kind = "stale"
	Extra       Kind = "extra"
	Resurrected Kind = "resurrected"
	// Ahead is a document the index holds at a newer version than the
	// source table: the database was restored from a backup older than
	// the index, or the application wrote an event without its row.
	Ahead Kind = "ahead"
)

// How a run compared; see Report.Compared.
const (
	ComparedFingerprints = "fingerprints"
	ComparedDocuments    = "documents"
)

// Kinds lists every kind, in the order reports show them.
var Kinds = []Kind{Missing, Stale, Extra, Resurrected, Ahead}

// Defaults of Config; the CLI's flags take theirs from here.
const (
	SampleDefault = 10
	PageDefault   = 5000
	// recheckBatch is how many suspects are checked again at once.
	recheckBatch = 500
	// scrollKeepAlive is how long the engine keeps the scroll between two
	// pages; a rate-capped run waits between pages.
	scrollKeepAlive = "10m"
)

// SampleRange, PageRange and RateRange are what Config accepts.
var (
	SampleRange = bounds.Range[int]{Min: 1, Max: 1000}
	PageRange   = bounds.Range[int]{Min: 10, Max: 10000}
	RateRange   = bounds.Range[int]{Min: 0, Max: 10_000_000}
)

// Config is one verify run.
type Config struct {
	// Pool reads the source table, the ledger and the outbox. Required.
	Pool *pgxpool.Pool
	// Client talks to the engine (projection.NewElasticClient). Required.
	Client *elastic.Client
	// Index is the index or alias verified (ELASTIC_INDEX). Required.
	Index string
	// Projection is whose ledger entries count. Only search has an index.
	// Defaults to search.
	Projection string
	// SourceTable is the source-of-truth table (entity_type, entity_id,
	// doc, version, keyed on the first two); empty compares the index with
	// the ledger alone.
	SourceTable string
	// Sample is the most document ids a report keeps per kind. Defaults
	// to 10.
	Sample int
	// Page is the documents per scroll page, per database page and per ids
	// query. Defaults to 5000.
	Page int
	// Rate caps the documents checked per second, so a scheduled run does
	// not starve the live drain: the index's pages and the database's
	// walk each keep to it, and so does the source table's read beside
	// the index's in step 0. 0 is no cap. Defaults to 0.
	Rate int
	// Documents skips step 0 and compares document by document at once.
	// Beside a live drain the two sides never match as wholes, so the
	// scheduled verify does.
	Documents bool
	// Docs makes the drift handed to OnDrift carry the source row's doc,
	// which a repair sends.
	Docs bool
	// OnDrift, if set, receives the confirmed drift batch by batch, as it
	// is found; an error stops the run.
	OnDrift func(ctx context.Context, drift []Drift) error
}

func (c Config) withDefaults() Config {
	c.Projection = cmp.Or(c.Projection, projection.SearchName)
	c.Sample = cmp.Or(c.Sample, SampleDefault)
	c.Page = cmp.Or(c.Page, PageDefault)
	return c
}

// Validate returns a *bounds.FieldError for the first bad field, or an
// *rebuild.InputError for a projection without an index.
func (c Config) Validate() error {
	switch {
	case c.Pool == nil || c.Client == nil:
		return errors.New("verify: Pool and Client are required")
	case c.Index == "":
		return bounds.Invalid("Index", "is required")
	case c.Projection == projection.ChronicleName:
		// Which projections are search ones is the caller's to say (the
		// projections file); the built-in chronicle never is.
		return &rebuild.InputError{Problem: fmt.Sprintf("projection %q has no search index to verify (it is the chronicle, a table of events)",
			c.Projection)}
	}
	return bounds.First(
		bounds.Check("Sample", c.Sample, SampleRange),
		bounds.Check("Page", c.Page, PageRange),
		bounds.Check("Rate", c.Rate, RateRange),
	)
}

// Report is what a run found.
type Report struct {
	Projection string `json:"projection"`
	Index      string `json:"index"`
	// SourceTable is the table compared with, as Postgres names it; empty
	// when the ledger alone was.
	SourceTable string `json:"source_table,omitempty"`
	// Checked counts the documents looked at: the index's, and those of the
	// database the index lacks.
	Checked int64 `json:"checked"`
	// Counts is the drifted documents by kind.
	Counts map[Kind]int64 `json:"counts"`
	// Samples is up to Config.Sample document ids per kind, sorted.
	Samples map[Kind][]string `json:"samples"`
	// InFlight counts the documents that differed while an event of theirs
	// was pending or processing, or was applied between the reads that
	// checked them again: the live drain, not drift.
	InFlight int64 `json:"in_flight"`
	// Compared says how: ComparedFingerprints when the index and the
	// source table proved equal as wholes (step 0 of the package doc),
	// else ComparedDocuments.
	Compared string        `json:"compared"`
	Started  time.Time     `json:"started_at"`
	Took     time.Duration `json:"-"`
}

// Drift is the total of the counts.
func (r Report) Drift() int64 {
	var n int64
	for _, k := range Kinds {
		n += r.Counts[k]
	}
	return n
}

func (r *Report) add(d Drift, sample int) {
	r.Counts[d.Kind]++
	if len(r.Samples[d.Kind]) < sample {
		r.Samples[d.Kind] = append(r.Samples[d.Kind], d.ID)
	}
}

// Drift is one drifted document, as the database and the index hold it
// when it was checked again.
type Drift struct {
	Kind Kind
	// ID is the document's _id, entity_type:entity_id.
	ID string
	// EntityType and EntityID are the document's key; both empty when ID
	// names no entity (no "type:id"), which no event can address.
	EntityType, EntityID string
	// IndexVersion is the document's version in the index, -1 if absent.
	IndexVersion int64
	// Source is the source table's row, nil when it has none or no table
	// was given.
	Source *SourceRow
	// Ledger is the ledger's entry, nil when it has none.
	Ledger *Entry
}

// SourceRow is a document's row in the source table; Version is -1 when
// the row's version is NULL. Doc is read only with Config.Docs.
type SourceRow struct {
	Version int64
	Doc     json.RawMessage
}

// Entry is a document's ledger entry.
type Entry struct {
	Version int64
	Deleted bool
}

// state is what is known of one document at one moment.
type state struct {
	index  int64 // -1: absent
	source *SourceRow
	ledger *Entry
}

// judge says how a document differs, if it does. With a table the table
// is the truth and the ledger only tells a deleted document (resurrected)
// from one nobody knows (extra). Without one, the ledger is the truth and
// nothing is extra or ahead: an engine-superseded event leaves the ledger
// behind the index, and the ledger is restored with the database anyway.
func judge(table bool, s state) (Kind, bool) {
	present := s.index >= 0
	live := s.ledger != nil && !s.ledger.Deleted
	if table {
		switch {
		case s.source != nil && !present:
			return Missing, true
		case s.source != nil && s.index < s.source.Version:
			return Stale, true
		case s.source != nil && s.source.Version >= 0 && s.index > s.source.Version:
			// The application writes the row with its event, so the check
			// again tells a row read before its event's ack (in flight)
			// from one that is older than the index for good.
			return Ahead, true
		case s.source != nil || !present:
			return "", false
		case s.ledger != nil && s.ledger.Deleted:
			return Resurrected, true
		}
		return Extra, true
	}
	switch {
	case s.ledger == nil:
		return "", false
	case s.ledger.Deleted && present:
		return Resurrected, true
	case live && !present:
		return Missing, true
	case live && s.index < s.ledger.Version:
		return Stale, true
	}
	return "", false
}

// Run verifies cfg.Index against the source table or the ledger.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	v, err := newRun(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	err = v.compare(ctx)
	for _, k := range Kinds {
		v.rep.Counts[k] += 0 // every kind, zero or not
		slices.Sort(v.rep.Samples[k])
		if v.rep.Samples[k] == nil {
			v.rep.Samples[k] = []string{}
		}
	}
	v.rep.Took = time.Since(v.rep.Started)
	return v.rep, err
}

// newRun checks the source table and sets up a run of a valid cfg.
func newRun(ctx context.Context, cfg Config) (*run, error) {
	v := &run{cfg: cfg, q: cfg.Pool, engine: engine{client: cfg.Client, index: cfg.Index},
		rep: Report{Projection: cfg.Projection, Index: cfg.Index, Counts: map[Kind]int64{}, Samples: map[Kind][]string{},
			Started: time.Now()}}
	if cfg.SourceTable != "" {
		quoted, err := rebuild.CheckSource(ctx, cfg.Pool, cfg.SourceTable)
		if err != nil {
			return nil, err
		}
		v.table, v.rep.SourceTable = quoted, quoted
	}
	if cfg.Rate > 0 {
		v.limit = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Page)
		v.limitSource = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Page)
	}
	return v, nil
}

// run is one verify in progress.
type run struct {
	cfg Config
	// q reads the database: the pool, or in a test a wrapper that lets the
	// leader ack between two statements.
	q      querier
	engine engine
	table  string // quoted; "" without a source table
	// limit paces the index's pages and the walk; limitSource the source
	// table's read of step 0, which runs beside the index's.
	limit, limitSource *rate.Limiter
	rep                Report
	// suspects wait to be checked again, at most recheckBatch of them.
	suspects []suspect
}

// database is what the run reads of the database.
func (v *run) database() database {
	return database{q: v.q, table: v.table, projection: v.cfg.Projection}
}

// suspect is a document that differed when first read.
type suspect struct {
	id     string
	key    key
	hasKey bool
}

// key is a document's (entity_type, entity_id).
type key struct{ Type, ID string }

// compare runs steps 0 to 3 of the package doc.
func (v *run) compare(ctx context.Context) error {
	if v.table != "" && !v.cfg.Documents {
		// Step 0: a clean index is proven by one read of each side.
		equal, n, err := v.equalByFingerprint(ctx)
		if err != nil || equal {
			v.rep.Checked, v.rep.Compared = n, ComparedFingerprints
			return err
		}
	}
	v.rep.Compared = ComparedDocuments
	// Each page is read by a statement of its own: a snapshot held for a
	// whole rate-capped run would keep vacuum from the outbox's dead rows,
	// and the claim from skipping them, for as long. What changes between
	// two pages shows up as a suspect, and the check again settles it.
	db := v.database()
	if err := v.scanIndex(ctx, db); err != nil {
		return err
	}
	if err := v.walkDatabase(ctx, db); err != nil {
		return err
	}
	return v.recheck(ctx)
}

// scanIndex is step 1: it judges every index document against the
// database.
func (v *run) scanIndex(ctx context.Context, db database) error {
	pages := make(chan []hit, 2)
	scrolled := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		for range pages { // until the scroll has returned
		}
	}()
	go func() {
		defer close(pages)
		scrolled <- v.engine.scroll(sctx, v.cfg.Page, func(h []hit) error {
			select {
			case pages <- h:
				return nil
			case <-sctx.Done():
				return sctx.Err()
			}
		})
	}()
	for page := range pages {
		if err := v.wait(ctx, len(page)); err != nil {
			return err
		}
		found, err := db.lookup(ctx, page)
		if err != nil {
			return err
		}
		for i, h := range page {
			f := found[i]
			v.rep.Checked++
			s := state{index: h.Version, source: f.source, ledger: f.ledger}
			if _, drifted := judge(v.table != "", s); drifted {
				if err := v.suspect(ctx, suspect{id: h.ID, key: f.key, hasKey: f.hasKey}); err != nil {
					return err
				}
			}
		}
	}
	return <-scrolled
}

// walkDatabase is step 2: the database's keys in key-ordered pages, each
// looked up in the index; what the index lacks is missing.
func (v *run) walkDatabase(ctx context.Context, db database) error {
	var after *key
	for {
		rows, err := db.keys(ctx, after, v.cfg.Page)
		if err != nil || len(rows) == 0 {
			return err
		}
		if err := v.wait(ctx, len(rows)); err != nil {
			return err
		}
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = documentID(r.key)
		}
		have, err := v.engine.search(ctx, ids)
		if err != nil {
			return err
		}
		for i, r := range rows {
			if _, ok := have[ids[i]]; ok {
				continue // judged in step 1
			}
			v.rep.Checked++
			if err := v.suspect(ctx, suspect{id: ids[i], key: r.key, hasKey: true}); err != nil {
				return err
			}
		}
		if len(rows) < v.cfg.Page {
			return nil
		}
		after = &rows[len(rows)-1].key
	}
}

// wait takes n documents from the rate cap.
func (v *run) wait(ctx context.Context, n int) error { return waitN(ctx, v.limit, n) }

func waitN(ctx context.Context, l *rate.Limiter, n int) error {
	if l == nil || n == 0 {
		return nil
	}
	return l.WaitN(ctx, n)
}

func (v *run) suspect(ctx context.Context, s suspect) error {
	v.suspects = append(v.suspects, s)
	if len(v.suspects) < recheckBatch {
		return nil
	}
	return v.recheck(ctx)
}

// recheck is step 3 for the suspects gathered so far: each is judged
// again on what the database and the index hold now.
func (v *run) recheck(ctx context.Context) error {
	if len(v.suspects) == 0 {
		return nil
	}
	batch := v.suspects
	v.suspects = v.suspects[:0:0]
	drift, err := v.settle(ctx, batch, v.engine.get)
	if err != nil || v.cfg.OnDrift == nil || len(drift) == 0 {
		return err
	}
	return v.cfg.OnDrift(ctx, drift)
}

// indexReader reads the versions the index holds now of some ids.
type indexReader func(ctx context.Context, ids []string) (map[string]int64, error)

// settle judges suspects on the index as it is now, read between two reads
// of the database. Two reads of two systems are never one moment: an event
// applied between them would make its document look stale, missing or
// extra, whichever is read first. So a document is drift only if the
// database held the same of it before and after the index was read, with
// no event of it pending or processing either time: then nothing was
// applied to it in between (an ack moves the ledger, and the application
// writes the source row with its event), and the index read shows what
// the drain left. The others are the drain's, counted in flight.
func (v *run) settle(ctx context.Context, batch []suspect, readIndex indexReader) ([]Drift, error) {
	ids := make([]string, len(batch))
	var keys []key
	for i, s := range batch {
		ids[i] = s.id
		if s.hasKey {
			keys = append(keys, s.key)
		}
	}
	db := v.database()
	before, err := db.current(ctx, keys, false)
	if err != nil {
		return nil, err
	}
	versions, err := readIndex(ctx, ids)
	if err != nil {
		return nil, err
	}
	after, err := db.current(ctx, keys, v.cfg.Docs)
	if err != nil {
		return nil, err
	}
	var drift []Drift
	for i, s := range batch {
		st := state{index: -1}
		if ver, ok := versions[ids[i]]; ok {
			st.index = ver
		}
		var was, now current
		if s.hasKey {
			was, now = before[s.key], after[s.key]
		}
		st.source, st.ledger = now.source, now.ledger
		kind, drifted := judge(v.table != "", st)
		switch {
		case !drifted:
			continue
		case was.inFlight || now.inFlight || !was.same(now):
			v.rep.InFlight++
			continue
		}
		d := Drift{Kind: kind, ID: s.id, IndexVersion: st.index, Source: st.source, Ledger: st.ledger}
		if s.hasKey {
			d.EntityType, d.EntityID = s.key.Type, s.key.ID
		}
		v.rep.add(d, v.cfg.Sample)
		drift = append(drift, d)
	}
	return drift, nil
}

// documentID is the _id of k's document.
func documentID(k key) string { return projection.DocumentID(k.Type, k.ID) }

// keyOf is the key whose document id is; false for an id that is no
// entity's (projection.ParseDocumentID), which is then extra.
func keyOf(id string) (key, bool) {
	t, e, ok := projection.ParseDocumentID(id)
	return key{Type: t, ID: e}, ok
}

// Describe is the report in one line, for logs.
func (r Report) Describe() string {
	parts := make([]string, 0, len(Kinds))
	for _, k := range Kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Counts[k]))
	}
	return fmt.Sprintf("%d checked: %s", r.Checked, strings.Join(parts, ", "))
}
