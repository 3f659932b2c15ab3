package rebuild

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/bounds"
	"github.com/wlproj/wlproj/internal/pgpool"
	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/projection"
)

// bundle is a database with a source table, an alias name of the test's
// own (its indexes are deleted when the test ends), and a client.
type bundle struct {
	ctx    context.Context
	db     harness.DB
	base   string
	alias  string
	client *elastic.Client
}

// sourceDDL is the SoT of the tests: one row per document, as the
// application keeps it.
const sourceDDL = `
CREATE TABLE search_index (
    entity_type text   NOT NULL,
    entity_id   text   NOT NULL,
    doc         jsonb  NOT NULL,
    version     bigint NOT NULL,
    PRIMARY KEY (entity_type, entity_id)
)`

func setup(t *testing.T, rows int) bundle {
	t.Helper()
	b := bundle{ctx: context.Background(), db: harness.NewDatabase(t), base: harness.ElasticURL(t), alias: harness.NewIndexName(t)}
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), b.base, b.alias+"-*") })
	var err error
	b.client, err = projection.NewElasticClient(projection.ElasticOptions{URL: b.base})
	require.NoError(t, err)
	b.db.Exec(t, sourceDDL)
	b.db.Exec(t, `INSERT INTO search_index
		SELECT 'book', 'b' || g, jsonb_build_object('kind', 'book', 'title', 'Book ' || g, 'word_count', g), 1
		  FROM generate_series(1, $1) g`, rows)
	return b
}

func (b bundle) config(t *testing.T) Config {
	mapping, err := os.ReadFile(filepath.Join(harness.Root(t), "testdata", "mapping.json"))
	require.NoError(t, err)
	return Config{Pool: b.db.Pool, Client: b.client, Alias: b.alias, SourceTable: "search_index",
		By: "alice", Why: "test rebuild", Mapping: mapping, MappingFile: "testdata/mapping.json", ConfirmTimeout: 20 * time.Second}
}

// setupLed is setup with ELASTIC_INDEX a concrete index and a real leader
// draining into it.
func setupLed(t *testing.T, rows int) bundle {
	t.Helper()
	b := setup(t, rows)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.alias))
	b.leader(t)
	return b
}

// leader starts a real replica draining into the alias and waits until it leads.
func (b bundle) leader(t *testing.T) *harness.Replica {
	t.Helper()
	r := harness.StartReplica(t, "r1", harness.ReplicaEnv(b.db.URL, b.base, b.alias, harness.Quick...))
	harness.Leader(t, r)
	return r
}

func (b bundle) resolve(t *testing.T) named {
	t.Helper()
	n, err := engine{client: b.client}.resolve(b.ctx, b.alias)
	require.NoError(t, err)
	return n
}

func (b bundle) count(t *testing.T, index string) int {
	t.Helper()
	n, err := harness.DocCount(b.ctx, b.base, index)
	require.NoError(t, err)
	return n
}

// produce writes events at rate until the test stops it: updates of the
// loaded documents, new documents, and deletes if deletes is set. Versions
// only grow, so each event is its document's newest.
func (b bundle) produce(t *testing.T, rate, rows int, deletes bool) *harness.Producer {
	t.Helper()
	var version atomic.Int64
	version.Store(10)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	next := func(n int) []harness.Event {
		mu.Lock()
		defer mu.Unlock()
		events := make([]harness.Event, n)
		for i := range events {
			v := version.Add(1)
			id := fmt.Sprintf("b%d", 1+rng.IntN(rows))
			op := "upsert"
			switch k := rng.IntN(10); {
			case k < 2:
				id = fmt.Sprintf("new%d", v)
			case k == 2 && deletes:
				op = "delete"
			}
			events[i] = harness.Event{EntityType: "book", EntityID: id, Op: op, Version: v,
				Payload: json.RawMessage(fmt.Sprintf(`{"kind": "book", "title": "v%d", "word_count": %d}`, v, v))}
		}
		return events
	}
	p := harness.Produce(b.ctx, harness.SourceWriter{DB: b.db.Pool, Table: "search_index"}, harness.ProducerConfig{Rate: rate, Next: next})
	t.Cleanup(p.Stop)
	return p
}

// writesGoOn waits until the application has committed 50 more events.
func (b bundle) writesGoOn(t *testing.T, p *harness.Producer, when string) {
	t.Helper()
	from := p.Committed()
	harness.Eventually(t, 20*time.Second, "50 events written "+when, func() bool { return p.Committed() >= from+50 })
}

// readLoop counts the alias's documents until stopped: every answer must
// be a success and never below an earlier one (the producer never deletes).
type readLoop struct {
	stop   chan struct{}
	done   chan struct{}
	reads  atomic.Int64
	errs   []string
	falls  []string
	maxSee int64
}

func (b bundle) read(t *testing.T) *readLoop {
	r := &readLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var c struct {
				Count int64 `json:"count"`
			}
			err := harness.ES(b.ctx, b.base, http.MethodGet, "/"+b.alias+"/_count", nil, &c)
			r.reads.Add(1)
			switch {
			case err != nil:
				r.errs = append(r.errs, err.Error())
			case c.Count < r.maxSee:
				r.falls = append(r.falls, fmt.Sprintf("%d after %d", c.Count, r.maxSee))
			default:
				r.maxSee = c.Count
			}
		}
	}()
	return r
}

func (r *readLoop) finish() { close(r.stop); <-r.done }

// TestRebuildSwapsUnderReadersAndWriters rebuilds 50,000 documents while a
// reader counts the alias in a loop and the application writes throughout;
// a real leader dual-writes. The reader never fails nor sees fewer
// documents, and at the end every document is at its newest version.
func TestRebuildSwapsUnderReadersAndWriters(t *testing.T) {
	t.Parallel()
	const rows = 50_000
	b := setup(t, rows)
	b.leader(t)
	cfg := b.config(t)

	// The leader made the missing ELASTIC_INDEX an alias of an empty index
	// before its first write; the first rebuild swaps it like any alias.
	harness.Eventually(t, 15*time.Second, "the leader's alias", func() bool { n := b.resolve(t); return len(n.Indexes) == 1 && !n.Concrete })
	first, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.False(t, first.Created || first.Converted)
	require.Equal(t, []string{first.Rebuild.Target}, b.resolve(t).Indexes)
	require.Equal(t, rows, b.count(t, b.alias))

	reader := b.read(t)
	producer := b.produce(t, 300, rows, false)
	b.writesGoOn(t, producer, "before the rebuild")
	cfg.Mapping = nil // the second copies the current index's mapping
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	b.writesGoOn(t, producer, "after the swap")
	producer.Stop()
	reader.finish()

	require.Equal(t, rep.Rows, rep.Loaded+rep.Superseded, "every source row loaded or newer already")
	require.GreaterOrEqual(t, rep.Rows, int64(rows))
	require.Zero(t, rep.Refused)
	t.Logf("first rebuild %.1fs, second %.1fs (%d rows, %d superseded); %d reads, %d events produced", first.Seconds, rep.Seconds, rep.Rows, rep.Superseded, reader.reads.Load(), producer.Committed())
	require.Equal(t, first.Rebuild.Target, rep.Rebuild.OldIndex)
	require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
	require.Empty(t, reader.errs, "reads of the alias failed")
	require.Empty(t, reader.falls, "a read saw fewer documents than an earlier one")
	require.Greater(t, reader.reads.Load(), int64(20))
	require.Greater(t, producer.Committed(), int64(100))

	harness.Drained(t, b.db.Pool, 30*time.Second)
	harness.Verified(t, b.db.Pool, b.alias)
	harness.SourceMatched(t, b.db.Pool, b.alias, "search_index")
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE state = 'swapped' AND id = $1
		AND dual_write_at IS NOT NULL AND dual_write_by = 'r1'`, rep.Rebuild.ID))
	require.GreaterOrEqual(t, b.count(t, first.Rebuild.Target), rows, "the old index is kept")
}

// stopAt is a Progress that cancels the rebuild once n rows are done.
type stopAt struct {
	noProgress
	n      int64
	done   atomic.Int64
	cancel context.CancelFunc
}

func (s *stopAt) Add(n int64) {
	if s.done.Add(n) >= s.n {
		s.cancel()
	}
}

// rebuildProcess is `wlproj rebuild` run as an operator runs it, so that
// a test can kill it.
type rebuildProcess struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

// startRebuild runs the test binary's `wlproj rebuild` of the bundle's
// source table into its alias, with args added.
func (b bundle) startRebuild(t *testing.T, args ...string) *rebuildProcess {
	t.Helper()
	p := &rebuildProcess{done: make(chan struct{})}
	args = append([]string{"rebuild", "--from-table", "search_index", "--by", "alice", "--why", "crash test",
		"--progress", "json", "--database-url", b.db.URL, "--elastic-url", b.base, "--elastic-index", b.alias}, args...)
	p.cmd = exec.Command(harness.Binary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("wlproj rebuild printed:\n%s", p.out.String())
		}
	})
	return p
}

// kill is kill -9; it returns once the process is gone.
func (p *rebuildProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// TestRebuildResumesAfterCrash kills `wlproj rebuild` with SIGKILL twice:
// in the middle of the load (the alias stays on the old, concrete index
// and the rebuild open), and between the swap and the close (the alias on
// the new index, the row still open). Events, deletes among them, go on
// throughout; the last run resumes, closes, and every event is done with
// its document at its newest version, nothing lost or resurrected.
func TestRebuildResumesAfterCrash(t *testing.T) {
	t.Parallel()
	const rows = 20_000
	b := setupLed(t, rows)
	producer := b.produce(t, 200, rows, true)
	// Slow enough that the load is still running a checkpoint (1 s) after it
	// began: 2,000 bulks, one at a time.
	slow := []string{"--bulk-size", "10", "--concurrency", "1"}

	// 1. Killed during the load, once it checkpointed some rows.
	p := b.startRebuild(t, slow...)
	harness.Eventually(t, 60*time.Second, "the load to checkpoint", func() bool {
		return b.db.Int(t, `SELECT coalesce(max(rows_loaded), 0)::int FROM outbox_rebuilds WHERE state = 'open'`) > 0
	})
	p.kill()
	require.Equal(t, named{Indexes: []string{b.alias}, Concrete: true}, b.resolve(t), "the alias is untouched")
	open, err := Open(b.ctx, b.db.Pool, projection.SearchName)
	require.NoError(t, err)
	require.NotNil(t, open)
	require.Less(t, open.RowsLoaded, int64(rows), "killed before the load ended")
	b.writesGoOn(t, producer, "while the rebuild is dead (dual-writes go on)")

	// 2. Killed after the alias moved but before the close: the close's
	// audit row waits for a lock the test holds.
	p = b.startRebuild(t)
	harness.Eventually(t, 30*time.Second, "the run to resume", func() bool {
		return b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit WHERE action = 'rebuild' AND selector->>'step' = 'resume'`) == 1
	})
	conn, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `LOCK TABLE outbox_replay_audit IN SHARE MODE`)
	require.NoError(t, err)
	harness.Eventually(t, 60*time.Second, "the alias to move to the new index", func() bool {
		n, err := engine{client: b.client}.resolve(b.ctx, b.alias)
		return err == nil && !n.Concrete && len(n.Indexes) == 1 && n.Indexes[0] == open.Target
	})
	p.kill()
	require.NoError(t, tx.Rollback(b.ctx))
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND state = 'open'`, open.ID),
		"the row is still open")
	b.writesGoOn(t, producer, "after the swap, with the rebuild dead")

	// 3. The same command again only closes.
	cfg := b.config(t)
	cfg.Mapping = nil
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	producer.Stop()
	require.True(t, rep.Resumed)
	require.True(t, rep.Converted)
	require.Equal(t, []string{open.Target}, b.resolve(t).Indexes)
	require.Equal(t, "open,resume,resume,swap", str(t, b.db, `SELECT string_agg(selector->>'step', ',' ORDER BY id)
		FROM outbox_replay_audit WHERE action = 'rebuild'`))

	harness.Drained(t, b.db.Pool, 30*time.Second)
	harness.Verified(t, b.db.Pool, b.alias)
	harness.SourceMatched(t, b.db.Pool, b.alias, "search_index")
}

// TestRebuildRollbackServesCurrentDocuments: after the swap the leader
// keeps writing the old index, so that moving the alias back serves every
// event, those written after the swap included. The rebuild's own index is
// then released, and --cleanup deletes it once AbortGrace has passed by
// the database's clock.
func TestRebuildRollbackServesCurrentDocuments(t *testing.T) {
	t.Parallel()
	const rows = 5000
	b := setupLed(t, rows)
	cfg := b.config(t)
	_, err := Run(b.ctx, cfg) // converts the concrete index into an alias
	require.NoError(t, err)
	producer := b.produce(t, 300, rows, true)
	b.writesGoOn(t, producer, "before the rebuild")
	cfg.Mapping = nil
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	old := rep.Rebuild.OldIndex
	require.NotEmpty(t, old)
	b.writesGoOn(t, producer, "after the swap")

	rolled, err := Rollback(b.ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, StateRolledBack, rolled.State)
	require.Equal(t, []string{old}, b.resolve(t).Indexes)
	b.writesGoOn(t, producer, "after the rollback")
	producer.Stop()
	harness.Drained(t, b.db.Pool, 30*time.Second)
	harness.Verified(t, b.db.Pool, b.alias)
	harness.SourceMatched(t, b.db.Pool, b.alias, "search_index")

	_, err = Rollback(b.ctx, cfg)
	require.ErrorContains(t, err, "is rolled_back: only a swapped rebuild, the newest, can be rolled back")
	_, _ = Cleanup(b.ctx, cfg) // closes the first rebuild: its concrete index went in the swap
	_, err = Cleanup(b.ctx, cfg)
	require.ErrorContains(t, err, "index "+rep.Rebuild.Target+" of rolled_back rebuild #"+fmt.Sprint(rep.Rebuild.ID)+" is kept until")
	b.db.Exec(t, `UPDATE outbox_rebuilds SET released_at = released_at - interval '2 minutes' WHERE id = $1`, rep.Rebuild.ID)
	cleaned, err := Cleanup(b.ctx, cfg)
	require.NoError(t, err)
	var deleted []string
	for _, c := range cleaned {
		deleted = append(deleted, c.Deleted)
	}
	require.Contains(t, deleted, rep.Rebuild.Target)
	exists, err := engine{client: b.client}.exists(b.ctx, rep.Rebuild.Target)
	require.NoError(t, err)
	require.False(t, exists)
	require.Equal(t, []string{old}, b.resolve(t).Indexes)
}

// TestRebuildAbortAndCleanup: an aborted rebuild leaves the alias as it
// was and the leader stops writing its index; --cleanup keeps that index
// for AbortGrace after the abort, by the database's clock, for writes in
// flight, then deletes it and closes the rebuild.
func TestRebuildAbortAndCleanup(t *testing.T) {
	t.Parallel()
	const rows = 5000
	b := setupLed(t, rows)
	producer := b.produce(t, 200, rows, true)
	cfg := b.config(t)
	cfg.Mapping = nil
	ctx, cancel := context.WithCancel(b.ctx)
	cfg.Progress = &stopAt{n: rows / 3, cancel: cancel}
	_, err := Run(ctx, cfg)
	var stopped *StoppedError
	require.ErrorAs(t, err, &stopped)
	cfg.Progress = nil

	row, err := Abort(b.ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, StateAborted, row.State)
	require.Equal(t, named{Indexes: []string{b.alias}, Concrete: true}, b.resolve(t), "the alias is untouched")
	time.Sleep(2*CacheTTL + 500*time.Millisecond) // the leader's view of the rebuilds, and a bulk in flight
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodPost, "/"+row.Target+"/_refresh", nil, nil))
	before := b.count(t, row.Target)
	b.writesGoOn(t, producer, "after the abort")
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodPost, "/"+row.Target+"/_refresh", nil, nil))
	require.Equal(t, before, b.count(t, row.Target), "the leader still writes the aborted rebuild's index")

	_, err = Cleanup(b.ctx, cfg)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.ErrorContains(t, err, "index "+row.Target+" of aborted rebuild #"+fmt.Sprint(row.ID)+" is kept until")
	b.db.Exec(t, `UPDATE outbox_rebuilds SET finished_at = finished_at - interval '2 minutes',
		released_at = released_at - interval '2 minutes' WHERE id = $1`, row.ID)
	cleaned, err := Cleanup(b.ctx, cfg)
	require.NoError(t, err)
	require.Len(t, cleaned, 1)
	require.Equal(t, row.Target, cleaned[0].Deleted)
	exists, err := engine{client: b.client}.exists(b.ctx, row.Target)
	require.NoError(t, err)
	require.False(t, exists)
	require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE id = $1 AND state = 'cleaned'`, row.ID))
	require.Equal(t, "open,abort,cleanup", str(t, b.db, `SELECT string_agg(selector->>'step', ',' ORDER BY id)
		FROM outbox_replay_audit WHERE action = 'rebuild'`))

	producer.Stop()
	harness.Drained(t, b.db.Pool, 30*time.Second)
	harness.Verified(t, b.db.Pool, b.alias)
	require.Equal(t, named{Indexes: []string{b.alias}, Concrete: true}, b.resolve(t))
}

// str is the single text sql returns.
func str(t *testing.T, db harness.DB, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}

// TestRebuildBadInput: each bad request is a clear error and changes
// nothing: no rebuild row, no audit row, no new index, the alias as it was.
func TestRebuildBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.alias))
	b.db.Exec(t, `CREATE TABLE no_version (entity_type text, entity_id text, doc jsonb)`)
	b.db.Exec(t, `CREATE TABLE text_doc (entity_type text, entity_id text, doc text, version bigint)`)
	b.db.Exec(t, `CREATE TABLE no_key (entity_type text, entity_id text, doc jsonb, version bigint)`)
	b.db.Exec(t, `CREATE TABLE nullable_key (entity_type text, entity_id text, doc jsonb, version bigint, UNIQUE (entity_type, entity_id))`)
	good := b.config(t)
	good.Mapping = nil
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		input bool
		msg   string
	}{
		{"unknown projection", func(c *Config) { c.Projection = "chronicle" }, true, `projection "chronicle" cannot be rebuilt`},
		{"no table", func(c *Config) { c.SourceTable = "nope" }, true, `source table "nope" does not exist`},
		{"no column", func(c *Config) { c.SourceTable = "no_version" }, true, "source table no_version has no column version"},
		{"column type", func(c *Config) { c.SourceTable = "text_doc" }, true, "column doc of source table text_doc is text, not jsonb or json"},
		{"no key", func(c *Config) { c.SourceTable = "no_key" }, true, "source table no_key needs a primary key on (entity_type, entity_id)"},
		{"nullable key", func(c *Config) { c.SourceTable = "nullable_key" }, true, "source table nullable_key needs a primary key"},
		{"mapping not JSON", func(c *Config) { c.Mapping, c.MappingFile = []byte("{mappings"), "m.json" }, true, "mapping file m.json is not a JSON object"},
		{"mapping refused", func(c *Config) {
			c.Mapping, c.MappingFile = []byte(`{"mappings": {"properties": {"title": {"type": "nope"}}}}`), "bad.json"
		}, true, "the engine refused the new index's mapping (bad.json): 400 mapper_parsing_exception"},
		{"no who", func(c *Config) { c.By = " " }, false, "By is required"},
		{"payload limit", func(c *Config) { c.MaxPayloadBytes = -1 }, false, "MaxPayloadBytes"},
	} {
		cfg := good
		tc.edit(&cfg)
		_, err := Run(b.ctx, cfg)
		require.ErrorContains(t, err, tc.msg, tc.name)
		var input *InputError
		var field *bounds.FieldError
		if tc.input {
			require.ErrorAs(t, err, &input, tc.name)
			require.ErrorContains(t, err, "; nothing changed", tc.name)
		} else {
			require.ErrorAs(t, err, &field, tc.name)
		}
	}

	release, ok, err := TryLock(b.ctx, b.db.Pool, projection.SearchName)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = Run(b.ctx, good)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	require.ErrorContains(t, err, `another rebuild command of projection "search" is running (Postgres backend pid`)
	release()

	_, err = Cleanup(b.ctx, good)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.EqualError(t, err, `nothing to clean for projection "search": no swapped, aborted or rolled-back rebuild keeps an index; nothing changed`)
	_, err = Abort(b.ctx, good)
	require.EqualError(t, err, `no open rebuild of projection "search" to abort; nothing changed`)

	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds`))
	require.Zero(t, b.db.Int(t, `SELECT count(*) FROM outbox_replay_audit`))
	require.Equal(t, named{Indexes: []string{b.alias}, Concrete: true}, b.resolve(t))
	var indexes []map[string]any
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/_cat/indices/"+b.alias+"-*?format=json", nil, &indexes))
	require.Empty(t, indexes)
}

// TestLoaderDropsWhatTheLedgerHasNewer: a source row not newer than a
// delete in the ledger is not sent; one older than a live entry is not
// sent either, but is behind: its newer version is copied from the old
// index.
func TestLoaderDropsWhatTheLedgerHasNewer(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	b.db.Exec(t, `INSERT INTO outbox_ledger (projection, entity_type, entity_id, version, deleted, event_id) VALUES
		('search', 'book', 'newer', 5, false, 1), ('search', 'book', 'deleted', 3, true, 2),
		('search', 'book', 'older', 1, false, 3), ('chronicle', 'book', 'other', 9, false, 4)`)
	l := &loader{cfg: Config{Projection: projection.SearchName}, pool: b.db.Pool}
	rows := []sourceRow{{"book", "newer", nil, 4}, {"book", "deleted", nil, 3}, {"book", "older", nil, 2},
		{"book", "other", nil, 2}, {"book", "unknown", nil, 1}}
	events, stale, behind, err := l.fresh(b.ctx, rows)
	require.NoError(t, err)
	require.Equal(t, 1, stale)
	require.Equal(t, []Behind{{EntityType: "book", EntityID: "newer", SourceVersion: 4, LedgerVersion: 5}}, behind)
	var ids []string
	for _, e := range events {
		ids = append(ids, e.EntityID)
	}
	require.Equal(t, []string{"older", "other", "unknown"}, ids)
}

// TestRebuildEmitOutbox enqueues an event per source row instead of
// bulk-loading; the leader carries them to both indexes. A row the new
// index refuses is reported with its reason, not skipped silently.
func TestRebuildEmitOutbox(t *testing.T) {
	t.Parallel()
	const rows = 1000
	b := setup(t, rows)
	b.db.Exec(t, `INSERT INTO search_index VALUES ('book', 'bad', '{"kind": "book", "colour": "red"}', 1)`)
	require.NoError(t, harness.CreateIndex(b.ctx, b.base, b.alias))
	b.leader(t)
	cfg := b.config(t)
	cfg.Mapping, cfg.EmitOutbox, cfg.EmitRate, cfg.EmitBacklog = nil, true, 20_000, 1000
	var refused []Refused
	cfg.OnRefused = func(r Refused) { refused = append(refused, r) }
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(rows+1), rep.Rows)
	require.Equal(t, int64(rows), rep.Loaded)
	require.Equal(t, map[string]int64{"mapping_error": 1}, rep.RefusedByReason)
	require.Len(t, refused, 1)
	require.Equal(t, "bad", refused[0].EntityID)
	require.Contains(t, refused[0].Message, "strict_dynamic_mapping_exception")
	require.Equal(t, rows+1, b.db.Count(t, `scope_key = $1`, fmt.Sprintf("rebuild:%d", rep.Rebuild.ID)))
	require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
	require.Equal(t, rows, b.count(t, b.alias))
	harness.Verified(t, b.db.Pool, b.alias, harness.ExpectFailed(t, b.db, "mapping_error", `entity_id = 'bad'`)...)
}

// pagesHook is a Progress that runs first once the first rows are in the
// engine, while the load has read its first page and no other, and then
// once more rows than later are.
type pagesHook struct {
	noProgress
	done         atomic.Int64
	first, then  func()
	later        int64
	ranF, ranLtr atomic.Bool
}

func (h *pagesHook) Add(n int64) {
	done := h.done.Add(n)
	if n > 0 && h.ranF.CompareAndSwap(false, true) {
		h.first()
	}
	if done > h.later && h.ranLtr.CompareAndSwap(false, true) {
		h.then()
	}
}

// TestRebuildLoadReadsPagesOfTheirOwn: the load reads the source table a
// page per statement, so through a slow engine no snapshot of the
// rebuild's lives longer than a page (and VACUUM removes rows deleted
// during the load); and documents written between two pages, behind the
// pages read and ahead of them, updated, deleted or created, all end at
// their newest version: each page is read after the leader confirmed its
// dual-writes, and after the last key read, not after a count of rows.
func TestRebuildLoadReadsPagesOfTheirOwn(t *testing.T) {
	t.Parallel()
	const rows = 10_000
	b := setupLed(t, rows)
	at := func(position int) string {
		return str(t, b.db, `SELECT entity_id FROM search_index ORDER BY entity_type, entity_id OFFSET $1 LIMIT 1`, position)
	}
	// sourcePage is 2000 rows: the first page holds positions 0 to 1999.
	// Two deletes and one creation behind move every later row one place
	// up: a read by position would skip one.
	behind, deletedBehind, alsoDeletedBehind, ahead, deletedAhead := at(100), at(200), at(300), at(5000), at(6000)
	created := behind + "-new"

	pool, err := pgpool.Open(b.ctx, b.db.URL, 8, "wlproj-rebuild:test")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	slow := faultproxy.Start(t, b.base)
	slow.SetDelay(10*time.Millisecond, 0)
	cfg := b.config(t)
	cfg.Pool, cfg.BulkSize, cfg.Concurrency = pool, 100, 1
	cfg.Client, err = projection.NewElasticClient(projection.ElasticOptions{URL: slow.URL()})
	require.NoError(t, err)

	var dead harness.DeadRows
	var left int64
	version := int64(100)
	write := func(id, op string) harness.Event {
		version++
		return harness.Event{EntityType: "book", EntityID: id, Op: op, Version: version,
			Payload: json.RawMessage(fmt.Sprintf(`{"kind": "book", "title": "v%d"}`, version))}
	}
	hook := &pagesHook{later: 6000, first: func() {
		require.NoError(t, harness.Insert(b.ctx, harness.SourceWriter{DB: b.db.Pool, Table: "search_index"}, []harness.Event{
			write(behind, "upsert"), write(deletedBehind, "delete"), write(alsoDeletedBehind, "delete"), write(ahead, "upsert"), write(deletedAhead, "delete"),
			write(created, "upsert")}))
		require.NoError(t, harness.WaitDrained(b.ctx, 20*time.Second, b.db.Pool))
		dead, err = harness.DeleteRows(b.ctx, b.db.Pool, "application_rows", 1000)
		require.NoError(t, err)
	}, then: func() {
		// Retried for a few seconds: the cluster is shared with the suite's
		// other packages, and one of theirs (a prepared transaction, a
		// walsender) may hold every database's horizon for a moment; the
		// rebuild's own snapshots are the watch's to judge.
		left, _ = dead.WaitRemoved(b.ctx, 5*time.Second) // a timeout leaves left > 0
		if left > 0 {
			holder, _, _ := harness.OldestHorizon(b.ctx, b.db.Pool)
			t.Logf("rows left after 5 s of VACUUM; the horizon's holder: %s", holder)
		}
	}}
	cfg.Progress = hook
	require.Less(t, b.db.Int(t, `SELECT count(*) FROM search_index WHERE (entity_type, entity_id) < ('book', $1)`, created),
		2000, "the created document sorts among the first page's")

	watch := harness.WatchSnapshots(b.db.Pool, "wlproj-rebuild", 20*time.Millisecond)
	start := time.Now()
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	took := time.Since(start)
	oldest, samples, err := watch.Stop()
	require.NoError(t, err)
	t.Logf("the rebuild took %s; its oldest snapshot of %d samples: %s", took.Round(time.Millisecond), samples, oldest)
	require.True(t, hook.ranLtr.Load(), "the load went on after the writes")
	require.Less(t, oldest.Age, time.Second, "no snapshot of the rebuild outlives a page; the oldest: %s", oldest)
	require.Zero(t, left, "VACUUM, during the load, removes rows deleted during it")

	require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
	harness.SourceMatched(t, b.db.Pool, b.alias, "search_index")
	harness.Verified(t, b.db.Pool, b.alias)
	require.Equal(t, rows-3+1, b.count(t, b.alias))
}

// indexed puts every source row in the alias through the leader, as the
// application's events did: the ledger then holds each document's
// version, as it does for every document changed within OUTBOX_RETENTION.
// b7 is then changed at v5 by an event whose row the application never
// wrote: the source table is behind the ledger on it.
func (b bundle) indexedWithB7Behind(t *testing.T) {
	t.Helper()
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT entity_type, entity_id, 'upsert', version, doc FROM search_index ORDER BY entity_id`)
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		VALUES ('book', 'b7', 'upsert', 5, '{"kind": "book", "title": "Book 7, fifth"}')`)
	harness.Drained(t, b.db.Pool, 30*time.Second)
	require.Equal(t, 20, b.db.Int(t, `SELECT count(*) FROM outbox_ledger_entries`))
}

// TestRebuildKeepsWhatTheSourceIsBehindOn: every document changed before
// the rebuild has its version in the ledger from the producer's own
// event, and b7's newest version is in the ledger and the old index but
// not in the source table. Bulk-loaded, b7 was skipped as superseded and
// the alias served 19 of 20 documents; emitted, every event failed as
// version_reused and it served none. Now every document is there, b7 at
// v5, copied from the old index, and the report names b7.
func TestRebuildKeepsWhatTheSourceIsBehindOn(t *testing.T) {
	t.Parallel()
	for _, emit := range []bool{false, true} {
		t.Run(map[bool]string{false: "bulk", true: "emit-outbox"}[emit], func(t *testing.T) {
			t.Parallel()
			b := setupLed(t, 20)
			b.indexedWithB7Behind(t)
			cfg := b.config(t)
			cfg.EmitOutbox, cfg.EmitRate = emit, 10_000
			rep, err := Run(b.ctx, cfg)
			require.NoError(t, err)
			require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
			require.Equal(t, 20, b.count(t, b.alias), "every document behind the alias")
			var doc struct {
				Version int64 `json:"_version"`
				Source  struct {
					Title string `json:"title"`
				} `json:"_source"`
			}
			require.NoError(t, harness.ES(b.ctx, b.base, http.MethodGet, "/"+b.alias+"/_doc/book:b7", nil, &doc))
			require.Equal(t, int64(5), doc.Version)
			require.Equal(t, "Book 7, fifth", doc.Source.Title)
			require.Equal(t, []Behind{{EntityType: "book", EntityID: "b7", SourceVersion: 1, LedgerVersion: 5, CopiedVersion: 5}}, rep.BehindRows)
			require.Equal(t, [2]int64{1, 1}, [2]int64{rep.Behind, rep.Copied})
			require.Equal(t, int64(20), rep.Loaded)
			require.Zero(t, rep.Refused)
		})
	}
}

// TestRebuildRefusesASwapThatWouldLoseDocuments: the new mapping refuses
// b3's row (a field the old index's mapping took), so the new index lacks
// a document the old one serves. The swap is refused, nothing moves and
// the rebuild stays open; the same command again finds b3 again (the
// run's own list is gone, so it reads the source table for what the new
// index lacks). Once the application rewrites b3 in a form the new
// mapping takes, its event reaches the new index by dual-write, and the
// same command swaps. --allow-refused would swap at once, audited (the
// CLI's test).
func TestRebuildRefusesASwapThatWouldLoseDocuments(t *testing.T) {
	t.Parallel()
	b := setup(t, 20)
	withColour := `{"mappings": {"dynamic": "strict", "properties": {"kind": {"type": "keyword"}, "title": {"type": "text"},
		"word_count": {"type": "integer"}, "colour": {"type": "keyword"}}}}`
	require.NoError(t, harness.ES(b.ctx, b.base, http.MethodPut, "/"+b.alias, []byte(withColour), nil))
	b.leader(t)
	b.db.Exec(t, `UPDATE search_index SET doc = doc || '{"colour": "red"}' WHERE entity_id = 'b3'`)
	b.db.Exec(t, `INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload)
		SELECT entity_type, entity_id, 'upsert', version, doc FROM search_index`)
	harness.Drained(t, b.db.Pool, 30*time.Second)
	old := b.resolve(t)
	cfg := b.config(t) // testdata/mapping.json: strict, no colour

	for _, run := range []string{"first", "again"} {
		rep, err := Run(b.ctx, cfg)
		var refused *RefusedError
		require.ErrorAs(t, err, &refused, run)
		require.ErrorContains(t, err, "lacks 1 documents that "+b.alias+" has, because the rebuild refused their rows (book:b3", run)
		require.Equal(t, []string{"book:b3"}, rep.LostIDs, run)
		require.Equal(t, old, b.resolve(t), "%s: the alias did not move", run)
		require.Equal(t, 1, b.db.Int(t, `SELECT count(*) FROM outbox_rebuilds WHERE state = 'open'`), run)
	}

	require.NoError(t, harness.Insert(b.ctx, harness.SourceWriter{DB: b.db.Pool, Table: "search_index"}, []harness.Event{{
		EntityType: "book", EntityID: "b3", Op: "upsert", Version: 2, Payload: json.RawMessage(`{"kind": "book", "title": "Book 3"}`)}}))
	harness.Drained(t, b.db.Pool, 30*time.Second)
	rep, err := Run(b.ctx, cfg)
	require.NoError(t, err)
	require.Zero(t, rep.Lost)
	require.Equal(t, []string{rep.Rebuild.Target}, b.resolve(t).Indexes)
	require.Equal(t, 20, b.count(t, b.alias))
	harness.SourceMatched(t, b.db.Pool, b.alias, "search_index")
}
