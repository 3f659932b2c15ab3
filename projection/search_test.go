package projection

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/classify"
	"github.com/wlproj/wlproj/internal/testkit/harness"
	"github.com/wlproj/wlproj/outbox"
)

type bundle struct {
	base   string
	index  string
	client *elastic.Client
	search *Search
}

// setup creates the test's own index with the demo's strict mapping.
func setup(t *testing.T) bundle {
	t.Helper()
	b := bundle{base: harness.ElasticURL(t), index: harness.NewIndexName(t)}
	mapping, err := os.ReadFile(filepath.Join(harness.Root(t), "testdata", "mapping.json"))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPut, b.base+"/"+b.index, bytes.NewReader(mapping))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

	b.client, err = NewElasticClient(ElasticOptions{URL: b.base})
	require.NoError(t, err)
	b.search, err = NewSearch(SearchConfig{Client: b.client, Index: b.index})
	require.NoError(t, err)
	return b
}

// searchAt is a handler for b's index that talks to url instead.
func (b bundle) searchAt(t *testing.T, o ElasticOptions, maxPayload int) *Search {
	t.Helper()
	client, err := NewElasticClient(o)
	require.NoError(t, err)
	s, err := NewSearch(SearchConfig{Client: client, Index: b.index, MaxPayloadBytes: maxPayload})
	require.NoError(t, err)
	return s
}

// doc returns the stored document, or nil when there is none.
func (b bundle) doc(t *testing.T, id string) *elastic.GetResult {
	t.Helper()
	res, err := b.client.Get().Index(b.index).Id(id).Do(context.Background())
	if elastic.IsNotFound(err) {
		return nil
	}
	require.NoError(t, err)
	return res
}

func (b bundle) requireDoc(t *testing.T, id string, version int64, title string) {
	t.Helper()
	res := b.doc(t, id)
	require.NotNil(t, res, "document %s", id)
	require.NotNil(t, res.Version)
	require.Equal(t, version, *res.Version, "_version of %s", id)
	if title != "" {
		var src struct{ Title string }
		require.NoError(t, json.Unmarshal(res.Source, &src))
		require.Equal(t, title, src.Title, "title of %s", id)
	}
}

func v(n int64) *int64 { return &n }

func upsert(id int64, typ, entity string, version *int64, payload string) outbox.Event {
	return outbox.Event{ID: id, Projection: "search", EntityType: typ, EntityID: entity,
		Op: outbox.OpUpsert, EventVersion: version, Payload: json.RawMessage(payload)}
}

func del(id int64, typ, entity string, version *int64) outbox.Event {
	return outbox.Event{ID: id, Projection: "search", EntityType: typ, EntityID: entity,
		Op: outbox.OpDelete, EventVersion: version, Payload: json.RawMessage(`{}`)}
}

func book(title string) string {
	return fmt.Sprintf(`{"kind":"book","title":%q,"library_id":"lib-1","bookshelf_id":"shelf-1","tags":["novel"],"updated_at":"2024-05-01T10:00:00Z"}`, title)
}

func block(bookID string, pos int, body string) string {
	return fmt.Sprintf(`{"kind":"paragraph","book_id":%q,"position":%d,"body":%q}`, bookID, pos, body)
}

// handle runs the handler and checks the contract every call must keep:
// exactly one result per event, for that event's id.
func handle(t *testing.T, s *Search, events ...outbox.Event) map[int64]Result {
	t.Helper()
	return handleCtx(t, context.Background(), s, events...)
}

func handleCtx(t *testing.T, ctx context.Context, s *Search, events ...outbox.Event) map[int64]Result {
	t.Helper()
	results := s.Handle(ctx, events)
	require.Len(t, results, len(events))
	byID := make(map[int64]Result, len(results))
	for _, r := range results {
		byID[r.ID] = r
	}
	for _, ev := range events {
		_, ok := byID[ev.ID]
		require.True(t, ok, "no result for event %d", ev.ID)
	}
	return byID
}

func requireApplied(t *testing.T, r Result) {
	t.Helper()
	require.NoError(t, r.Err, "event %d", r.ID)
	require.False(t, r.Superseded, "event %d", r.ID)
}

func requireSuperseded(t *testing.T, r Result) {
	t.Helper()
	require.NoError(t, r.Err, "event %d", r.ID)
	require.True(t, r.Superseded, "event %d", r.ID)
}

func requireFailed(t *testing.T, r Result, class classify.Class, reason string) *classify.Error {
	t.Helper()
	require.Error(t, r.Err, "event %d", r.ID)
	require.False(t, r.Superseded, "event %d", r.ID)
	ce := classify.Classify(r.Err)
	require.Equal(t, reason, ce.Reason, "event %d: %v", r.ID, r.Err)
	require.Equal(t, class, ce.Class, "event %d", r.ID)
	return ce
}

func TestSearchOlderVersionIsSuperseded(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res := handle(t, b.search, upsert(1, "book", "1", v(5), book("Emma, 2nd edition")))
	requireApplied(t, res[1])
	b.requireDoc(t, "book:1", 5, "Emma, 2nd edition")

	res = handle(t, b.search, upsert(2, "book", "1", v(3), book("Emma")))
	requireSuperseded(t, res[2])
	b.requireDoc(t, "book:1", 5, "Emma, 2nd edition")

	// A retry of the event already applied is not a conflict under
	// external_gte.
	res = handle(t, b.search, upsert(1, "book", "1", v(5), book("Emma, 2nd edition")))
	requireApplied(t, res[1])
	b.requireDoc(t, "book:1", 5, "Emma, 2nd edition")

	// Without event_version the outbox id is the version.
	res = handle(t, b.search, upsert(9, "book", "1", nil, book("Emma, 3rd edition")))
	requireApplied(t, res[9])
	b.requireDoc(t, "book:1", 9, "Emma, 3rd edition")
}

func TestSearchDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res := handle(t, b.search, upsert(1, "book", "1", v(1), book("Dune")))
	requireApplied(t, res[1])

	res = handle(t, b.search, del(2, "book", "1", v(2)))
	requireApplied(t, res[2])
	require.Nil(t, b.doc(t, "book:1"))

	// The document is gone: the engine answers 404, which is success.
	res = handle(t, b.search, del(3, "book", "1", v(3)), del(4, "book", "never-existed", v(1)))
	requireApplied(t, res[3])
	requireApplied(t, res[4])

	// The delete's version stays as a tombstone, so a late older upsert does
	// not bring the document back.
	res = handle(t, b.search, upsert(5, "book", "1", v(2), book("Dune (late)")))
	requireSuperseded(t, res[5])
	require.Nil(t, b.doc(t, "book:1"))

	// A delete older than the document is superseded too.
	res = handle(t, b.search, upsert(6, "book", "2", v(10), book("Emma")))
	requireApplied(t, res[6])
	res = handle(t, b.search, del(7, "book", "2", v(4)))
	requireSuperseded(t, res[7])
	b.requireDoc(t, "book:2", 10, "Emma")
}

func TestSearchCoalescesWithinBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, nil)
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)

	res := handle(t, s,
		upsert(10, "book", "1", v(1), book("A")),
		upsert(11, "book", "1", v(3), book("C")),
		upsert(12, "book", "1", v(2), book("B")),
		// A reused version: the first outbox row keeps it, the second fails.
		upsert(13, "book", "2", v(4), book("X")),
		upsert(14, "book", "2", v(4), book("Y")),
		// Without event_version the outbox id orders them; a delete can win.
		upsert(15, "block", "7", nil, block("1", 1, "Call me Ishmael.")),
		del(16, "block", "7", nil),
		del(17, "book", "3", v(9)),
		upsert(18, "book", "3", v(2), book("Z")),
	)
	for _, id := range []int64{11, 13, 16, 17} {
		requireApplied(t, res[id])
	}
	for _, id := range []int64{10, 12, 15, 18} {
		requireSuperseded(t, res[id])
	}
	requireFailed(t, res[14], classify.Deterministic, classify.VersionReused)

	require.Equal(t, []sentAction{
		{"index", "book:1", 3},
		{"index", "book:2", 4},
		{"delete", "block:7", 16},
		{"delete", "book:3", 9},
	}, f.actions(t))
	b.requireDoc(t, "book:1", 3, "C")
	b.requireDoc(t, "book:2", 4, "X")
	require.Nil(t, b.doc(t, "block:7"))
	require.Nil(t, b.doc(t, "book:3"))
}

// The review's reproduction: book 1 at v1, then a delete v2 and an upsert
// v3 the strict mapping refuses, in one batch. Coalescing to v3 alone left
// the book at v1 with v2 marked superseded: a deleted book stayed
// searchable. The newest applicable event is the delete.
func TestSearchRefusedNewestFallsBackToTheNextEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	refused := `{"kind":"book","title":"Emma","isbn":"9780141439587"}`
	requireApplied(t, handle(t, b.search, upsert(1, "book", "1", v(1), book("Dune")))[1])
	requireApplied(t, handle(t, b.search, upsert(2, "book", "2", v(1), book("Emma")))[2])

	res := handle(t, b.search,
		del(3, "book", "1", v(2)),
		upsert(4, "book", "1", v(3), refused),
		upsert(5, "book", "2", v(2), book("Emma, revised")),
		upsert(6, "book", "2", v(3), refused),
		upsert(7, "book", "2", v(4), refused),
	)
	requireFailed(t, res[4], classify.Deterministic, classify.MappingError)
	requireApplied(t, res[3])
	require.Nil(t, b.doc(t, "book:1"), "the delete is the newest event that could be applied")

	requireFailed(t, res[6], classify.Deterministic, classify.MappingError)
	requireFailed(t, res[7], classify.Deterministic, classify.MappingError)
	requireApplied(t, res[5])
	b.requireDoc(t, "book:2", 2, "Emma, revised")
}

// A transient failure of the newest event leaves the older ones to retry
// with it: none is marked superseded, so none is acked done unapplied.
func TestSearchTransientNewestKeepsOlderEventsPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, func(n int, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)
	res := handle(t, s, del(1, "book", "1", v(2)), upsert(2, "book", "1", v(3), book("Dune")))
	requireFailed(t, res[2], classify.Transient, classify.ServerError)
	ce := requireFailed(t, res[1], classify.Transient, classify.ServerError)
	require.Contains(t, ce.Message, "retried with newer event 2")
	require.Equal(t, 1, f.requests(), "one request: the older event is not sent to an engine that just failed")
}

func TestSearchMappingErrorFailsOnlyThatItem(t *testing.T) {
	t.Parallel()
	b := setup(t)

	res := handle(t, b.search,
		upsert(1, "book", "1", v(1), book("Dune")),
		upsert(2, "book", "2", v(1), `{"kind":"book","title":"Emma","isbn":"9780141439587"}`),
		upsert(3, "block", "1", v(1), `{"kind":"paragraph","book_id":"1","position":"first"}`),
		upsert(4, "block", "2", v(1), block("1", 2, "A beginning is the time...")),
		upsert(5, "book", "3", v(1), `{"kind":"book","title":"Ulysses","updated_at":"last tuesday"}`),
	)
	requireApplied(t, res[1])
	requireApplied(t, res[4])
	for _, id := range []int64{2, 3, 5} {
		ce := requireFailed(t, res[id], classify.Deterministic, classify.MappingError)
		require.Equal(t, http.StatusBadRequest, ce.Status)
	}
	require.Contains(t, res[2].Err.Error(), "strict_dynamic_mapping_exception")
	// Elasticsearch 8 calls it document_parsing_exception.
	require.Regexp(t, "(mapper|document)_parsing_exception", res[3].Err.Error())

	b.requireDoc(t, "book:1", 1, "Dune")
	b.requireDoc(t, "block:2", 1, "")
	require.Nil(t, b.doc(t, "book:2"))
	require.Nil(t, b.doc(t, "block:1"))
	require.Nil(t, b.doc(t, "book:3"))
}

func TestSearchPayloadInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, nil)
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 200)

	pretty := "{\n  \"kind\": \"book\",\n  \"title\": \"Middlemarch\"\n}\n"
	res := handle(t, s,
		upsert(1, "book", "1", v(1), `[{"title":"Dune"}]`),
		upsert(2, "book", "2", v(1), `"Dune"`),
		upsert(3, "book", "3", v(1), `null`),
		upsert(4, "book", "4", v(1), `42`),
		upsert(5, "book", "5", v(1), book(strings.Repeat("long ", 50))),
		upsert(6, "book", "", v(1), book("no id")),
		upsert(7, "book", "7", v(-1), book("negative")),
		upsert(8, "book", strings.Repeat("x", 600), v(1), book("long id")),
		outbox.Event{ID: 9, EntityType: "book", EntityID: "9", Op: "merge", Payload: json.RawMessage(`{}`)},
		upsert(10, "book", "10", v(1), book("Valid")),
		// A newer but invalid event does not supersede the valid one.
		upsert(11, "book", "10", v(2), `[]`),
		upsert(12, "book", "12", v(1), `{"title":`),
		// Malformed inside: the engine refuses this item alone.
		upsert(16, "book", "16", v(1), `{"title":}`),
		// A delete's payload is not sent, whatever it holds.
		outbox.Event{ID: 13, EntityType: "book", EntityID: "13", Op: outbox.OpDelete, EventVersion: v(1), Payload: json.RawMessage(`[1,2]`)},
		// Line breaks in a payload would break the bulk body's format.
		upsert(14, "book", "14", v(1), pretty),
		del(15, "book", "", v(1)),
	)
	for _, id := range []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 15} {
		requireFailed(t, res[id], classify.Deterministic, classify.PayloadInvalid)
	}
	require.Contains(t, res[1].Err.Error(), "array")
	require.Contains(t, res[2].Err.Error(), "string")
	require.Contains(t, res[5].Err.Error(), "limit is 200")
	requireApplied(t, res[10])
	requireApplied(t, res[13])
	requireApplied(t, res[14])
	requireFailed(t, res[16], classify.Deterministic, classify.MappingError)

	require.Equal(t, []sentAction{
		{"index", "book:10", 1},
		{"index", "book:16", 1},
		{"delete", "book:13", 1},
		{"index", "book:14", 1},
	}, f.actions(t))
	b.requireDoc(t, "book:10", 1, "Valid")
	b.requireDoc(t, "book:14", 1, "Middlemarch")
}

func TestSearchConnectionRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr := closedAddr(t)
	s := b.searchAt(t, ElasticOptions{URL: "http://elastic:s3cr3t@" + addr}, 0)

	events := []outbox.Event{
		upsert(1, "book", "1", v(1), book("Dune")),
		del(2, "book", "2", v(1)),
		upsert(3, "block", "1", v(1), block("1", 1, "x")),
		upsert(4, "book", "4", v(1), `[]`),
	}
	// Twice: after the first failure olivere counts the node as dead, and
	// the second call must still be a real attempt with the same outcome.
	for range 2 {
		res := handle(t, s, events...)
		for _, id := range []int64{1, 2, 3} {
			ce := requireFailed(t, res[id], classify.Transient, classify.Connection)
			require.NotContains(t, ce.Error(), "s3cr3t")
		}
		requireFailed(t, res[4], classify.Deterministic, classify.PayloadInvalid)
	}
}

func TestSearchNextCallAfterConnectionErrorReachesEngine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n > 1 {
			return false
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return true
	})
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)

	res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireFailed(t, res[1], classify.Transient, classify.Connection)

	res = handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireApplied(t, res[1])
	require.Equal(t, 2, f.requests())
	b.requireDoc(t, "book:1", 1, "Dune")
}

func TestSearchRateLimitedHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var body struct {
		Body json.RawMessage `json:"body"`
	}
	data, err := os.ReadFile(filepath.Join(harness.Root(t), "testdata", harness.Engine(t).Name, "request_rejected_execution.handwritten.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &body))

	at := time.Now().Add(40 * time.Second).UTC().Format(http.TimeFormat)
	headers := []string{"7", at, ""}
	f := newFront(t, b.base, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n > len(headers) {
			return false
		}
		if h := headers[n-1]; h != "" {
			w.Header().Set("Retry-After", h)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(body.Body)
		return true
	})
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)
	events := []outbox.Event{upsert(1, "book", "1", v(1), book("Dune")), del(2, "book", "2", v(1))}

	res := handle(t, s, events...)
	for _, id := range []int64{1, 2} {
		ce := requireFailed(t, res[id], classify.Transient, classify.RateLimited)
		require.Equal(t, 7*time.Second, ce.RetryAfter)
		require.Equal(t, http.StatusTooManyRequests, ce.Status)
		require.Contains(t, ce.Message, "rejected_execution_exception")
	}

	res = handle(t, s, events...)
	ce := requireFailed(t, res[1], classify.Transient, classify.RateLimited)
	require.InDelta(t, 40*time.Second, ce.RetryAfter, float64(3*time.Second))

	res = handle(t, s, events...)
	ce = requireFailed(t, res[1], classify.Transient, classify.RateLimited)
	require.Zero(t, ce.RetryAfter)

	res = handle(t, s, events...)
	requireApplied(t, res[1])
	requireApplied(t, res[2])
	b.requireDoc(t, "book:1", 1, "Dune")
}

func TestSearchServerError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, func(n int, w http.ResponseWriter, r *http.Request) bool {
		// What a load balancer says when the engine behind it is down.
		http.Error(w, "503 Service Unavailable", http.StatusServiceUnavailable)
		return true
	})
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)
	res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")), del(2, "book", "2", v(1)))
	for _, id := range []int64{1, 2} {
		ce := requireFailed(t, res[id], classify.Transient, classify.ServerError)
		require.Equal(t, http.StatusServiceUnavailable, ce.Status)
	}
}

func TestSearchTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, func(n int, w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return true
	})

	s := b.searchAt(t, ElasticOptions{URL: f.URL, Timeout: 100 * time.Millisecond}, 0)
	res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireFailed(t, res[1], classify.Transient, classify.Timeout)

	s = b.searchAt(t, ElasticOptions{URL: f.URL}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	res = handleCtx(t, ctx, s, upsert(1, "book", "1", v(1), book("Dune")))
	requireFailed(t, res[1], classify.Transient, classify.Timeout)
}

func TestSearchSplitsLargeBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newFront(t, b.base, nil)
	s := b.searchAt(t, ElasticOptions{URL: f.URL}, 0)
	s.bulkBytes = 600

	var events []outbox.Event
	for i := int64(1); i <= 10; i++ {
		events = append(events, upsert(i, "book", fmt.Sprint(i), v(1), book(strings.Repeat("word ", 20))))
	}
	res := handle(t, s, events...)
	for _, ev := range events {
		requireApplied(t, res[ev.ID])
	}
	require.Greater(t, f.requests(), 2)
	require.Len(t, f.actions(t), 10)
	for _, ev := range events {
		b.requireDoc(t, DocumentID(ev.EntityType, ev.EntityID), 1, "")
	}
}

// The item outcomes the handler special-cases, on responses captured from
// every tested engine (see classify's tests): a version conflict and a
// delete of a missing document are successes on all of them.
func TestItemResultOnCapturedResponses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file       string
		op         string
		superseded bool
		reason     string
	}{
		{"bulk_delete_not_found.json", outbox.OpDelete, false, ""},
		{"bulk_version_conflict.json", outbox.OpUpsert, true, ""},
		{"bulk_strict_dynamic_mapping.json", outbox.OpUpsert, false, classify.MappingError},
		{"bulk_mapper_parsing_date.json", outbox.OpUpsert, false, classify.MappingError},
		{"bulk_malformed_document.json", outbox.OpUpsert, false, classify.MappingError},
		{"bulk_rejected_execution.handwritten.json", outbox.OpUpsert, false, classify.RateLimited},
	}
	for _, engine := range TestedEngines {
		for _, tc := range cases {
			t.Run(engine.Line+"/"+tc.file, func(t *testing.T) {
				data, err := os.ReadFile(filepath.Join(harness.Root(t), "testdata", engine.Line, tc.file))
				require.NoError(t, err)
				var c struct {
					Body bulkReply `json:"body"`
				}
				require.NoError(t, json.Unmarshal(data, &c))
				require.Len(t, c.Body.Items, 1)
				require.NotNil(t, c.Body.Items[0].status(), "the item's answer is read under its action's name")

				r := itemResult(outbox.Event{ID: 42, Op: tc.op}, c.Body.Items[0].status())
				require.Equal(t, int64(42), r.ID)
				require.Equal(t, tc.superseded, r.Superseded)
				if tc.reason == "" {
					require.NoError(t, r.Err)
					return
				}
				require.Equal(t, tc.reason, classify.Classify(r.Err).Reason)
			})
		}
	}

	// Only a delete may miss its document.
	r := itemResult(outbox.Event{ID: 1, Op: outbox.OpUpsert}, &bulkItemStatus{Status: 404})
	require.Equal(t, classify.ClientError, classify.Classify(r.Err).Reason)
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"-3":                            0,
		"7":                             7 * time.Second,
		" 120 ":                         2 * time.Minute,
		"99999999999999999":             classify.RetryAfterMax,
		"Sun, 01 Jun 2025 12:00:30 GMT": 30 * time.Second,
		"Sun, 01 Jun 2025 11:00:00 GMT": 0,
		"Mon, 01 Jun 2026 12:00:00 GMT": classify.RetryAfterMax,
		"soon":                          0,
	}
	for in, want := range cases {
		require.Equal(t, want, parseRetryAfter(in, now), "%q", in)
	}
}

func TestNewElasticClient(t *testing.T) {
	t.Parallel()

	t.Run("credentials from the URL become basic auth", func(t *testing.T) {
		var mu sync.Mutex
		var user, pass string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			user, pass, _ = r.BasicAuth()
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"took":1,"errors":false,"items":[{"index":{"_id":"book:1","_version":1,"status":201}}]}`)
		}))
		t.Cleanup(srv.Close)
		u, _ := url.Parse(srv.URL)
		u.User = url.UserPassword("elastic", "s3cr3t")
		client, err := NewElasticClient(ElasticOptions{URL: u.String()})
		require.NoError(t, err)
		s, err := NewSearch(SearchConfig{Client: client, Index: "books"})
		require.NoError(t, err)
		res := handle(t, s, upsert(1, "book", "1", v(1), book("Dune")))
		requireApplied(t, res[1])
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, "elastic", user)
		require.Equal(t, "s3cr3t", pass)
	})

	t.Run("CA file", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"took":1,"errors":false,"items":[{"index":{"_id":"book:1","_version":1,"status":201}}]}`)
		}))
		t.Cleanup(srv.Close)
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		require.NoError(t, os.WriteFile(caFile,
			pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

		trusted := searchFor(t, ElasticOptions{URL: srv.URL, CAFile: caFile})
		requireApplied(t, handle(t, trusted, upsert(1, "book", "1", v(1), book("Dune")))[1])

		untrusted := searchFor(t, ElasticOptions{URL: srv.URL})
		require.Error(t, handle(t, untrusted, upsert(1, "book", "1", v(1), book("Dune")))[1].Err)

		_, err := NewElasticClient(ElasticOptions{URL: srv.URL, CAFile: filepath.Join(t.TempDir(), "missing.pem")})
		require.Error(t, err)
	})

	t.Run("bad options", func(t *testing.T) {
		_, err := NewElasticClient(ElasticOptions{})
		require.ErrorContains(t, err, "URL ")
		_, err = NewElasticClient(ElasticOptions{URL: "http://elastic:s3cr3t@host:9200/%zz"})
		require.ErrorContains(t, err, "URL ")
		require.NotContains(t, err.Error(), "s3cr3t")
		_, err = NewElasticClient(ElasticOptions{URL: "localhost:9200"})
		require.Error(t, err)
		_, err = NewElasticClient(ElasticOptions{URL: "http://localhost:9200", Timeout: -time.Second})
		require.Error(t, err)
	})
}

func TestNewSearchValidates(t *testing.T) {
	t.Parallel()
	client, err := NewElasticClient(ElasticOptions{URL: "http://127.0.0.1:9200"})
	require.NoError(t, err)
	_, err = NewSearch(SearchConfig{Index: "books"})
	require.Error(t, err)
	_, err = NewSearch(SearchConfig{Client: client})
	require.ErrorContains(t, err, "Index ")
	_, err = NewSearch(SearchConfig{Client: client, Index: "Books"})
	require.ErrorContains(t, err, "Index ")
	_, err = NewSearch(SearchConfig{Client: client, Index: "books", MaxPayloadBytes: -1})
	require.Error(t, err)
	s, err := NewSearch(SearchConfig{Client: client, Index: "books"})
	require.NoError(t, err)
	require.Equal(t, MaxPayloadBytesDefault, s.maxPayloadBytes)
}

func searchFor(t *testing.T, o ElasticOptions) *Search {
	t.Helper()
	client, err := NewElasticClient(o)
	require.NoError(t, err)
	s, err := NewSearch(SearchConfig{Client: client, Index: "books"})
	require.NoError(t, err)
	return s
}

// front is a test server in front of the real engine. It records every
// request and lets a test answer some of them itself.
type front struct {
	URL    string
	mu     sync.Mutex
	bodies []string
}

// newFront forwards to target; intercept, if not nil, sees the request
// number (from 1) and answers the request itself when it returns true.
func newFront(t *testing.T, target string, intercept func(n int, w http.ResponseWriter, r *http.Request) bool) *front {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	f := &front{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.bodies = append(f.bodies, string(body))
		n := len(f.bodies)
		f.mu.Unlock()
		if intercept != nil && intercept(n, w, r) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

func (f *front) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

type sentAction struct {
	Op      string
	ID      string
	Version int64
}

// actions parses the bulk bodies sent so far into their action lines.
func (f *front) actions(t *testing.T) []sentAction {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sentAction
	for _, body := range f.bodies {
		sc := bufio.NewScanner(strings.NewReader(body))
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var action map[string]struct {
				ID          string `json:"_id"`
				Version     int64  `json:"version"`
				VersionType string `json:"version_type"`
			}
			require.NoError(t, json.Unmarshal(sc.Bytes(), &action), sc.Text())
			require.Len(t, action, 1)
			for op, meta := range action {
				require.Equal(t, "external_gte", meta.VersionType)
				out = append(out, sentAction{op, meta.ID, meta.Version})
				if op == "index" {
					require.True(t, sc.Scan(), "index action without a source line")
					// One whole object a line (a payload's line breaks are gone).
					line := sc.Bytes()
					require.True(t, bytes.HasPrefix(line, []byte("{")) && bytes.HasSuffix(line, []byte("}")), "%s", line)
				}
			}
		}
		require.NoError(t, sc.Err())
	}
	return out
}

// closedAddr returns an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(harness.Port(t))
}

// rebuildAt is a RebuildTarget that always names index, or fails.
type rebuildAt struct {
	index string
	err   error
}

func (r rebuildAt) RebuildIndex(context.Context) (string, error) { return r.index, r.err }

// TestSearchDualWritesWhileARebuildIsOpen: every bulk reaches the rebuild's
// index before the alias; an event counts as applied only when both took
// it; a refusal by the new index alone fails the event, naming that index,
// and leaves the alias untouched.
func TestSearchDualWritesWhileARebuildIsOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	target := setup(t)
	b.search.DualWriteTo(rebuildAt{index: target.index})
	res := handle(t, b.search, upsert(1, "book", "1", v(2), book("Dune")), del(2, "book", "2", v(3)))
	requireApplied(t, res[1])
	requireApplied(t, res[2])
	b.requireDoc(t, "book:1", 2, "Dune")
	target.requireDoc(t, "book:1", 2, "Dune")

	// The new index already holds a newer version (loaded from the SoT):
	// applied in the alias, so not superseded as a whole.
	handle(t, target.search, upsert(3, "book", "3", v(9), book("new")))
	requireApplied(t, handle(t, b.search, upsert(4, "book", "3", v(5), book("old")))[4])
	target.requireDoc(t, "book:3", 9, "new")
	b.requireDoc(t, "book:3", 5, "old")
	requireSuperseded(t, handle(t, b.search, upsert(5, "book", "1", v(1), book("older")))[5])

	// A new mapping that refuses a field the old one takes.
	strict := harness.NewIndexName(t)
	require.NoError(t, harness.ES(context.Background(), b.base, http.MethodPut, "/"+strict,
		[]byte(`{"mappings": {"dynamic": "strict", "properties": {"kind": {"type": "keyword"}}}}`), nil))
	b.search.DualWriteTo(rebuildAt{index: strict})
	ce := requireFailed(t, handle(t, b.search, upsert(6, "book", "6", v(1), book("x")))[6], classify.Deterministic, classify.MappingError)
	require.Contains(t, ce.Message, "rebuild index "+strict+": ")
	require.Nil(t, b.doc(t, "book:6"), "the alias gets nothing the new index refused")

	// The rebuild's index is the handler's own once the alias moved.
	b.search.DualWriteTo(rebuildAt{index: b.index})
	requireApplied(t, handle(t, b.search, upsert(7, "book", "7", v(1), book("y")))[7])

	// Not knowing whether a rebuild is open fails the batch, transiently.
	b.search.DualWriteTo(rebuildAt{err: errors.New("connection refused")})
	res = handle(t, b.search, upsert(8, "book", "8", v(1), book("z")), upsert(9, "book", "9", v(1), book("z")))
	for _, id := range []int64{8, 9} {
		ce := requireFailed(t, res[id], classify.Transient, classify.Unknown)
		require.Contains(t, ce.Message, "reading the open rebuild: connection refused")
	}
	require.Nil(t, b.doc(t, "book:8"))
}

func TestDocumentIDIsOneEntitysAlone(t *testing.T) {
	t.Parallel()
	require.Equal(t, "book:1", DocumentID("book", "1"), "a plain type keeps the id earlier versions wrote")
	entities := [][2]string{{"crm", "contact:42"}, {"crm:contact", "42"}, {"crm:", "contact:42"}, {"a%3A", "b"},
		{"a:", "b"}, {"%", "1"}, {"%25", "1"}, {"x", ":"}, {"book", "1"}}
	seen := map[string][2]string{}
	for _, e := range entities {
		id := DocumentID(e[0], e[1])
		require.NotContains(t, seen, id, "%v and %v share the id %q", seen[id], e, id)
		seen[id] = e
		gotType, gotID, ok := ParseDocumentID(id)
		require.True(t, ok, id)
		require.Equal(t, e, [2]string{gotType, gotID}, id)
	}
}

// ('crm', 'contact:42') and ('crm:contact', '42') are two documents:
// deleting one leaves the other.
func TestSearchTypeWithAColonIsADocumentOfItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := handle(t, b.search, upsert(1, "crm", "contact:42", v(1), book("Ada")), upsert(2, "crm:contact", "42", v(1), book("Bea")))
	requireApplied(t, res[1])
	requireApplied(t, res[2])
	res = handle(t, b.search, del(3, "crm:contact", "42", v(2)))
	requireApplied(t, res[3])
	require.Nil(t, b.doc(t, DocumentID("crm:contact", "42")))
	b.requireDoc(t, DocumentID("crm", "contact:42"), 1, "Ada")
}

// A repair and the producer's event of one version: the repair goes first,
// and when the engine refuses it for good the producer's event is applied
// in its place, not left done and never written.
func TestSearchRefusedRepairFallsBackToTheProducersEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	producer := upsert(1, "book", "5", v(5), book("Dune"))
	repair := upsert(2, "book", "5", v(5), `{"kind":"book","title":"Dune","isbn":"refused by the strict mapping"}`)
	repair.Repair = true
	res := handle(t, b.search, producer, repair)
	requireFailed(t, res[2], classify.Deterministic, "mapping_error")
	requireApplied(t, res[1])
	b.requireDoc(t, "book:5", 5, "Dune")

	// Applied, the repair rewrites the version and the producer's event is
	// superseded.
	producer.ID, repair.ID, repair.Payload = 3, 4, json.RawMessage(book("Dune, repaired"))
	producer.EventVersion, repair.EventVersion = v(6), v(6)
	res = handle(t, b.search, producer, repair)
	requireApplied(t, res[4])
	requireSuperseded(t, res[3])
	b.requireDoc(t, "book:5", 6, "Dune, repaired")
}

// Two repairs of one version (the source row changed without a version
// bump): the second is sent when the engine refuses the first.
func TestSearchRefusedRepairFallsBackToTheNextRepair(t *testing.T) {
	t.Parallel()
	b := setup(t)
	refused := upsert(1, "book", "7", v(3), `{"kind":"book","title":"Emma","isbn":"refused by the strict mapping"}`)
	fits := upsert(2, "book", "7", v(3), book("Emma"))
	refused.Repair, fits.Repair = true, true
	res := handle(t, b.search, refused, fits)
	requireFailed(t, res[1], classify.Deterministic, "mapping_error")
	requireApplied(t, res[2])
	b.requireDoc(t, "book:7", 3, "Emma")
}

// bulkCounter is a front for the engine that counts the _bulk requests and
// the most in flight at once, holding each for hold so that those sent
// together overlap.
type bulkCounter struct {
	URL                   string
	hold                  time.Duration
	inFlight, most, bulks atomic.Int32
}

func newBulkCounter(t *testing.T, target string, hold time.Duration) *bulkCounter {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	c := &bulkCounter{hold: hold}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_bulk") {
			c.bulks.Add(1)
			n := c.inFlight.Add(1)
			defer c.inFlight.Add(-1)
			for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
			}
			time.Sleep(c.hold)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// A projection's sending settings: BulkActions splits a batch into
// requests of that many documents, sent one after the other by default
// and BulkConcurrency at once when set; every document lands either way.
func TestSearchBulkSettingsSplitAndOverlapRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct{ concurrency, most int32 }{{0, 1}, {3, 3}} {
		front := newBulkCounter(t, b.base, time.Second)
		client, err := NewElasticClient(ElasticOptions{URL: front.URL})
		require.NoError(t, err)
		s, err := NewSearch(SearchConfig{Client: client, Index: b.index, BulkActions: 2, BulkConcurrency: int(c.concurrency)})
		require.NoError(t, err)
		version := int64(c.concurrency + 1)
		var events []outbox.Event
		for i := int64(1); i <= 10; i++ {
			events = append(events, upsert(i, "book", fmt.Sprint(i), v(version), book(fmt.Sprint("title ", i))))
		}
		res := handle(t, s, events...)
		for _, ev := range events {
			requireApplied(t, res[ev.ID])
			b.requireDoc(t, DocumentID(ev.EntityType, ev.EntityID), version, "")
		}
		require.EqualValues(t, 5, front.bulks.Load(), "ten documents, two a request")
		require.Equal(t, c.most, front.most.Load(), "requests in flight at once with BulkConcurrency %d", c.concurrency)
	}
	_, err := NewSearch(SearchConfig{Client: b.client, Index: b.index, BulkConcurrency: 17})
	require.ErrorContains(t, err, "BulkConcurrency")
}
