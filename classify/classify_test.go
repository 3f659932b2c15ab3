package classify

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/olivere/elastic/v7"
	"github.com/stretchr/testify/require"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

type want struct {
	class  Class
	reason string
	status int
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
		{0, "rejected_execution_exception", "rejected execution", want{Transient, RateLimited, 429}},
		{401, "security_exception", "unable to authenticate user [wlproj]", want{Transient, AuthError, 401}},
		{401, "", "", want{Transient, AuthError, 401}},
		{403, "security_exception", "action [indices:data/write/bulk] is unauthorized", want{Transient, AuthError, 403}},
		{403, "cluster_block_exception", "index [books] blocked by: [FORBIDDEN/8/index write (api)]", want{Deterministic, ClientError, 403}},
		{400, "document_parsing_exception", "[1:46] failed to parse field [position]", want{Deterministic, MappingError, 400}},
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

	t.Run("certificate from another CA", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		_, err := http.Get(srv.URL)
		require.Error(t, err)
		got := Classify(err)
		require.Equal(t, TLSError, got.Reason, err.Error())
		require.Equal(t, Transient, got.Class)
		require.Contains(t, got.Message, "certificate")
	})

	t.Run("https to a plain-http port", func(t *testing.T) {
		srv := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(srv.Close)
		_, err := http.Get(strings.Replace(srv.URL, "http://", "https://", 1))
		require.Error(t, err)
		require.Equal(t, TLSError, Classify(err).Reason, err.Error())
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
	return "http://127.0.0.1:" + strconv.Itoa(harness.Port(t))
}
