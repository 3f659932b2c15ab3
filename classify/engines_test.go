package classify

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

var update = flag.Bool("update", false, "rewrite testdata/<engine>/ from the engine under test (make capture ENGINE=…)")

// captured is the format of testdata/<engine>/*.json: one engine response
// and the request that produced it. Files named *.handwritten.json were
// written by hand in that engine's format, for responses no test engine can
// be made to give on demand; their comment says why.
type captured struct {
	Comment string            `json:"comment,omitempty"`
	Engine  string            `json:"engine,omitempty"`
	Request string            `json:"request"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the response's JSON, or a JSON string for a body that is not
	// JSON.
	Body json.RawMessage `json:"body"`
}

// probe is one engine response the classifier relies on, how to make the
// engine give it, and what every engine's version of it must classify as.
type probe struct {
	// name is the file's name in testdata/<engine>/ without .json or
	// .handwritten.json.
	name string
	// item: the answer is a bulk response with one failed item, classified
	// by FromBulkItem; else a whole-request error, which goes through
	// olivere's response parsing into Classify as in the daemon.
	item bool
	want want
	// The request; in path, {books}, {fields} and {missing} are the
	// capture's indices. No method: hand-written for every engine.
	method, path, ctype, body string
	// breaker: the request is sent with the in-flight requests circuit
	// breaker lowered to 1kb, a node-wide setting, so only a capture makes
	// it, never the live test beside other tests.
	breaker bool
	// secured: sent with a wrong password to a secured node of the engine
	// (harness.StartSecuredNode); Elasticsearch only, OpenSearch's file is
	// hand-written.
	secured bool
}

const ndjson = "application/x-ndjson"

func ext(op, id string, version int64) string {
	return fmt.Sprintf(`{%q:{"_id":%q,"version":%d,"version_type":"external_gte"}}`, op, id, version) + "\n"
}

var probes = []probe{
	{name: "bulk_strict_dynamic_mapping", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:1", 1) + `{"kind":"book","title":"Dune","isbn":"9780441013593"}` + "\n"},
	{name: "bulk_mapper_parsing_date", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:2", 1) + `{"kind":"book","title":"Emma","updated_at":"last tuesday"}` + "\n"},
	{name: "bulk_mapper_parsing_integer", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "block:9", 1) + `{"kind":"paragraph","book_id":"2","position":"first"}` + "\n"},
	{name: "bulk_array_payload", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "block:10", 1) + `[{"kind":"paragraph"}]` + "\n"},
	{name: "bulk_malformed_document", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:12", 1) + `{"title":}` + "\n"},
	{name: "bulk_total_fields_limit", item: true, want: want{Deterministic, MappingError, 400},
		method: http.MethodPost, path: "/{fields}/_bulk", ctype: ndjson,
		body: ext("index", "book:5", 1) + `{"kind":"book","title":"Ulysses","author":"Joyce"}` + "\n"},
	// The search handler turns this one into a superseded success before
	// it gets here (projection's TestItemResultOnCapturedResponses); on its
	// own it is a client error.
	{name: "bulk_version_conflict", item: true, want: want{Deterministic, ClientError, 409},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:3", 3) + `{"kind":"book","title":"Persuasion (draft)"}` + "\n"},
	// A 404 item without an error: TestCapturedDeleteNotFound.
	{name: "bulk_delete_not_found", item: true, want: want{Deterministic, ClientError, 404},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson, body: ext("delete", "book:404", 7)},
	{name: "bulk_rejected_execution", item: true, want: want{Transient, RateLimited, 429}},

	{name: "request_malformed_bulk", want: want{Deterministic, ParseError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson, body: "this is not ndjson\n"},
	{name: "request_empty_bulk", want: want{Deterministic, ParseError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson},
	{name: "request_illegal_argument_mapping", want: want{Deterministic, MappingError, 400},
		method: http.MethodPut, path: "/{books}/_mapping", ctype: "application/json",
		body: `{"properties":{"title":{"type":"long"}}}`},
	{name: "request_illegal_argument_parameter", want: want{Deterministic, ClientError, 400},
		method: http.MethodPost, path: "/{books}/_bulk?frobnicate=1", ctype: ndjson,
		body: ext("index", "book:6", 1) + `{"kind":"book"}` + "\n"},
	{name: "request_validation_negative_version", want: want{Deterministic, ClientError, 400},
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:7", -1) + `{"kind":"book"}` + "\n"},
	{name: "request_index_not_found", want: want{Deterministic, ClientError, 404},
		method: http.MethodGet, path: "/{missing}/_search"},
	{name: "request_unsupported_content_type", want: want{Deterministic, ClientError, 406},
		method: http.MethodPut, path: "/{books}/_doc/book:8", ctype: "text/plain", body: "hello"},
	{name: "request_circuit_breaking", want: want{Transient, RateLimited, 429}, breaker: true,
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:9", 1) + `{"kind":"book","body":"` + strings.Repeat("lorem ipsum ", 300) + `"}` + "\n"},
	{name: "request_rejected_execution", want: want{Transient, RateLimited, 429}},
	{name: "request_unauthorized", want: want{Transient, AuthError, 401}, secured: true,
		method: http.MethodPost, path: "/{books}/_bulk", ctype: ndjson,
		body: ext("index", "book:10", 1) + `{"kind":"book"}` + "\n"},
}

// captureEngines are the engines testdata holds captures of: every
// directory of testdata but the loose files.
func captureEngines(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(harness.Root(t), "testdata"))
	require.NoError(t, err)
	var engines []string
	for _, e := range entries {
		if e.IsDir() && strings.Contains(e.Name(), "-") {
			engines = append(engines, e.Name())
		}
	}
	require.NotEmpty(t, engines)
	return engines
}

// load reads an engine's file of a probe: captured, or else hand-written.
func (p probe) load(t *testing.T, engine string) (captured, string) {
	t.Helper()
	dir := filepath.Join(harness.Root(t), "testdata", engine)
	for _, file := range []string{p.name + ".json", p.name + ".handwritten.json"} {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		require.NoError(t, err)
		var c captured
		require.NoError(t, json.Unmarshal(data, &c), file)
		require.NotZero(t, c.Status, file)
		return c, file
	}
	t.Fatalf("testdata/%s has no %s.json nor %s.handwritten.json", engine, p.name, p.name)
	return captured{}, ""
}

// check classifies c as the daemon would and returns the error type the
// engine gave ("" if none).
func (p probe) check(t *testing.T, c captured) string {
	t.Helper()
	if p.item {
		item := singleItem(t, c)
		if p.name == "bulk_delete_not_found" {
			require.Nil(t, item.Error)
			got := FromBulkItem(item.Status, "", "")
			require.Equal(t, p.want, want{got.Class, got.Reason, got.Status})
			return ""
		}
		require.NotNil(t, item.Error)
		got := FromBulkItem(item.Status, item.Error.Type, item.Error.Reason)
		require.Equal(t, p.want, want{got.Class, got.Reason, got.Status}, "%s: %s", item.Error.Type, item.Error.Reason)
		require.Contains(t, got.Message, item.Error.Type)
		return item.Error.Type
	}
	err := replay(t, c)
	var ee *elastic.Error
	require.ErrorAs(t, err, &ee)
	got := Classify(err)
	require.Equal(t, p.want, want{got.Class, got.Reason, got.Status}, "%v", err)
	require.ErrorIs(t, got, err, "the cause stays reachable")
	if ee.Details == nil {
		return ""
	}
	require.Contains(t, got.Message, ee.Details.Type)
	return ee.Details.Type
}

// Every engine's version of every response the classifier relies on gives
// the same class, reason and status, whatever the engine calls it.
func TestCapturedResponses(t *testing.T) {
	t.Parallel()
	for _, engine := range captureEngines(t) {
		for _, p := range probes {
			t.Run(engine+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				c, _ := p.load(t, engine)
				p.check(t, c)
			})
		}
	}
}

// A delete of a missing document is a 404 item without an error object on
// every engine; the search handler relies on exactly this shape to count it
// as success.
func TestCapturedDeleteNotFound(t *testing.T) {
	t.Parallel()
	p := probes[slices.IndexFunc(probes, func(p probe) bool { return p.name == "bulk_delete_not_found" })]
	for _, engine := range captureEngines(t) {
		c, _ := p.load(t, engine)
		item := singleItem(t, c)
		require.Equal(t, http.StatusNotFound, item.Status, engine)
		require.Equal(t, "not_found", item.Result, engine)
		require.Nil(t, item.Error, engine)
	}
}

func singleItem(t *testing.T, c captured) *elastic.BulkResponseItem {
	t.Helper()
	require.Equal(t, http.StatusOK, c.Status)
	var resp elastic.BulkResponse
	require.NoError(t, json.Unmarshal(c.Body, &resp))
	require.True(t, resp.Errors || len(resp.Items) == 1)
	require.Len(t, resp.Items, 1)
	for _, item := range resp.Items[0] {
		return item
	}
	t.Fatal("empty bulk item")
	return nil
}

// replay has a test server answer a bulk request with the captured status,
// headers and body, through olivere's response parsing as in the daemon.
func replay(t *testing.T, c captured) error {
	t.Helper()
	body, ctype := []byte(c.Body), "application/json; charset=UTF-8"
	var text string
	if json.Unmarshal(c.Body, &text) == nil {
		body, ctype = []byte(text), "text/plain; charset=UTF-8"
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range c.Headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(c.Status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	client := newClient(t, srv.URL)
	_, err := client.Bulk().Index("books").
		Add(elastic.NewBulkIndexRequest().Id("book:1").Doc(json.RawMessage(`{"title":"x"}`))).
		Do(context.Background())
	require.Error(t, err)
	return err
}

// TestEngineResponses sends every probe to the engine under test and checks
// that its answer classifies as wanted and still has the status and error
// type of the engine's captured file. With -update it rewrites
// testdata/<engine>/ instead (make capture ENGINE=…): fixed index names keep
// the files stable from one capture to the next, and the probes that change
// a node-wide setting or need a secured node run too.
func TestEngineResponses(t *testing.T) {
	engine := harness.Engine(t)
	base := harness.ElasticURL(t)
	dir := filepath.Join(harness.Root(t), "testdata", engine.Name)
	names := map[string]string{"{books}": "wlproj-capture-books", "{fields}": "wlproj-capture-fields", "{missing}": "wlproj-capture-missing"}
	if !*update {
		t.Parallel()
		for k, v := range names {
			names[k] = harness.UniqueName(v + "-")
		}
	}
	expand := func(path string) string {
		for k, v := range names {
			path = strings.ReplaceAll(path, k, v)
		}
		return path
	}
	do := func(client *http.Client, base, user, password, method, path, ctype, body string) captured {
		t.Helper()
		req, err := http.NewRequest(method, base+expand(path), strings.NewReader(body))
		require.NoError(t, err)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		c := captured{Engine: engine.Distribution + " " + engine.Version, Request: method + " " + expand(path), Status: resp.StatusCode}
		var buf bytes.Buffer
		if json.Valid(data) {
			require.NoError(t, json.Compact(&buf, data))
		} else {
			b, _ := json.Marshal(string(data))
			buf.Write(b)
		}
		c.Body = buf.Bytes()
		for _, h := range []string{"Retry-After", "WWW-Authenticate"} {
			if v := resp.Header.Get(h); v != "" {
				c.Headers = map[string]string{h: v}
			}
		}
		return c
	}
	admin := func(method, path, body string) {
		t.Helper()
		require.NoError(t, harness.ES(context.Background(), base, method, expand(path), []byte(body), nil))
	}

	cleanup := func() { _ = harness.DeleteIndex(context.Background(), base, names["{books}"], names["{fields}"]) }
	cleanup()
	t.Cleanup(cleanup)
	require.NoError(t, harness.CreateIndex(context.Background(), base, names["{books}"]))
	admin(http.MethodPut, "/{fields}", `{"settings":{"number_of_shards":1,"number_of_replicas":0,"index.mapping.total_fields.limit":2}}`)
	admin(http.MethodPut, "/{books}/_doc/book:3?version=5&version_type=external_gte", `{"kind":"book","title":"Persuasion"}`)

	var secured *harness.SecuredNode
	const user, wrongPassword = "wlproj", "not-the-password"
	securedClient := http.DefaultClient
	if *update && engine.Distribution == "elasticsearch" {
		ca, err := harness.NewCA("wlproj capture CA")
		require.NoError(t, err)
		secured = harness.SecuredEngine(t, harness.SecuredConfig{CA: ca, User: user, Password: harness.UniqueName("pw-")})
		securedClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	}

	if *update {
		require.NoError(t, os.MkdirAll(dir, 0o755))
	}
	for _, p := range probes {
		live := p.method != "" && !p.breaker && !p.secured
		capture := *update && p.method != "" && (!p.secured || secured != nil)
		if !live && !capture {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			var c captured
			switch {
			case p.secured:
				c = do(securedClient, secured.URL, user, wrongPassword, p.method, p.path, p.ctype, p.body)
			case p.breaker:
				// Deferred, so that a failed request cannot leave the node
				// refusing every other one.
				defer admin(http.MethodPut, "/_cluster/settings", `{"transient":{"network.breaker.inflight_requests.limit":null}}`)
				admin(http.MethodPut, "/_cluster/settings", `{"transient":{"network.breaker.inflight_requests.limit":"1kb"}}`)
				c = do(http.DefaultClient, base, "", "", p.method, p.path, p.ctype, p.body)
			default:
				c = do(http.DefaultClient, base, "", "", p.method, p.path, p.ctype, p.body)
			}
			typ := p.check(t, c)
			if *update {
				var out bytes.Buffer
				enc := json.NewEncoder(&out)
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "  ")
				require.NoError(t, enc.Encode(c))
				require.NoError(t, os.WriteFile(filepath.Join(dir, p.name+".json"), out.Bytes(), 0o644))
				return
			}
			stored, file := p.load(t, engine.Name)
			require.Equal(t, stored.Status, c.Status, "status differs from testdata/%s/%s: make capture ENGINE=%s", engine.Name, file, engine.Name)
			require.Equal(t, p.check(t, stored), typ, "error type differs from testdata/%s/%s: make capture ENGINE=%s", engine.Name, file, engine.Name)
		})
	}
}
