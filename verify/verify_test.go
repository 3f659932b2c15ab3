package verify

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/olivere/elastic/v7"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/consume"
	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/rebuild"
)

// fixture is an outbox, an index and a source table search_index of books
// b1..bN at version 1, put in the index by the real consume loop.
type fixture struct {
	harness.Outbox
	base, index string
	client      *elastic.Client
	search      *projection.Search
	loop        *consume.Loop
}

func setup(t *testing.T, books int) fixture {
	t.Helper()
	f := fixture{Outbox: harness.NewOutbox(t), base: harness.ElasticURL(t), index: harness.NewIndex(t)}
	var err error
	f.client, err = projection.NewElasticClient(projection.ElasticOptions{URL: f.base})
	require.NoError(t, err)
	f.search, err = projection.NewSearch(projection.SearchConfig{Client: f.client, Index: f.index})
	require.NoError(t, err)
	f.loop, err = consume.NewLoop(consume.Config{PollInterval: 50 * time.Millisecond}, f.Store,
		projection.Registry{"search": f.search}, zerolog.Nop())
	require.NoError(t, err)
	f.Lead(t, 1)
	f.Exec(t, `CREATE TABLE search_index (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	f.produce(t, `SELECT 'book', 'b' || g, 'upsert', 1::bigint, jsonb_build_object('kind', 'book', 'title', 'Book ' || g)
		FROM generate_series(1, $1) g`, books)
	f.drain(t)
	return f
}

// produce writes events as the application does: the source row and the
// event in one statement. events selects (entity_type, entity_id, op,
// version, doc).
func (f fixture) produce(t *testing.T, events string, args ...any) {
	t.Helper()
	f.Exec(t, `
		WITH ev(entity_type, entity_id, op, version, doc) AS (`+events+`), up AS (
		  INSERT INTO search_index (entity_type, entity_id, doc, version)
		  SELECT entity_type, entity_id, doc, version FROM ev WHERE op = 'upsert'
		  ON CONFLICT (entity_type, entity_id) DO UPDATE SET doc = excluded.doc, version = excluded.version
		), del AS (
		  DELETE FROM search_index s USING ev
		   WHERE ev.op = 'delete' AND s.entity_type = ev.entity_type AND s.entity_id = ev.entity_id
		)
		INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT entity_type, entity_id, op, version, doc FROM ev`, args...)
}

// drain runs the consume loop until no event is pending or processing.
func (f fixture) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.loop.Run(ctx, 1, make(chan struct{}))
	}()
	harness.Drained(t, f.Pool, 30*time.Second)
	cancel()
	<-done
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")
}

func (f fixture) es(t *testing.T, method, path, body string) {
	t.Helper()
	require.NoError(t, harness.ES(context.Background(), f.base, method, path, []byte(body), nil))
}

// deleteByHand deletes books from the engine behind wlproj's back, in one
// bulk, as an operator's script would (the integ-test zips have no
// _delete_by_query).
func (f fixture) deleteByHand(t *testing.T, ids ...string) {
	t.Helper()
	var body strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&body, "{\"delete\": {\"_id\": \"book:%s\"}}\n", id)
	}
	f.es(t, http.MethodPost, "/"+f.index+"/_bulk?refresh=true", body.String())
}

func (f fixture) config(table string) Config {
	return Config{Pool: f.Pool, Client: f.client, Index: f.index, SourceTable: table}
}

func (f fixture) verify(t *testing.T, cfg Config) Report {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	return rep
}

// plant leaves one document of each kind behind wlproj's back:
//   - b1 deleted by hand in the engine (missing);
//   - b2's source row at version 5 with no event, a producer that forgot
//     one (stale);
//   - x1 written by hand, in no table (extra);
//   - b3 deleted through the outbox, then an older write arriving late,
//     after the engine forgot the delete (resurrected).
func (f fixture) plant(t *testing.T) {
	t.Helper()
	f.es(t, http.MethodDelete, "/"+f.index+"/_doc/book:b1", "")
	f.Exec(t, `UPDATE search_index SET version = 5, doc = '{"kind": "book", "title": "Book 2, fifth"}'
		WHERE entity_id = 'b2'`)
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:x1?version=3&version_type=external_gte", `{"kind": "book", "title": "Stray"}`)
	f.produce(t, `SELECT 'book', 'b3', 'delete', 2::bigint, '{}'::jsonb`)
	f.drain(t)
	harness.DeletesForgotten(t, f.index)
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/book:b3?version=1&version_type=external_gte", `{"kind": "book", "title": "Book 3"}`)
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")
}

func counts(m, s, e, r int64) map[Kind]int64 {
	return map[Kind]int64{Missing: m, Stale: s, Extra: e, Resurrected: r, Ahead: 0}
}

func TestVerifyFindsEachKindOfDrift(t *testing.T) {
	t.Parallel()
	f := setup(t, 200)
	f.plant(t)

	rep := f.verify(t, f.config("search_index"))
	require.Equal(t, counts(1, 1, 1, 1), rep.Counts)
	require.Equal(t, map[Kind][]string{Missing: {"book:b1"}, Stale: {"book:b2"}, Extra: {"book:x1"}, Resurrected: {"book:b3"}, Ahead: {}},
		rep.Samples)
	require.EqualValues(t, 4, rep.Drift())
	require.Equal(t, ComparedDocuments, rep.Compared)
	require.EqualValues(t, 201, rep.Checked, "200 index documents (x1 too) and the one it lacks")
	require.Equal(t, "search_index", rep.SourceTable)
}

// Without a table the ledger is the truth: a document it holds live is
// missing, one it holds at a newer version stale, one it says deleted
// resurrected, and nothing can be extra.
// A database restored from a backup older than the index holds an older
// version of a document the index has since taken a newer one of: only a
// fresh index can take the older version back (the engine refuses a lower
// external version), so verify must name it rather than call it clean.
func TestVerifyFindsTheIndexAheadOfTheSource(t *testing.T) {
	t.Parallel()
	f := setup(t, 20)
	f.produce(t, `SELECT 'book', 'b1', 'upsert', 3::bigint, '{"kind": "book", "title": "Book 1, third"}'::jsonb`)
	f.drain(t)
	// What the backup holds of b1: its row at version 1.
	f.Exec(t, `UPDATE search_index SET version = 1, doc = '{"kind": "book", "title": "Book 1"}' WHERE entity_id = 'b1'`)

	rep := f.verify(t, f.config("search_index"))
	require.Equal(t, map[Kind]int64{Ahead: 1}, nonZero(rep.Counts))
	require.Equal(t, []string{"book:b1"}, rep.Samples[Ahead])
	require.EqualValues(t, 1, rep.Drift())
}

func nonZero(m map[Kind]int64) map[Kind]int64 {
	out := map[Kind]int64{}
	for k, n := range m {
		if n != 0 {
			out[k] = n
		}
	}
	return out
}

func TestVerifyAgainstTheLedgerAlone(t *testing.T) {
	t.Parallel()
	f := setup(t, 200)
	f.plant(t)
	f.Exec(t, `UPDATE outbox_ledger SET version = 9 WHERE entity_id = 'b4'`)

	rep := f.verify(t, f.config(""))
	require.Equal(t, counts(1, 1, 0, 1), rep.Counts)
	require.Equal(t, map[Kind][]string{Missing: {"book:b1"}, Stale: {"book:b4"}, Extra: {}, Resurrected: {"book:b3"}, Ahead: {}}, rep.Samples)
	require.Empty(t, rep.SourceTable)
}

// A clean index is proven by fingerprints against a table (one read of
// each side), document by document against the ledger.
func TestVerifyCleanIndexReadsTheDatabaseOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, 300)
	for table, compared := range map[string]string{"search_index": ComparedFingerprints, "": ComparedDocuments} {
		rep := f.verify(t, f.config(table))
		require.Zero(t, rep.Drift(), "table %q", table)
		require.EqualValues(t, 300, rep.Checked)
		require.Equal(t, compared, rep.Compared, "table %q", table)
	}
}

// One version off, the counts equal: the fingerprints differ, and the
// documents are compared one by one.
func TestVerifyFingerprintsCatchOneVersion(t *testing.T) {
	t.Parallel()
	f := setup(t, 300)
	f.Exec(t, `UPDATE search_index SET version = 2 WHERE entity_id = 'b150'`)
	rep := f.verify(t, f.config("search_index"))
	require.Equal(t, ComparedDocuments, rep.Compared)
	require.Equal(t, counts(0, 1, 0, 0), rep.Counts)
}

// A document whose event is still pending differs from the source only
// until the drain reaches it: it is counted in flight, not drift.
func TestVerifyCountsPendingDocumentsInFlightNotDrift(t *testing.T) {
	t.Parallel()
	f := setup(t, 50)
	f.produce(t, `SELECT 'book', 'b7', 'upsert', 2::bigint, '{"kind": "book", "title": "Book 7, second"}'::jsonb
		UNION ALL SELECT 'book', 'new1', 'upsert', 1::bigint, '{"kind": "book", "title": "New"}'::jsonb`)

	rep := f.verify(t, f.config("search_index"))
	require.Zero(t, rep.Drift(), "%+v", rep.Counts)
	require.EqualValues(t, 2, rep.InFlight)
}

// Small pages: the scroll, the walk and the checks again go page by page
// and batch by batch, and find the same; the drift reaches OnDrift in
// batches no larger than recheckBatch.
func TestVerifyInSmallPagesAndBatches(t *testing.T) {
	t.Parallel()
	f := setup(t, 600)
	gone := harness.Column[string](t, f.DB, `SELECT entity_id FROM search_index WHERE entity_id LIKE 'b1%'`)
	f.deleteByHand(t, gone...)
	want := len(gone)

	var batches []int
	cfg := f.config("search_index")
	cfg.Page, cfg.Sample = 40, 3
	cfg.OnDrift = func(_ context.Context, d []Drift) error {
		batches = append(batches, len(d))
		for _, x := range d {
			require.Equal(t, Missing, x.Kind)
			require.EqualValues(t, -1, x.IndexVersion)
			require.EqualValues(t, 1, x.Source.Version)
			require.Nil(t, x.Source.Doc, "docs are read only for a repair")
		}
		return nil
	}
	rep := f.verify(t, cfg)
	require.EqualValues(t, want, rep.Counts[Missing])
	require.Len(t, rep.Samples[Missing], 3)
	require.EqualValues(t, 600, rep.Checked)
	total := 0
	for _, n := range batches {
		require.LessOrEqual(t, n, recheckBatch)
		total += n
	}
	require.Equal(t, want, total)
}

func TestVerifyKeepsToTheRateCap(t *testing.T) {
	t.Parallel()
	f := setup(t, 300)
	cfg := f.config("search_index")
	cfg.Page, cfg.Rate = 100, 500
	rep := f.verify(t, cfg)
	require.Zero(t, rep.Drift())
	// 100 documents at once (the burst), 200 more at 500 a second.
	require.GreaterOrEqual(t, rep.Took, 350*time.Millisecond)
}

// Bad input is refused before anything is read, naming what is wrong.
func TestVerifyRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t, 5)
	f.Exec(t, `CREATE TABLE no_key (entity_type text, entity_id text, doc jsonb, version bigint)`)
	f.Exec(t, `CREATE TABLE no_doc (entity_type text NOT NULL, entity_id text NOT NULL, version bigint,
		PRIMARY KEY (entity_type, entity_id))`)
	for _, tc := range []struct {
		cfg  func(Config) Config
		want string
	}{
		{func(c Config) Config { c.SourceTable = "nope"; return c }, `source table "nope" does not exist`},
		{func(c Config) Config { c.SourceTable = "no_key"; return c }, `needs a primary key on (entity_type, entity_id)`},
		{func(c Config) Config { c.SourceTable = "no_doc"; return c }, `has no column doc`},
		{func(c Config) Config { c.Projection = "chronicle"; return c }, `projection "chronicle" has no search index`},
	} {
		_, err := Run(context.Background(), tc.cfg(f.config("")))
		var input *rebuild.InputError
		require.ErrorAs(t, err, &input)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := Run(context.Background(), Config{Pool: f.Pool, Client: f.client, Index: f.index, Sample: 5000})
	var field *bounds.FieldError
	require.ErrorAs(t, err, &field)
	require.Equal(t, "Sample", field.Field)

	missing := f.config("")
	missing.Index = f.index + "-gone"
	_, err = Run(context.Background(), missing)
	require.ErrorContains(t, err, "index "+missing.Index+" does not exist")
}

func TestJudge(t *testing.T) {
	t.Parallel()
	src := func(v int64) *SourceRow { return &SourceRow{Version: v} }
	live := func(v int64) *Entry { return &Entry{Version: v} }
	gone := func(v int64) *Entry { return &Entry{Version: v, Deleted: true} }
	for _, tc := range []struct {
		table bool
		s     state
		want  Kind
	}{
		{true, state{index: -1, source: src(1)}, Missing},
		{true, state{index: 1, source: src(2)}, Stale},
		{true, state{index: 2, source: src(2), ledger: live(3)}, ""}, // the table is the truth
		{true, state{index: 3, source: src(2)}, Ahead},               // a restored source; the check again tells a moving one
		{true, state{index: 3, source: src(-1)}, ""},                 // a NULL version orders nothing
		{true, state{index: 2, source: src(2), ledger: gone(3)}, ""},
		{true, state{index: 1, ledger: gone(2)}, Resurrected},
		{true, state{index: 1, ledger: live(1)}, Extra},
		{true, state{index: 1}, Extra},
		{true, state{index: -1, ledger: gone(2)}, ""},
		{false, state{index: 1}, ""}, // a pruned entry
		{false, state{index: -1, ledger: live(1)}, Missing},
		{false, state{index: 1, ledger: live(2)}, Stale},
		{false, state{index: 3, ledger: live(2)}, ""},
		{false, state{index: 1, ledger: gone(2)}, Resurrected},
		{false, state{index: -1, ledger: gone(2)}, ""},
	} {
		got, drifted := judge(tc.table, tc.s)
		require.Equal(t, tc.want, got, "%+v", tc)
		require.Equal(t, tc.want != "", drifted)
	}
}

func TestKeyOf(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]*key{
		"book:1":           {"book", "1"},
		"crm:contact:42":   {"crm", "contact:42"},
		"crm%3Acontact:42": {"crm:contact", "42"},
		"nocolon":          nil,
		":x":               nil,
		"x:":               nil,
		"50%off:1":         nil, // written before types were escaped: no entity's id now
	} {
		got, ok := keyOf(id)
		require.Equal(t, want != nil, ok, id)
		if want != nil {
			require.Equal(t, *want, got, id)
		}
	}
}

// Before types were escaped, ('crm:contact', '7') was written at
// crm:contact:7, which is ('crm', 'contact:7')'s id now: verify finds that
// document extra (no such entity) and the entity's own missing.
func TestVerifyFindsDocumentsWrittenUnderTheOldIDs(t *testing.T) {
	t.Parallel()
	f := setup(t, 2)
	f.produce(t, `SELECT 'crm:contact', '7', 'upsert', 1::bigint, '{"kind": "book", "title": "Ada"}'::jsonb`)
	f.drain(t)
	f.es(t, http.MethodDelete, "/"+f.index+"/_doc/"+url.PathEscape(projection.DocumentID("crm:contact", "7")), "")
	f.es(t, http.MethodPut, "/"+f.index+"/_doc/crm:contact:7?version=1&version_type=external_gte", `{"kind": "book", "title": "Ada"}`)
	f.es(t, http.MethodPost, "/"+f.index+"/_refresh", "")

	rep := f.verify(t, f.config("search_index"))
	require.Equal(t, counts(1, 0, 1, 0), rep.Counts)
	require.Equal(t, map[Kind][]string{Missing: {"crm%3Acontact:7"}, Stale: {}, Extra: {"crm:contact:7"}, Resurrected: {}, Ahead: {}}, rep.Samples)
}

// The check again reads the database, the index, then the database again.
// A document the drain changes between two of the reads (updated, deleted
// or created, through the outbox) is not drift, whichever read saw it
// first; one that differs throughout still is.
func TestVerifyCheckAgainIgnoresAChangeBetweenItsReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, 50)
	f.deleteByHand(t, "b1")
	for _, tc := range []struct{ table, updated, deleted, created string }{
		{"search_index", "b7", "b8", "n1"},
		{"", "b9", "b10", "n2"},
	} {
		cfg := f.config(tc.table).withDefaults()
		v, err := newRun(ctx, cfg)
		require.NoError(t, err)
		var batch []suspect
		for _, id := range []string{"b1", tc.updated, tc.deleted, tc.created} {
			batch = append(batch, suspect{id: "book:" + id, key: key{"book", id}, hasKey: true})
		}
		drift, err := v.settle(ctx, batch, func(ctx context.Context, ids []string) (map[string]int64, error) {
			got, err := v.engine.get(ctx, ids)
			f.produce(t, `SELECT 'book', $1, 'upsert', 2::bigint, '{"kind": "book", "title": "second"}'::jsonb
				UNION ALL SELECT 'book', $2, 'delete', 2::bigint, '{}'::jsonb
				UNION ALL SELECT 'book', $3, 'upsert', 1::bigint, '{"kind": "book", "title": "new"}'::jsonb`,
				tc.updated, tc.deleted, tc.created)
			f.drain(t)
			return got, err
		})
		require.NoError(t, err)
		require.Len(t, drift, 1, "table %q: %+v", tc.table, drift)
		require.Equal(t, Missing, drift[0].Kind)
		require.Equal(t, "book:b1", drift[0].ID)
		require.EqualValues(t, 3, v.rep.InFlight, "table %q", tc.table)
	}
}

// The interleaving at the check again: b1 deleted at v2 and
// re-created at v3; the leader claimed the v3 event, the engine holds it,
// and its ack lands between two statements of the check. In the old order
// (the index, then the ledger, then the events in flight in a statement of
// its own) the check saw the index at v3, the tombstone of v2 and, after
// the ack, nothing in flight: b1 was judged resurrected, and an automatic
// repair deleted it at v3. Read database, index, database, the first read
// sees the event in flight and the second the ledger live at v3. The rows
// are claimed, as retried or replayed rows are: the claim's ack writes the
// row; TestVerifyCheckAgainSeesAQueuedAckBetweenItsStatements is the same
// for a queued row.
func TestVerifyCheckAgainSeesAnAckBetweenItsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, 10)
	f.ClaimedByDefault(t)
	f.recreateB1(t)
	claimed, err := f.Store.Claim(ctx, 1, 10, time.Minute, []string{"search"})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	for _, r := range f.search.Handle(ctx, claimed) {
		require.NoError(t, r.Err)
	}
	f.checkAgainAcross(t, func() {
		acked, err := f.Store.AckDone(ctx, 1, claimed[0].Claim, []int64{claimed[0].ID}, []int64{claimed[0].ID})
		require.NoError(t, err)
		require.Len(t, acked, 1)
	})
}

// The same interleaving for a queued v3 row, read by position: its ack
// moves the ledger and the next checkpoint the position, both between two
// statements of the check. The database read after the index's finds the
// ledger live at v3 and the row done, as the index has it.
func TestVerifyCheckAgainSeesAQueuedAckBetweenItsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, 10)
	f.recreateB1(t)
	_, positions, err := f.Store.LoadQueue(ctx)
	require.NoError(t, err)
	from, ok := positions["search"]
	require.True(t, ok, "the drain saved the position")
	read, to, err := f.Store.ReadQueued(ctx, "search", from, 10, true)
	require.NoError(t, err)
	require.Len(t, read, 1)
	for _, r := range f.search.Handle(ctx, read) {
		require.NoError(t, r.Err)
	}
	f.checkAgainAcross(t, func() {
		acked, err := f.Store.AckQueuedDone(ctx, 1, []int64{read[0].ID}, []int64{read[0].ID})
		require.NoError(t, err)
		require.Len(t, acked, 1)
		saved, err := f.Store.SaveCheckpoints(ctx, 1, time.Minute,
			[]outbox.Checkpoint{{Projection: "search", Done: to, Claimed: to, DoneEvents: 1}})
		require.NoError(t, err)
		require.Equal(t, 1, saved)
	})
	require.Zero(t, f.Count(t, `status <> 'done'`), "the checkpoint made the v3 row done")
}

// recreateB1 deletes b1 at v2 through the outbox and the drain, and
// produces its re-creation at v3, left for the test to send.
func (f fixture) recreateB1(t *testing.T) {
	t.Helper()
	f.produce(t, `SELECT 'book', 'b1', 'delete', 2::bigint, '{}'::jsonb`)
	f.drain(t)
	f.produce(t, `SELECT 'book', 'b1', 'upsert', 3::bigint, '{"kind": "book", "title": "again"}'::jsonb`)
}

// checkAgainAcross runs the check again of b1 with ack landing after its
// first statement's rows are read, and wants no drift.
func (f fixture) checkAgainAcross(t *testing.T, ack func()) {
	t.Helper()
	ctx := context.Background()
	v, err := newRun(ctx, f.config("").withDefaults())
	require.NoError(t, err)
	landed := false
	v.q = &ackAfterFirst{querier: v.q, ack: func() { ack(); landed = true }}
	drift, err := v.settle(ctx, []suspect{{id: "book:b1", key: key{"book", "b1"}, hasKey: true}}, v.engine.get)
	require.NoError(t, err)
	require.Empty(t, drift, "b1 is live at v3: no drift, nothing for a repair to delete")
	require.True(t, landed, "the ack landed between the statements")
}

// ackAfterFirst runs ack once, when the first statement's rows have all
// been read: the leader's ack landing between two statements of a read.
type ackAfterFirst struct {
	querier
	ack  func()
	done bool
}

func (q *ackAfterFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := q.querier.Query(ctx, sql, args...)
	if err != nil || q.done {
		return rows, err
	}
	q.done = true
	return &rowsThen{Rows: rows, then: q.ack}, nil
}

// rowsThen calls then once its rows are read.
type rowsThen struct {
	pgx.Rows
	then func()
}

func (r *rowsThen) Next() bool {
	if r.Rows.Next() {
		return true
	}
	if r.then != nil {
		then := r.then
		r.then = nil
		then()
	}
	return false
}

// A verify and a repair, rate-capped to last seconds, hold no snapshot for
// longer than a page and commit what they queue batch by batch: VACUUM
// removes rows deleted while the repair runs.
func TestVerifyAndRepairHoldNoSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, 1200)
	gone := harness.Column[string](t, f.DB, `SELECT entity_id FROM search_index WHERE entity_id ~ '^b[1-4]'`)
	f.deleteByHand(t, gone...)
	pool, err := pgpool.Open(ctx, f.URL, 4, "wlproj-verify:test")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := f.config("search_index")
	cfg.Pool, cfg.Page, cfg.Rate = pool, 100, 600

	watch := harness.WatchSnapshots(f.Pool, "wlproj-verify", 20*time.Millisecond)
	rep := f.verify(t, cfg)
	oldest, samples, err := watch.Stop()
	require.NoError(t, err)
	t.Logf("verify took %s; its oldest snapshot of %d samples: %s", rep.Took.Round(time.Millisecond), samples, oldest)
	require.EqualValues(t, len(gone), rep.Counts[Missing])
	require.Less(t, oldest.Age, time.Second, "no snapshot of verify's outlives a page; the oldest: %s", oldest)

	// The repair's first batch of events is in (or, were it one
	// transaction, its xid taken) while the rest of the run goes on.
	cfg.Documents, cfg.Rate = true, 300
	done := make(chan error, 1)
	var fix RepairReport
	go func() {
		var err error
		fix, err = Repair(ctx, cfg, req(who, func(r *RepairRequest) { r.Yes = true }))
		done <- err
	}()
	harness.Eventually(t, 20*time.Second, "the repair's first batch", func() bool {
		return f.Int(t, `SELECT count(*) FROM outbox_events WHERE repair`)+f.Int(t, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'wlproj-verify:test' AND backend_xid IS NOT NULL`) > 0
	})
	dead, err := harness.DeleteRows(ctx, f.Pool, "application_rows", 1000)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	left, err := dead.Vacuum(ctx)
	require.NoError(t, err)
	select {
	case err := <-done:
		t.Fatalf("the repair ended (%v) before the VACUUM: the test proves nothing", err)
	default:
	}
	require.Zero(t, left, "VACUUM removes rows deleted while the repair runs")
	require.NoError(t, <-done)
	require.EqualValues(t, len(gone), fix.QueuedTotal())
	require.Len(t, fix.AuditIDs, 2, "one audit row per batch committed")
	require.Equal(t, len(gone), f.Count(t, `repair`))
}
