package e2e

// Process tests of the projections file: two search projections on two
// indexes, each with its own mapping, beside the chronicle, run by real
// replicas from one file.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/cli"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// twoIndexes writes a projections file of books and blocks, each on its
// own index of the cluster's engine with a mapping file of its own (books'
// isbn and blocks' title are keywords; blocks is sent in bulks of 7
// documents, 3 at once), and the chronicle as timeline. With sources, each
// search projection rebuilds and verifies from a table of its own,
// books_source and blocks_source, which the test creates
// (createSources). It returns the file and the two indexes.
func twoIndexes(t *testing.T, engineURL, index string, sources bool) (file, books, blocks string) {
	return twoIndexesOn(t, engineURL, engineURL, index, sources)
}

// twoIndexesOn is twoIndexes with books on the engine at booksURL and
// blocks on the one at blocksURL.
func twoIndexesOn(t *testing.T, booksURL, blocksURL, index string, sources bool) (file, books, blocks string) {
	dir := t.TempDir()
	books, blocks = index+"-books", index+"-blocks"
	mappings := map[string]string{"books": "isbn", "blocks": "title"}
	for name, keyword := range mappings {
		body := fmt.Sprintf(`{"mappings": {"properties": {%q: {"type": "keyword"}}}}`, keyword)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".json"), []byte(body), 0o600))
	}
	file = filepath.Join(dir, "projections.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
projections:
  books:
    kind: search
    engine: {urls: [%[1]s]}
    index: %[2]s
    mapping_file: %[4]s/books.json
    %[5]s
  blocks:
    kind: search
    engine: {urls: [%[6]s]}
    index: %[3]s
    mapping_file: %[4]s/blocks.json
    bulk: {actions: 7, concurrency: 3}
    %[7]s
  timeline:
    kind: chronicle
`, booksURL, books, blocks, dir, sourceLine(sources, "books_source"), blocksURL, sourceLine(sources, "blocks_source"))), 0o600))
	t.Cleanup(func() {
		for _, url := range []string{booksURL, blocksURL} {
			_ = harness.DeleteIndex(context.Background(), url, books+"*", blocks+"*")
		}
	})
	return file, books, blocks
}

func sourceLine(sources bool, table string) string {
	if !sources {
		return ""
	}
	return "source_table: " + table
}

// createSources creates the source tables of twoIndexes' projections.
func (c *cluster) createSources() {
	for _, table := range []string{"books_source", "blocks_source"} {
		c.db.Exec(c.t, `CREATE TABLE `+table+` (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
			version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	}
}

// fillSource writes version of each of entities books into table, as the
// application's truth the next rebuild loads.
func (c *cluster) fillSource(table string, entities, version int) {
	c.db.Exec(c.t, `INSERT INTO `+table+` SELECT 'book', g::text, jsonb_build_object('title', 'book ' || g || ' v' || $2::int, 'isbn', 'i-' || g), $2
		FROM generate_series(1, $1) g
		ON CONFLICT (entity_type, entity_id) DO UPDATE SET doc = excluded.doc, version = excluded.version`, entities, version)
}

// produceTo inserts versions from to last of each of entities documents
// of projection, shuffled; the same ids in every projection.
func (c *cluster) produceTo(projection, entityType string, entities, from, last int) {
	c.t.Helper()
	c.db.Exec(c.t, `
		INSERT INTO outbox_events (projection, entity_type, entity_id, op, event_version, payload)
		SELECT $1, $2, e::text, 'upsert', v, jsonb_build_object('title', $2 || ' ' || e || ' v' || v, 'isbn', 'i-' || e)
		  FROM generate_series(1, $3) e, generate_series($4::int, $5::int) v
		 ORDER BY random()`, projection, entityType, entities, from, last)
}

// Two search projections and the chronicle from one file: each index gets
// its own documents (the same document ids in both, with lower versions in
// blocks: one ledger for both would drop blocks' as superseded), the mapping
// file shapes its index, and a paused projection waits while the other
// drains, across a leader failover.
func TestProjectionsFileRunsTwoIndexes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	file, books, blocks := twoIndexes(t, harness.ElasticURL(t), c.index, false)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	c.run("a", "b")

	c.produceTo("books", "book", 30, 1, 3)
	c.produceTo("blocks", "book", 30, 1, 2)
	c.produceTo("timeline", "book", 5, 1, 2)
	harness.Drained(t, c.db.Pool, 60*time.Second)
	harness.VerifiedProjection(t, c.db.Pool, books, "books")
	harness.VerifiedProjection(t, c.db.Pool, blocks, "blocks")
	require.Equal(t, 10, c.appended(), "the chronicle as timeline")
	for _, index := range []string{books, blocks} {
		n, err := harness.DocCount(context.Background(), harness.ElasticURL(t), index)
		require.NoError(t, err)
		require.Equal(t, 30, n, "%s holds its projection's documents only", index)
	}
	requireKeyword(t, books, "isbn")
	requireKeyword(t, blocks, "title")

	// Each paused in turn while the other drains; a failover while books waits.
	c.pausedWhileOtherDrains(file, "books", "blocks", 4, func() { c.leader().Kill(); c.leader() })
	c.pausedWhileOtherDrains(file, "blocks", "books", 9, func() {})
	harness.VerifiedProjection(t, c.db.Pool, books, "books")
	harness.VerifiedProjection(t, c.db.Pool, blocks, "blocks")
}

// pausedWhileOtherDrains pauses paused, sends a wave of 30 books × 5
// versions from version `from` to each projection, sees other drain while
// none of paused's is sent, runs meanwhile, resumes paused and sees it
// drain.
func (c *cluster) pausedWhileOtherDrains(file, paused, other string, from int, meanwhile func()) {
	c.t.Helper()
	out := c.cli("pause", "--projections-file", file, "--projection", paused, "--by", "e2e", "--why", "reindex "+paused)
	require.Contains(c.t, out, "paused "+paused)
	c.produceTo(paused, "book", 30, from, from+4)
	c.produceTo(other, "book", 30, from, from+4)
	harness.Eventually(c.t, 60*time.Second, other+" drains while "+paused+" waits", func() bool {
		return c.count(`projection = '`+other+`' AND status <> 'done'`) == 0
	})
	require.Equal(c.t, 150, c.count(`projection = '`+paused+`' AND status <> 'done'`), "none of %s's wave was sent", paused)
	meanwhile()
	c.cli("resume", "--projections-file", file, "--projection", paused, "--by", "e2e", "--why", "reindexed")
	harness.Drained(c.t, c.db.Pool, 60*time.Second)
}

// requireKeyword checks that field is mapped as a keyword in index's
// concrete index: the mapping file's, not the engine's dynamic text.
func requireKeyword(t *testing.T, index, field string) {
	t.Helper()
	types, err := harness.MappedTypes(context.Background(), harness.ElasticURL(t), index, field)
	require.NoError(t, err)
	require.Len(t, types, 1, "one concrete index behind the alias")
	for _, typ := range types {
		require.Equal(t, "keyword", typ)
	}
}

// rebuild and verify of each search projection of the file take its
// engine, alias, source table and mapping file from the file: books is
// rebuilt from books_source while blocks keeps its index, then blocks from
// blocks_source (its mapping file edited meanwhile: the rebuild applies
// it) while books keeps its new one; each verifies clean against its own
// table.
func TestProjectionsFileRebuildsAndVerifiesEach(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.createSources()
	file, books, blocks := twoIndexes(t, harness.ElasticURL(t), c.index, true)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	c.run("a", "b")
	c.produceTo("books", "book", 20, 1, 3)
	c.produceTo("blocks", "book", 20, 1, 2)
	harness.Drained(t, c.db.Pool, 60*time.Second)
	c.fillSource("books_source", 20, 3)
	c.fillSource("blocks_source", 20, 2)
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(file), "blocks.json"),
		[]byte(`{"mappings": {"properties": {"title": {"type": "keyword"}, "isbn": {"type": "keyword"}}}}`), 0o600))

	for _, p := range []struct{ name, index, other string }{{"books", books, blocks}, {"blocks", blocks, books}} {
		before, other := concreteIndexes(t, p.index), concreteIndexes(t, p.other)
		out := c.cli("rebuild", "--projections-file", file, "--projection", p.name, "--by", "e2e", "--why", "new mapping", "--progress", "json")
		require.Contains(t, out, "swapped")
		require.NotEqual(t, before, concreteIndexes(t, p.index), "%s rebuilt into a new index", p.name)
		require.Equal(t, other, concreteIndexes(t, p.other), "%s's index untouched", p.other)
		require.Contains(t, c.cli("verify", "--projections-file", file, "--projection", p.name), "clean: the index holds")
	}
	requireKeyword(t, books, "isbn")
	requireKeyword(t, blocks, "title")
	requireKeyword(t, blocks, "isbn") // the edited mapping file's
	harness.VerifiedProjection(t, c.db.Pool, books, "books")
	harness.VerifiedProjection(t, c.db.Pool, blocks, "blocks")

	var stdout, stderr bytes.Buffer
	code := cli.Run([]string{"verify", "--database-url", c.db.URL, "--projections-file", file, "--projection", "timeline"}, &stdout, &stderr)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), `projection "timeline" is not a search projection of `+file+` (its search projections: blocks, books)`)
}

// concreteIndexes are the indexes alias points at.
func concreteIndexes(t *testing.T, alias string) []string {
	t.Helper()
	types, err := harness.MappedTypes(context.Background(), harness.ElasticURL(t), alias, "isbn")
	require.NoError(t, err)
	return slices.Sorted(maps.Keys(types))
}

// A rolling restart that adds a projection: the leader still on the old
// file passes over the new projection's events instead of failing them,
// and the replica restarted with the new file drains them once it leads.
func TestProjectionAddedByARollingRestart(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "OUTBOX_UNKNOWN_PROJECTION_WAIT=5m")
	file, books, _ := twoIndexes(t, harness.ElasticURL(t), c.index, false)
	old := c.start("old") // ELASTIC_* only: search and the chronicle
	harness.Leader(t, old)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	newer := c.start("new") // the standby, restarted first with the new file
	// The standby and status say the replicas' projections differ.
	require.Contains(t, readyProjections(t, newer), `"agree":false`)
	require.Contains(t, c.cli("status", "--projections-file", file), "DIFFERENT: the replicas run different projections")

	c.produceTo("books", "book", 20, 1, 2)
	c.produce(20, 1)
	harness.Eventually(t, 30*time.Second, "the search events drained by the old leader", func() bool {
		return c.count(`projection = 'search' AND status <> 'done'`) == 0
	})
	harness.Eventually(t, 10*time.Second, "the old leader passes over books and says why", func() bool {
		return strings.Contains(old.Logs(), "events name a projection this replica does not know")
	})
	require.Equal(t, 40, c.count(`projection = 'books' AND status <> 'done' AND status <> 'failed'`), "books wait, none failed")

	old.Stop(30 * time.Second)
	harness.Drained(t, c.db.Pool, 60*time.Second)
	require.Zero(t, c.count(`status = 'failed'`))
	harness.VerifiedProjection(t, c.db.Pool, books, "books")
	require.Contains(t, readyProjections(t, newer), `"agree":true`, "the new leader recorded its own")
	require.Contains(t, c.cli("status", "--projections-file", file), ": the same")
}

// readyProjections is the projections part of r's /readyz.
func readyProjections(t *testing.T, r *harness.Replica) string {
	t.Helper()
	_, body, err := r.Get("/readyz")
	require.NoError(t, err)
	var ready struct {
		Projections json.RawMessage `json:"projections"`
	}
	require.NoError(t, json.Unmarshal(body, &ready), string(body))
	return string(ready.Projections)
}

// Two search projections on two different engines at once, from one file:
// books on the stack's engine, blocks on another engine of the matrix
// started beside it (OpenSearch 2 beside Elasticsearch). A leader failover
// mid-stream; then each engine holds its own projection's documents and
// none of the other's, each verifies clean against the model, and wlproj
// verify of blocks reads the second engine from the file.
func TestTwoEnginesAtOnceFromOneProjectionsFile(t *testing.T) {
	t.Parallel()
	second, info := harness.SecondEngine(t, harness.OtherEngine(t))
	require.NotEqual(t, harness.Engine(t).Distribution, info.Distribution, "two different engines")
	c := newCluster(t)
	first := harness.ElasticURL(t)
	file, books, blocks := twoIndexesOn(t, first, second, c.index, false)
	// The chronicle, the file's last projection, into a table of its own.
	c.db.Exec(t, `CREATE TABLE app_timeline (LIKE chronicle_events INCLUDING ALL)`)
	appendFile(t, file, "    table: app_timeline\n")
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	c.run("a", "b")

	c.produceTo("books", "book", 30, 1, 3)
	c.produceTo("blocks", "book", 30, 1, 2)
	c.produceTo("timeline", "book", 5, 1, 2)
	harness.Eventually(t, 60*time.Second, "both projections under way", func() bool {
		return c.count(`projection = 'books' AND status = 'done'`) > 0 && c.count(`projection = 'blocks' AND status = 'done'`) > 0
	})
	c.leader().Kill()
	c.leader()
	c.produceTo("books", "book", 30, 4, 5)
	c.produceTo("blocks", "book", 30, 3, 4)
	harness.Drained(t, c.db.Pool, 90*time.Second)

	harness.VerifiedProjectionOn(t, c.db.Pool, first, books, "books")
	harness.VerifiedProjectionOn(t, c.db.Pool, second, blocks, "blocks")
	for _, place := range []struct{ url, has, lacks string }{{first, books, blocks}, {second, blocks, books}} {
		n, err := harness.DocCount(context.Background(), place.url, place.has)
		require.NoError(t, err)
		require.Equal(t, 30, n, "%s holds %s's documents", place.url, place.has)
		_, err = harness.DocCount(context.Background(), place.url, place.lacks)
		var missing *harness.StatusError
		require.ErrorAs(t, err, &missing, "%s holds no index %s", place.url, place.lacks)
	}
	require.Contains(t, c.cli("verify", "--projections-file", file, "--projection", "blocks"), "clean: the index holds")
	require.Equal(t, 10, c.db.Int(t, `SELECT count(DISTINCT event_id) FROM app_timeline`), "the chronicle in its own table")
	require.Zero(t, c.appended(), "and not in chronicle_events")
}

// appendFile adds text at the end of the file at path.
func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
