package e2e

// A search projection whose engine is away when its leader starts: its
// index must still be made from its mapping file, behind its alias, once
// the engine is back, and its events must wait for that, not be sent (the
// engine would create a concrete index with a dynamic mapping at the
// alias's name) nor retried into exhaustion.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/faultproxy"
	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// strictBooks writes a projections file of one search projection, books,
// on the engine at engineURL, with a strict mapping file (isbn a keyword,
// title text, nothing else), and returns the file and books' alias.
func strictBooks(t *testing.T, engineURL, index string) (file, alias string) {
	dir := t.TempDir()
	alias = index + "-books"
	mapping := `{"mappings": {"dynamic": "strict", "properties": {"isbn": {"type": "keyword"}, "title": {"type": "text"}}}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "books.json"), []byte(mapping), 0o600))
	file = filepath.Join(dir, "projections.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`
projections:
  books:
    kind: search
    engine: {urls: [%s]}
    index: %s
    mapping_file: %s/books.json
`, engineURL, alias, dir)), 0o600))
	t.Cleanup(func() { _ = harness.DeleteIndex(context.Background(), harness.ElasticURL(t), alias+"*") })
	return file, alias
}

// The engine refuses every connection when the only replica starts and
// leads, for longer than the replica's first attempts to reach it; the
// events produced meanwhile wait, and /readyz says why. Once the engine is
// back, books' name is an alias on an index made from the mapping file
// (strict, isbn a keyword), and every event is delivered at its first
// attempt.
func TestProjectionWhoseEngineComesLateGetsItsMappedAlias(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	file, alias := strictBooks(t, c.proxy.URL(), c.index)
	c.env = append(c.env, "OUTBOX_PROJECTIONS_FILE="+file)
	c.proxy.Set(faultproxy.Fault{Refuse: true})
	leader := c.run("a")
	c.produceTo("books", "book", 20, 1, 3)

	// The outage outlasts the replica's first looks at the engine and
	// several of the events' retry delays (0.2 to 1 s here).
	time.Sleep(5 * time.Second)
	_, readyDuringOutage, err := leader.Get("/readyz")
	require.NoError(t, err)
	require.Equal(t, 60, c.count(`projection = 'books' AND status <> 'done' AND status <> 'failed'`), "books' events wait")
	c.proxy.Clear()
	back := time.Now()
	harness.Drained(t, c.db.Pool, 60*time.Second)
	t.Logf("drained %s after the engine came back", time.Since(back).Round(time.Millisecond))

	var aliases map[string]any
	require.NoError(t, harness.ES(context.Background(), harness.ElasticURL(t), http.MethodGet, "/_alias/"+alias, nil, &aliases),
		"books' name is an alias")
	require.Len(t, aliases, 1, "on one index")
	for index := range aliases {
		require.True(t, strings.HasPrefix(index, alias+"-"), "%s: the index made for the alias", index)
	}
	var mapping map[string]struct {
		Mappings struct {
			Dynamic string `json:"dynamic"`
		} `json:"mappings"`
	}
	require.NoError(t, harness.ES(context.Background(), harness.ElasticURL(t), http.MethodGet, "/"+alias+"/_mapping", nil, &mapping))
	for index, m := range mapping {
		require.Equal(t, "strict", m.Mappings.Dynamic, "%s has the mapping file's strict mapping", index)
	}
	requireKeyword(t, alias, "isbn")
	require.Zero(t, c.count(`status = 'failed'`))
	require.Zero(t, c.count(`attempts > 0`), "no event was sent while the engine was away, nor retried")
	harness.VerifiedProjection(t, c.db.Pool, alias, "books")
	require.Contains(t, string(readyDuringOutage), `"waiting":[{"projection":"books","why":`,
		"/readyz said books' events wait, and why")
}
