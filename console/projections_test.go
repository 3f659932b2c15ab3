package console

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/outbox"
)

// withProjections gives the console a replica's projections and hash as
// the replica passes them: a search projection whose nodes come from an
// ELASTIC_URL with credentials and a key in its query, and a chronicle.
func withProjections(hash string) setupOption {
	return func(_ *Config, d *Deps) {
		d.ProjectionsHash = hash
		d.ProjectionSpecs = []ProjectionInfo{
			{Name: "search", Kind: "search", Alias: "books", SourceTable: "public.books_search",
				Nodes: []string{"https://wlproj:hunter2@es-a:9200", " https://es-b:9200/?api_key=k3y-s3cret"}},
			{Name: "chronicle", Kind: "chronicle", SourceTable: "app.timeline"},
		}
	}
}

// The overview lists how each projection is built, with its engine's nodes
// but none of their credentials, and says whether this replica's
// projections are the leader's: unknown, the same, or different, naming
// both hashes and what to do.
func TestOverviewListsProjectionsAndSaysWhenTheyDiffer(t *testing.T) {
	t.Parallel()
	b := setup(t, withProjections("aaaa1111aaaa1111"))
	c := b.operator(t)

	r := c.get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	for _, secret := range []string{"hunter2", "wlproj:", "k3y-s3cret", "api_key"} {
		require.NotContains(t, r.body, secret)
	}
	require.Contains(t, r.body, `<tr id="spec-search"><td>search</td><td>search</td><td>books</td><td><div>https://es-a:9200</div><div>https://es-b:9200/</div></td>`+"\n"+`<td>public.books_search</td></tr>`)
	require.Contains(t, r.body, `<tr id="spec-chronicle"><td>chronicle</td><td>chronicle</td><td>-</td><td>-</td>`+"\n"+`<td>app.timeline</td></tr>`)
	require.Contains(t, r.body, "This replica's projections hash is <code>aaaa1111aaaa1111</code>; the leader has recorded none")

	b.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'replica-a', 3)`)
	b.db.Exec(t, outbox.RecordProjectionsSQL, "wlproj", 3, "aaaa1111aaaa1111")
	r = c.get(Prefix)
	require.Contains(t, r.body, "run the same projections: this replica <code>aaaa1111aaaa1111</code>, the leader <code>aaaa1111aaaa1111</code>")
	require.NotContains(t, r.body, `id="projections-differ"`)

	b.db.Exec(t, outbox.RecordProjectionsSQL, "wlproj", 3, "bbbb2222bbbb2222")
	r = c.get(Prefix)
	require.Contains(t, r.body, `<strong class="bad" id="projections-differ">This replica's projections differ from the leader's</strong>: this replica <code>aaaa1111aaaa1111</code>, the leader <code>bbbb2222bbbb2222</code>`)
	require.Contains(t, r.body, "<code>wlproj projections list</code> on each replica")

	// A read-only user sees the same.
	r = b.viewer(t).get(Prefix)
	require.Contains(t, r.body, `id="projections-differ"`)
}

// Without a hash (a replica that passes none) the overview compares nothing
// and says nothing about it.
func TestOverviewWithoutProjectionsHashComparesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, `INSERT INTO outbox_leader (name, holder, epoch) VALUES ('wlproj', 'replica-a', 3)`)
	b.db.Exec(t, outbox.RecordProjectionsSQL, "wlproj", 3, "bbbb2222bbbb2222")
	r := b.operator(t).get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.NotContains(t, r.body, `id="projections-hash"`)
	require.Contains(t, r.body, "This replica was given no projections to list.")
}

// The overview says why a projection's events wait, beside how it is built.
func TestOverviewSaysWhyAProjectionWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, withProjections("aaaa1111aaaa1111"), func(_ *Config, d *Deps) {
		d.Waiting = func() map[string]string { return map[string]string{"search": "its index books is not set up yet"} }
	})
	r := b.operator(t).get(Prefix)
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, r.body, `<tr id="spec-search"><td>search<div class="bad" id="waiting-search">its events wait: its index books is not set up yet</div></td>`)
	require.Contains(t, r.body, `<tr id="spec-chronicle"><td>chronicle</td>`)
}
