package classify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testenv"
)

// captured is the format of testdata/es/*.json: one engine response and the
// request that produced it. Files named *.handwritten.json were written by
// hand in the engine's format, for responses the test engine cannot be made
// to give.
type captured struct {
	Comment string            `json:"comment,omitempty"`
	Engine  string            `json:"engine,omitempty"`
	Request string            `json:"request"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body"`
}

func loadCaptured(t *testing.T, name string) captured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "testdata", "es", name))
	require.NoError(t, err)
	var c captured
	require.NoError(t, json.Unmarshal(data, &c), name)
	require.NotZero(t, c.Status, name)
	return c
}

type want struct {
	class  Class
	reason string
	status int
}

func TestCapturedBulkItems(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file string
		want want
	}{
		{"bulk_strict_dynamic_mapping.json", want{Deterministic, MappingError, 400}},
		{"bulk_mapper_parsing_date.json", want{Deterministic, MappingError, 400}},
		{"bulk_mapper_parsing_integer.json", want{Deterministic, MappingError, 400}},
		{"bulk_array_payload.json", want{Deterministic, MappingError, 400}},
		{"bulk_total_fields_limit.json", want{Deterministic, MappingError, 400}},
		// The search handler turns this one into a superseded success before
		// it gets here; on its own it is a client error.
		{"bulk_version_conflict.json", want{Deterministic, ClientError, 409}},
		{"bulk_rejected_execution.handwritten.json", want{Transient, RateLimited, 429}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			item := singleItem(t, loadCaptured(t, tc.file))
			require.NotNil(t, item.Error)
			got := FromBulkItem(item.Status, item.Error.Type, item.Error.Reason)
			require.Equal(t, tc.want.class, got.Class)
			require.Equal(t, tc.want.reason, got.Reason)
			require.Equal(t, tc.want.status, got.Status)
			require.Contains(t, got.Message, item.Error.Type)
		})
	}
}

// A delete of a missing document is a 404 item without an error object; the
// search handler relies on exactly this shape to count it as success.
func TestCapturedDeleteNotFound(t *testing.T) {
	t.Parallel()
	item := singleItem(t, loadCaptured(t, "bulk_delete_not_found.json"))
	require.Equal(t, http.StatusNotFound, item.Status)
	require.Equal(t, "not_found", item.Result)
	require.Nil(t, item.Error)
	got := FromBulkItem(item.Status, "", "")
	require.Equal(t, ClientError, got.Reason)
	require.Equal(t, Deterministic, got.Class)
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

// Whole-request failures go through olivere's own response parsing, as they
// do in the daemon: a test server replays the captured status and body.
func TestCapturedRequestErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file string
		want want
	}{
		{"request_malformed_bulk.json", want{Deterministic, ParseError, 400}},
		{"request_empty_bulk.json", want{Deterministic, ParseError, 400}},
		{"request_illegal_argument_mapping.json", want{Deterministic, MappingError, 400}},
		{"request_illegal_argument_parameter.json", want{Deterministic, ClientError, 400}},
		{"request_validation_negative_version.json", want{Deterministic, ClientError, 400}},
		{"request_index_not_found.json", want{Deterministic, ClientError, 404}},
		{"request_unsupported_content_type.json", want{Deterministic, ClientError, 406}},
		{"request_rejected_execution.handwritten.json", want{Transient, RateLimited, 429}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			c := loadCaptured(t, tc.file)
			err := replay(t, c)
			var ee *elastic.Error
			require.ErrorAs(t, err, &ee)

			got := Classify(err)
			require.Equal(t, tc.want.class, got.Class)
			require.Equal(t, tc.want.reason, got.Reason)
			require.Equal(t, tc.want.status, got.Status)
			if ee.Details != nil {
				require.Contains(t, got.Message, ee.Details.Type)
			}
			require.ErrorIs(t, got, err, "the cause stays reachable")
		})
	}
}

func replay(t *testing.T, c captured) error {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range c.Headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(c.Status)
		_, _ = w.Write(c.Body)
	}))
	t.Cleanup(srv.Close)
	client := newClient(t, srv.URL)
	_, err := client.Bulk().Index("books").
		Add(elastic.NewBulkIndexRequest().Id("book:1").Doc(json.RawMessage(`{"title":"x"}`))).
		Do(context.Background())
	require.Error(t, err)
	return err
}

func newClient(t *testing.T, url string) *elastic.Client {
	t.Helper()
	client, err := elastic.NewClient(elastic.SetURL(url), elastic.SetSniff(false), elastic.SetHealthcheck(false))
	require.NoError(t, err)
	return client
}

func TestFromBulkItem(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status       int
		typ, message string
		want         want
	}{
		{429, "es_rejected_execution_exception", "rejected execution", want{Transient, RateLimited, 429}},
		{0, "es_rejected_execution_exception", "rejected execution", want{Transient, RateLimited, 429}},
		{429, "circuit_breaking_exception", "[parent] Data too large", want{Transient, RateLimited, 429}},
		{503, "unavailable_shards_exception", "primary shard is not active", want{Transient, ServerError, 503}},
		{500, "", "", want{Transient, ServerError, 500}},
		{400, "strict_dynamic_mapping_exception", "mapping set to strict", want{Deterministic, MappingError, 400}},
		{400, "mapper_parsing_exception", "failed to parse", want{Deterministic, MappingError, 400}},
		{400, "illegal_argument_exception", "mapper [title] cannot be changed from type [text] to [long]", want{Deterministic, MappingError, 400}},
		{400, "illegal_argument_exception", "failed to parse field [position] of type [integer]", want{Deterministic, MappingError, 400}},
		{400, "illegal_argument_exception", "Limit of total fields [1000] has been exceeded", want{Deterministic, MappingError, 400}},
		{400, "illegal_argument_exception", "request [/_bulk] contains unrecognized parameter: [x]", want{Deterministic, ClientError, 400}},
		{400, "parse_exception", "request body is required", want{Deterministic, ParseError, 400}},
		{400, "x_content_parse_exception", "[1:2] unknown field", want{Deterministic, ParseError, 400}},
		{400, "json_parse_exception", "Unrecognized token", want{Deterministic, ParseError, 400}},
		{400, "not_x_content_exception", "Compressor detection", want{Deterministic, ParseError, 400}},
		{408, "", "", want{Transient, Timeout, 408}},
		{409, "version_conflict_engine_exception", "version conflict", want{Deterministic, ClientError, 409}},
		{404, "index_not_found_exception", "no such index", want{Deterministic, ClientError, 404}},
		{0, "", "", want{Transient, Unknown, 0}},
		{302, "", "", want{Transient, Unknown, 302}},
	}
	for _, tc := range cases {
		got := FromBulkItem(tc.status, tc.typ, tc.message)
		name := fmt.Sprintf("%d %s %q", tc.status, tc.typ, tc.message)
		require.Equal(t, tc.want.class, got.Class, name)
		require.Equal(t, tc.want.reason, got.Reason, name)
		require.Equal(t, tc.want.status, got.Status, name)
	}
}

func TestClassifyTransportErrors(t *testing.T) {
	t.Parallel()

	t.Run("nil", func(t *testing.T) {
		require.Nil(t, Classify(nil))
	})

	t.Run("classified error passes through", func(t *testing.T) {
		orig := New(PayloadInvalid, "payload is an array")
		got := Classify(fmt.Errorf("event 7: %w", orig))
		require.Same(t, orig, got)
		require.Equal(t, Deterministic, got.Class)
	})

	t.Run("connection refused", func(t *testing.T) {
		url := closedURL(t)
		_, err := http.Get(url)
		require.Error(t, err)
		got := Classify(err)
		require.Equal(t, Connection, got.Reason)
		require.Equal(t, Transient, got.Class)

		// Through olivere: the first request fails to dial and marks the node
		// dead, the next one fails with ErrNoClient without dialling.
		client := newClient(t, url)
		for range 2 {
			_, err := client.Bulk().Index("books").
				Add(elastic.NewBulkDeleteRequest().Id("book:1")).Do(context.Background())
			require.Error(t, err)
			require.Equal(t, Connection, Classify(err).Reason, err.Error())
		}
	})

	t.Run("no client", func(t *testing.T) {
		got := Classify(fmt.Errorf("bulk: %w", elastic.ErrNoClient))
		require.Equal(t, Connection, got.Reason)
	})

	t.Run("connection closed mid-response", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}))
		t.Cleanup(srv.Close)
		_, err := http.Get(srv.URL)
		require.Error(t, err)
		got := Classify(err)
		require.Equal(t, Connection, got.Reason, err.Error())
	})

	t.Run("unexpected EOF", func(t *testing.T) {
		require.Equal(t, Connection, Classify(fmt.Errorf("read body: %w", io.ErrUnexpectedEOF)).Reason)
	})

	t.Run("client timeout", func(t *testing.T) {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		_, err := (&http.Client{Timeout: 50 * time.Millisecond}).Get(srv.URL)
		require.Error(t, err)
		got := Classify(err)
		require.Equal(t, Timeout, got.Reason, err.Error())
		require.Equal(t, Transient, got.Class)
	})

	t.Run("context deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		<-ctx.Done()
		require.Equal(t, Timeout, Classify(fmt.Errorf("bulk: %w", ctx.Err())).Reason)
	})

	t.Run("net timeout", func(t *testing.T) {
		var err net.Error = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		require.Equal(t, Timeout, Classify(err).Reason)
	})

	t.Run("cancelled is unknown and keeps its cause", func(t *testing.T) {
		got := Classify(fmt.Errorf("bulk: %w", context.Canceled))
		require.Equal(t, Unknown, got.Reason)
		require.Equal(t, Transient, got.Class)
		require.ErrorIs(t, got, context.Canceled)
	})

	t.Run("anything else", func(t *testing.T) {
		got := Classify(errors.New("something odd"))
		require.Equal(t, Unknown, got.Reason)
		require.Equal(t, Transient, got.Class)
		require.Equal(t, "unknown: something odd", got.Error())
	})
}

func TestMessageHidesCredentials(t *testing.T) {
	t.Parallel()
	_, err := http.Get("http://elastic:s3cr3t@" + strings.TrimPrefix(closedURL(t), "http://") + "/_bulk")
	require.Error(t, err)
	got := Classify(err)
	require.Equal(t, Connection, got.Reason)
	require.NotContains(t, got.Message, "s3cr3t")
	require.NotContains(t, got.Error(), "s3cr3t")
	require.Contains(t, got.Message, "/_bulk")

	long := New(MappingError, "https://u:p@host/x "+strings.Repeat("é", 2*maxMessage))
	require.NotContains(t, long.Message, "u:p@")
	require.LessOrEqual(t, len(long.Message), maxMessage+len("…"))
	require.True(t, strings.HasSuffix(long.Message, "…"))
}

func TestNewTakesClassFromTable(t *testing.T) {
	t.Parallel()
	require.Equal(t, Deterministic, New(PayloadInvalid, "").Class)
	require.Equal(t, Deterministic, New(UnknownProjection, "").Class)
	require.Equal(t, Transient, New(RateLimited, "").Class)
	require.Equal(t, Transient, New("no_such_reason", "").Class)
	require.Equal(t, "payload_invalid", New(PayloadInvalid, "").Error())
}

// closedURL returns the URL of a port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

// TestCaptureEngineResponses regenerates testdata/es from the real engine.
// Run it with WLPROJ_CAPTURE=1 after an engine upgrade and commit the diff.
func TestCaptureEngineResponses(t *testing.T) {
	if os.Getenv("WLPROJ_CAPTURE") != "1" {
		t.Skip("set WLPROJ_CAPTURE=1 to regenerate testdata/es from the engine")
	}
	base := testenv.ElasticURL(t)
	dir := filepath.Join(testenv.RepoRoot(t), "testdata", "es")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	mapping, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "testdata", "mapping.json"))
	require.NoError(t, err)

	// Fixed names keep the files stable from one capture to the next.
	const books, fields, missing = "wlproj-capture-books", "wlproj-capture-fields", "wlproj-capture-missing"
	do := func(method, path, ctype, body string) (int, []byte) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, data
	}
	status, body := do(http.MethodGet, "/", "", "")
	require.Equal(t, http.StatusOK, status, string(body))
	var root struct {
		Version struct {
			Number string `json:"number"`
		} `json:"version"`
	}
	require.NoError(t, json.Unmarshal(body, &root))
	engine := "elasticsearch " + root.Version.Number

	cleanup := func() { do(http.MethodDelete, "/"+books+","+fields+"?ignore_unavailable=true", "", "") }
	cleanup()
	t.Cleanup(cleanup)

	status, body = do(http.MethodPut, "/"+books, "application/json", string(mapping))
	require.Equal(t, http.StatusOK, status, string(body))
	status, body = do(http.MethodPut, "/"+fields, "application/json",
		`{"settings":{"number_of_shards":1,"number_of_replicas":0,"index.mapping.total_fields.limit":2}}`)
	require.Equal(t, http.StatusOK, status, string(body))
	status, body = do(http.MethodPut, "/"+books+"/_doc/book:3?version=5&version_type=external_gte", "application/json",
		`{"kind":"book","title":"Persuasion"}`)
	require.Equal(t, http.StatusCreated, status, string(body))

	const ndjson = "application/x-ndjson"
	ext := func(op, id string, version int64) string {
		return fmt.Sprintf(`{%q:{"_id":%q,"version":%d,"version_type":"external_gte"}}`, op, id, version) + "\n"
	}
	capture := func(file, method, path, ctype, body string) {
		status, data := do(method, path, ctype, body)
		var buf bytes.Buffer
		if json.Valid(data) {
			require.NoError(t, json.Compact(&buf, data))
		} else {
			b, _ := json.Marshal(string(data))
			buf.Write(b)
		}
		out, err := json.MarshalIndent(captured{Engine: engine, Request: method + " " + path, Status: status, Body: buf.Bytes()}, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), append(out, '\n'), 0o644))
	}

	bulk := "/" + books + "/_bulk"
	capture("bulk_strict_dynamic_mapping.json", http.MethodPost, bulk, ndjson,
		ext("index", "book:1", 1)+`{"kind":"book","title":"Dune","isbn":"9780441013593"}`+"\n")
	capture("bulk_mapper_parsing_date.json", http.MethodPost, bulk, ndjson,
		ext("index", "book:2", 1)+`{"kind":"book","title":"Emma","updated_at":"last tuesday"}`+"\n")
	capture("bulk_mapper_parsing_integer.json", http.MethodPost, bulk, ndjson,
		ext("index", "block:9", 1)+`{"kind":"paragraph","book_id":"2","position":"first"}`+"\n")
	capture("bulk_array_payload.json", http.MethodPost, bulk, ndjson,
		ext("index", "block:10", 1)+`[{"kind":"paragraph"}]`+"\n")
	capture("bulk_version_conflict.json", http.MethodPost, bulk, ndjson,
		ext("index", "book:3", 3)+`{"kind":"book","title":"Persuasion (draft)"}`+"\n")
	capture("bulk_delete_not_found.json", http.MethodPost, bulk, ndjson,
		ext("delete", "book:404", 7))
	capture("bulk_total_fields_limit.json", http.MethodPost, "/"+fields+"/_bulk", ndjson,
		ext("index", "book:5", 1)+`{"kind":"book","title":"Ulysses","author":"Joyce"}`+"\n")

	capture("request_malformed_bulk.json", http.MethodPost, bulk, ndjson, "this is not ndjson\n")
	capture("request_empty_bulk.json", http.MethodPost, bulk, ndjson, "")
	capture("request_illegal_argument_mapping.json", http.MethodPut, "/"+books+"/_mapping", "application/json",
		`{"properties":{"title":{"type":"long"}}}`)
	capture("request_illegal_argument_parameter.json", http.MethodPost, bulk+"?frobnicate=1", ndjson,
		ext("index", "book:6", 1)+`{"kind":"book"}`+"\n")
	capture("request_validation_negative_version.json", http.MethodPost, bulk, ndjson,
		ext("index", "book:7", -1)+`{"kind":"book"}`+"\n")
	capture("request_index_not_found.json", http.MethodGet, "/"+missing+"/_search", "", "")
	capture("request_unsupported_content_type.json", http.MethodPut, "/"+books+"/_doc/book:8", "text/plain", "hello")
}
