package replica

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/projection"
	"github.com/wlproj/wlproj/verify"
)

// writeFile writes body to a file in a fresh directory and returns its path.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

const secret = "s3cret-never-shown"

func env(name string) string {
	return map[string]string{"BOOKS_PASSWORD": secret, "EMPTY": ""}[name]
}

func TestLoadProjectionsReadsTwoIndexesAndTheChronicle(t *testing.T) {
	mapping := writeFile(t, "blocks.json", `{"mappings": {"properties": {"title": {"type": "text"}}}}`)
	key := writeFile(t, "key", "id:"+secret+"\n")
	path := writeFile(t, "projections.yaml", `
projections:
  books:
    kind: search
    engine:
      urls: [http://127.0.0.1:9200, http://127.0.0.1:9201]
      username: wlproj
      password_env: BOOKS_PASSWORD
    index: books
    source_table: app.books_search
  blocks:
    kind: search
    engine: {urls: ["http://127.0.0.1:9300"], api_key_file: `+key+`, timeout: 45s}
    index: blocks
    mapping_file: `+mapping+`
    max_payload_bytes: 2048
    bulk: {actions: 250, bytes: 4194304, concurrency: 2}
  timeline:
    kind: chronicle
    table: app.timeline
`)
	specs, err := LoadProjections(path, env)
	require.NoError(t, err)
	require.Equal(t, []string{"blocks", "books", "timeline"}, specs.Names())
	books := specs[0].Search
	require.Equal(t, "http://127.0.0.1:9200,http://127.0.0.1:9201", books.Engine.URL)
	require.Equal(t, secret, books.Engine.Password, "resolved from the environment")
	require.Equal(t, "env BOOKS_PASSWORD", books.PasswordFrom)
	require.Equal(t, "app.books_search", books.SourceTable)
	blocks := specs[1].Search
	require.Equal(t, "id:"+secret, blocks.Engine.APIKey, "read from the file, trimmed")
	require.Equal(t, 2048, blocks.MaxPayloadBytes)
	require.Equal(t, 45*time.Second, blocks.Timeout)
	require.Equal(t, 45*time.Second, blocks.Engine.Timeout)
	require.Zero(t, books.Timeout, "ELASTIC_TIMEOUT_SECONDS then")
	require.Equal(t, BulkSpec{Actions: 250, Bytes: 4 << 20, Concurrency: 2}, blocks.Bulk)
	require.Zero(t, books.Bulk, "the defaults then")
	require.Equal(t, "app.timeline", specs[2].Chronicle.TableName())
	name, ok := specs.Chronicle()
	require.True(t, ok)
	require.Equal(t, "timeline", name)

	listed, err := json.Marshal(specs)
	require.NoError(t, err)
	require.NotContains(t, string(listed), secret, "a listing never shows a secret")
	require.Len(t, specs.Hash(), 16)

	t.Setenv("UNUSED", "") // the hash follows the file, not the run
	again, err := LoadProjections(path, env)
	require.NoError(t, err)
	require.Equal(t, specs.Hash(), again.Hash())
	specs[0].Search.Index = "books-2"
	require.NotEqual(t, specs.Hash(), again.Hash(), "another alias is another set")
}

// Every bad file is refused with the file, the line, the projection and
// the key named, and no secret shown.
func TestLoadProjectionsRefusesBadFiles(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"not yaml", "projections: [", "is not YAML"},
		{"empty", "", "is empty"},
		{"no projections", "projections: {}\n", "projections: must map each projection's name"},
		{"unknown top key", "projection:\n  a: {kind: chronicle}\n", `:1: projection: unknown key (known here: projections)`},
		{"bad name", "projections:\n  Books: {kind: chronicle}\n", `:2: projection "Books": is not a projection name`},
		{"unknown kind", "projections:\n  books:\n    kind: graph\n", `:3: projection "books": kind: unknown kind "graph" (known: chronicle, search)`},
		{"no kind", "projections:\n  books:\n    index: books\n", `projection "books": kind: is required`},
		{"misspelt key", "projections:\n  books:\n    kind: search\n    indx: books\n    engine: {urls: [http://e:9200]}\n",
			`:4: projection "books": indx: unknown key (known here: kind, engine, index`},
		{"no index", "projections:\n  books:\n    kind: search\n    engine: {urls: [http://e:9200]}\n", `projection "books": index: is required`},
		{"bad index", "projections:\n  books:\n    kind: search\n    engine: {urls: [http://e:9200]}\n    index: Books\n",
			`:5: projection "books": index: "Books" is not an index name`},
		{"no engine", "projections:\n  books:\n    kind: search\n    index: books\n", `projection "books": engine: is required`},
		{"inline password", "projections:\n  books:\n    kind: search\n    index: books\n    engine:\n      urls: [http://e:9200]\n      password: " + secret + "\n",
			`:7: projection "books": engine.password: a secret is never written in the file: use password_env`},
		{"credentials in url", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: ['http://u:" + secret + "@e:9200']}\n",
			`:5: projection "books": engine.urls[0]: carries credentials`},
		{"unset env", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200], password_env: EMPTY}\n",
			`projection "books": engine.password_env: the environment variable EMPTY is not set or empty`},
		{"missing mapping", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    mapping_file: /nonexistent/m.json\n",
			`:6: projection "books": mapping_file: /nonexistent/m.json cannot be read: no such file or directory`},
		{"bad table", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    source_table: 'books; drop'\n",
			`projection "books": source_table: "books; drop" is not a table name`},
		{"one alias twice", "projections:\n  a:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n  b:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200/]}\n",
			`:8: projection "b": index: "books" on http://e:9200/ is projection "a"'s alias too`},
		// One engine however its URL is written: the scheme and host in any
		// case, the scheme's default port given or not, localhost or a
		// loopback address, one node in common between two lists.
		{"one alias, URL in capitals", twoOnOneAlias("http://127.0.0.1:9200", "HTTP://127.0.0.1:9200"),
			`:8: projection "b": index: "books" on HTTP://127.0.0.1:9200 is projection "a"'s alias too`},
		{"one alias, host in capitals", twoOnOneAlias("http://localhost:9200", "http://LocalHost:9200"), `projection "a"'s alias too`},
		{"one alias, default port", twoOnOneAlias("http://es:80", "http://es"), `projection "a"'s alias too`},
		{"one alias, https default port", twoOnOneAlias("https://es", "https://ES:443/"), `projection "a"'s alias too`},
		{"one alias, localhost and loopback", twoOnOneAlias("http://localhost:9200", "http://127.0.0.1:9200"), `projection "a"'s alias too`},
		{"one alias, IPv6 loopback", twoOnOneAlias("'http://[::1]:9200'", "http://127.0.0.1:9200"), `projection "a"'s alias too`},
		{"one alias, a node in common", twoOnOneAlias("http://es1:9200, http://es2:9200", "http://es3:9200, http://ES2:9200"), `projection "a"'s alias too`},
		{"bad timeout", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200], timeout: fast}\n",
			`:5: projection "books": engine.timeout: "fast" is not a duration such as 30s`},
		{"timeout out of range", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200], timeout: 1h}\n",
			`:5: projection "books": engine.timeout: `},
		{"bulk unknown key", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    bulk: {size: 10}\n",
			`:6: projection "books": bulk.size: unknown key (known here: actions, bytes, concurrency)`},
		{"bulk concurrency out of range", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    bulk: {concurrency: 64}\n",
			`:6: projection "books": bulk.concurrency: `},
		{"bulk bytes not a number", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    bulk:\n      bytes: 8MiB\n",
			`:7: projection "books": bulk.bytes: must be a whole number`},
		{"bad chronicle table", "projections:\n  timeline:\n    kind: chronicle\n    table: 'Timeline'\n",
			`:4: projection "timeline": table: "Timeline" is not a table name`},
		{"chronicle key of search", "projections:\n  timeline:\n    kind: chronicle\n    index: books\n",
			`:4: projection "timeline": index: unknown key (known here: kind, table, mask)`},
		{"mask not a list", "projections:\n  timeline:\n    kind: chronicle\n    mask: email\n",
			`:4: projection "timeline": mask: must list the paths of the fields to mask`},
		{"mask empty", "projections:\n  timeline:\n    kind: chronicle\n    mask: []\n", `:4: projection "timeline": mask: must list`},
		{"mask bad path", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200]}\n    mask: [email, 'address..city']\n",
			`:6: projection "books": mask: mask path "address..city" has an empty segment`},
		{"two chronicles", "projections:\n  a: {kind: chronicle}\n  b: {kind: chronicle}\n", `:3: projection "b": kind: a second chronicle`},
		{"name twice", "projections:\n  a: {kind: chronicle}\n  a: {kind: chronicle}\n", `projection "a": is configured twice`},
		{"both auths", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200], username: u, password_env: BOOKS_PASSWORD, api_key_env: BOOKS_PASSWORD}\n",
			`projection "books": engine: `},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, "p.yaml", c.body)
			_, err := LoadProjections(path, env)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
			require.True(t, strings.HasPrefix(err.Error(), path), "names the file first: %s", err)
			require.NotContains(t, err.Error(), secret)
		})
	}
	_, err := LoadProjections(filepath.Join(t.TempDir(), "missing.yaml"), env)
	require.ErrorContains(t, err, "missing.yaml: cannot be read: no such file or directory")
}

// Without a file, ELASTIC_* describe the search projection beside the
// chronicle, as before the file existed; a listing says where the
// password comes from, not what it is.
func TestDefaultSpecsAreTodaysTwoProjections(t *testing.T) {
	specs := DefaultSpecs(Config{Elastic: projection.ElasticOptions{URL: "http://u:" + secret + "@a:9200,http://b:9200", Username: "u", Password: secret},
		Index: "books", Verify: verify.ServiceConfig{SourceTable: "search_index"}})
	require.Equal(t, []string{"chronicle", "search"}, specs.Names())
	s := specs[0].Search
	require.Equal(t, []string{"http://a:9200", "http://b:9200"}, s.URLs, "ELASTIC_URL's nodes, without its credentials")
	require.Equal(t, "books", s.Index)
	require.Equal(t, "search_index", s.SourceTable, "OUTBOX_VERIFY_FROM_TABLE")
	require.Equal(t, "env ELASTIC_PASSWORD", s.PasswordFrom)
	require.Equal(t, secret, s.Engine.Password, "the client still gets it")
	listed, err := json.Marshal(specs)
	require.NoError(t, err)
	require.NotContains(t, string(listed), secret)
	require.Equal(t, projection.IndexDefault, DefaultSpecs(Config{})[0].Search.Index)
}

// The names alone are read without the engines' secrets.
func TestLoadProjectionNamesNeedsNoSecret(t *testing.T) {
	path := writeFile(t, "p.yaml", "projections:\n  books:\n    kind: search\n    index: books\n    engine: {urls: [http://e:9200], username: u, password_env: UNSET_HERE}\n")
	names, err := LoadProjectionNames(path)
	require.NoError(t, err)
	require.Equal(t, []string{"books"}, names)
	_, err = LoadProjections(path, env)
	require.ErrorContains(t, err, "UNSET_HERE is not set or empty")
}

// twoOnOneAlias is a projections file of a and b, both search projections
// writing the alias books, a on the nodes aURLs and b on bURLs (comma
// separated).
func twoOnOneAlias(aURLs, bURLs string) string {
	return "projections:\n  a:\n    kind: search\n    index: books\n    engine: {urls: [" + aURLs + "]}\n" +
		"  b:\n    kind: search\n    index: books\n    engine: {urls: [" + bURLs + "]}\n"
}

// One alias on two engines is two indexes: another host, another port, or
// another path prefix (a gateway in front of two clusters). A host name is
// not resolved: it may name another address tomorrow, and only localhost
// is known to be the loopback.
func TestLoadProjectionsTakesOneAliasOnTwoEngines(t *testing.T) {
	for _, urls := range [][2]string{{"http://es1:9200", "http://es2:9200"}, {"http://es:9200", "http://es:9201"},
		{"http://es", "https://es"}, {"http://gw/one", "http://gw/two"}, {"http://es.internal:9200", "http://10.0.0.5:9200"}} {
		path := writeFile(t, "p.yaml", twoOnOneAlias(urls[0], urls[1]))
		_, err := LoadProjections(path, env)
		require.NoError(t, err, "%s and %s", urls[0], urls[1])
	}
}

func TestLoadProjectionsReadsMasks(t *testing.T) {
	path := writeFile(t, "projections.yaml", `
projections:
  books:
    kind: search
    engine: {urls: [http://127.0.0.1:9200]}
    index: books
    mask: [email, "address.*"]
  timeline:
    kind: chronicle
    mask: [email]
  plain:
    kind: search
    engine: {urls: [http://127.0.0.1:9200]}
    index: plain
`)
	specs, err := LoadProjectionsUnresolved(path)
	require.NoError(t, err)
	require.Equal(t, []string{"email", "address.*"}, specs[0].Mask)
	masks := specs.Masks()
	require.Len(t, masks, 2, "a projection without mask: has none")
	out, err := masks["books"].Payload([]byte(`{"email":"a@b","address":{"city":"Lyon"},"title":"t"}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"email":"***","address":{"city":"***"},"title":"t"}`, string(out))
	require.Equal(t, []string{"email"}, masks["timeline"].Paths())
}
