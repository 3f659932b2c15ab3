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
// own index of the cluster's engine (books with a mapping file, blocks
// sent in bulks of 7 documents, 3 at once), and the
// chronicle as timeline; books' source table is booksSource, if any. It
// returns the file and the two indexes.
func twoIndexes(t *testing.T, engineURL, index, booksSource string) (file, books, blocks string) {
	return twoIndexesOn(t, engineURL, engineURL, index, booksSource)
}

// twoIndexesOn is twoIndexes with books on the engine at booksURL and
// blocks on the one at blocksURL.
func twoIndexesOn(t *testing.T, booksURL, blocksURL, index, booksSource string) (file, books, blocks string) {
	dir := t.TempDir()
	books, blocks = index+"-books", index+"-blocks"
	mapping := filepath.Join(dir, "books.json")
	require.NoError(t, os.WriteFile(mapping, []byte(`{"mappings": {"properties": {"isbn": {"type": "keyword"}}}}`), 0o600))
	file = filepath.Join(dir, "projections.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
projections:
  books:
    kind: search
    engine: {urls: [%[1]s]}
    index: %[2]s
    mapping_file: %[4]s
    %[5]s
  blocks:
    kind: search
    engine: {urls: [%[6]s]}
    index: %[3]s
    bulk: {actions: 7, concurrency: 3}
  timeline:
    kind: chronicle
`, booksURL, books, blocks, mapping, sourceLine(booksSource), blocksURL)), 0o600))
	t.Cleanup(func() {
		for _, url := range []string{booksURL, blocksURL} {
			_ = harness.DeleteIndex(context.Background(), url, books+"*", blocks+"*")
		}
	})
	return file, books, blocks
}

func sourceLine(table string) string {
	if table == "" {
		return ""
	}
	return "source_table: " + table
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
	file, books, blocks := twoIndexes(t, harness.ElasticURL(t), c.index, "")
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

	out := c.cli("pause", "--projections-file", file, "--projection", "books", "--by", "e2e", "--why", "reindex books")
	require.Contains(t, out, "paused books")
	c.produceTo("books", "book", 30, 4, 8)
	c.produceTo("blocks", "book", 30, 3, 6)
	harness.Eventually(t, 60*time.Second, "blocks drains while books waits", func() bool {
		return c.count(`projection = 'blocks' AND status <> 'done'`) == 0
	})
	require.Equal(t, 150, c.count(`projection = 'books' AND status <> 'done'`), "no book of the second wave was sent")
	c.leader().Kill()
	c.leader()
	c.cli("resume", "--projections-file", file, "--projection", "books", "--by", "e2e", "--why", "reindexed")
	harness.Drained(t, c.db.Pool, 60*time.Second)
	harness.VerifiedProjection(t, c.db.Pool, books, "books")
	harness.VerifiedProjection(t, c.db.Pool, blocks, "blocks")
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

// rebuild and verify of one search projection of the file take its
// engine, alias and source table from the file: books is rebuilt from its
// table behind its alias while blocks keeps its index, and each verifies
// clean against its own truth.
func TestProjectionsFileRebuildsAndVerifiesOne(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	file, books, blocks := twoIndexes(t, harness.ElasticURL(t), c.index, "books_source")
	c.db.Exec(t, `CREATE TABLE books_source (entity_type text NOT NULL, entity_id text NOT NULL, doc jsonb NOT NULL,
		version bigint NOT NULL, PRIMARY KEY (entity_type, entity_id))`)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	c.run("a", "b")
	c.produceTo("books", "book", 20, 1, 3)
	c.produceTo("blocks", "book", 20, 1, 2)
	harness.Drained(t, c.db.Pool, 60*time.Second)
	c.db.Exec(t, `INSERT INTO books_source SELECT 'book', g::text, jsonb_build_object('title', 'book ' || g || ' v3', 'isbn', 'i-' || g), 3
		FROM generate_series(1, 20) g`)
	blocksBefore := concreteIndexes(t, blocks)

	out := c.cli("rebuild", "--projections-file", file, "--projection", "books", "--by", "e2e", "--why", "new mapping", "--progress", "json")
	require.Contains(t, out, "swapped")
	require.NotEqual(t, concreteIndexes(t, books), blocksBefore)
	require.Equal(t, blocksBefore, concreteIndexes(t, blocks), "blocks' index untouched")
	c.cli("verify", "--projections-file", file, "--projection", "books")
	c.cli("verify", "--projections-file", file, "--projection", "blocks")
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
	file, books, _ := twoIndexes(t, harness.ElasticURL(t), c.index, "")
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
func TestProjectionsOnTwoEngines(t *testing.T) {
	t.Parallel()
	second, info := harness.SecondEngine(t, harness.OtherEngine(t))
	require.NotEqual(t, harness.Engine(t).Distribution, info.Distribution, "two different engines")
	c := newCluster(t)
	first := harness.ElasticURL(t)
	file, books, blocks := twoIndexesOn(t, first, second, c.index, "")
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
