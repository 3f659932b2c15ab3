package e2e

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/wlproj/wlproj/internal/testkit/harness"
)

// receiver is a small OTLP trace receiver: what it was sent, by resource.
type receiver struct {
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	resource map[string]string
	span     *tracepb.Span
}

func (r *receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{resource: res, span: s})
			}
		}
	}
}

func (r *receiver) received() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

// startHTTPReceiver serves OTLP/HTTP with protobuf bodies, as
// OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf sends them.
func startHTTPReceiver(t *testing.T) (*receiver, string) {
	r := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(req.Body)
		var export coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &export)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&export)
		resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

type grpcTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *receiver
}

func (s grpcTraceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startGRPCReceiver serves OTLP/gRPC, plaintext on loopback.
func startGRPCReceiver(t *testing.T) (*receiver, string) {
	r := &receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, grpcTraceService{r: r})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, "http://" + lis.Addr().String()
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}

func intAttr(t *testing.T, s *tracepb.Span, key string) int64 {
	t.Helper()
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetIntValue()
		}
	}
	t.Fatalf("span %s has no attribute %s", s.GetName(), key)
	return 0
}

// A replica exports a span per batch, with the claim, the bulk and the ack
// as children and the counts as attributes, linked to the trace a producer
// wrote in outbox_events.traceparent; over OTLP/HTTP and OTLP/gRPC, with
// the service name and resource attributes from the environment. A
// state-changing command exports its own span.
func TestTracesOfABatchReachAnOTLPReceiver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		protocol string
		start    func(*testing.T) (*receiver, string)
	}{
		{"http/protobuf", startHTTPReceiver},
		{"grpc", startGRPCReceiver},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			t.Parallel()
			recv, endpoint := tc.start(t)
			otelEnv := []string{
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
				"OTEL_EXPORTER_OTLP_PROTOCOL=" + tc.protocol,
				"OTEL_SERVICE_NAME=wlproj-e2e",
				"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=e2e",
				"OTEL_BSP_SCHEDULE_DELAY=100",
			}
			c := newCluster(t, otelEnv...)
			c.run("a")

			const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			c.db.Exec(t, `
				INSERT INTO outbox_events (entity_type, entity_id, op, event_version, payload, traceparent)
				SELECT 'book', g::text, 'upsert', 1, jsonb_build_object('title', 'Book ' || g),
				       CASE WHEN g = 3 THEN '00-`+producerTrace+`-`+producerSpan+`-01' END
				  FROM generate_series(1, 5) g`)
			linkedID := int64(c.db.Int(t, `SELECT id FROM outbox_events WHERE traceparent IS NOT NULL`))
			c.drained(30 * time.Second)

			// The batch that took the producer's event links to its trace.
			var batch receivedSpan
			harness.Eventually(t, 20*time.Second, "a batch span linked to the producer's trace", func() bool {
				for _, s := range recv.received() {
					for _, l := range s.span.GetLinks() {
						if s.span.GetName() == "wlproj.batch" && hex.EncodeToString(l.GetTraceId()) == producerTrace &&
							hex.EncodeToString(l.GetSpanId()) == producerSpan {
							batch = s
							require.Equal(t, map[string]string{"wlproj.event_id": strconv.FormatInt(linkedID, 10)}, attrs(l.GetAttributes()))
							return true
						}
					}
				}
				return false
			})
			require.Equal(t, "wlproj-e2e", batch.resource["service.name"])
			require.Equal(t, "e2e", batch.resource["deployment.environment"])
			require.NotEmpty(t, batch.resource["service.version"])
			require.Len(t, batch.span.GetTraceId(), 16)
			require.NotEqual(t, producerTrace, hex.EncodeToString(batch.span.GetTraceId()), "a link, not a child: the batch is its own trace")
			require.Empty(t, batch.span.GetParentSpanId(), "the batch is the root of its trace")
			events := intAttr(t, batch.span, "wlproj.events")
			require.GreaterOrEqual(t, events, int64(1))
			require.Equal(t, events, intAttr(t, batch.span, "wlproj.done"))
			require.Zero(t, intAttr(t, batch.span, "wlproj.failed"))

			// Its children: the claim, one bulk (search), the ack; all in
			// its time.
			var children []*tracepb.Span
			harness.Eventually(t, 10*time.Second, "the batch's three children", func() bool {
				children = children[:0]
				for _, s := range recv.received() {
					if string(s.span.GetParentSpanId()) == string(batch.span.GetSpanId()) {
						children = append(children, s.span)
					}
				}
				return len(children) >= 3
			})
			names := map[string]*tracepb.Span{}
			for _, s := range children {
				names[s.GetName()] = s
				require.Equal(t, batch.span.GetTraceId(), s.GetTraceId())
				require.GreaterOrEqual(t, s.GetStartTimeUnixNano(), batch.span.GetStartTimeUnixNano(), s.GetName())
				require.LessOrEqual(t, s.GetEndTimeUnixNano(), batch.span.GetEndTimeUnixNano(), s.GetName())
			}
			require.Len(t, children, 3)
			require.Contains(t, names, "wlproj.claim")
			require.Contains(t, names, "wlproj.bulk")
			require.Contains(t, names, "wlproj.ack")
			require.Equal(t, events, intAttr(t, names["wlproj.claim"], "wlproj.events"))
			require.Equal(t, "search", attrs(names["wlproj.bulk"].GetAttributes())["wlproj.projection"])
			require.Equal(t, events, intAttr(t, names["wlproj.bulk"], "wlproj.events"))
			require.Zero(t, intAttr(t, names["wlproj.bulk"], "wlproj.errors"))
			require.Equal(t, events, intAttr(t, names["wlproj.ack"], "wlproj.done"))

			// A state-changing command: its own span, exported before it exits.
			cmd := exec.Command(harness.Binary(t), "pause", "--projection", "chronicle", "--by", "e2e", "--why", "trace test",
				"--database-url", c.db.URL)
			cmd.Env = append(os.Environ(), otelEnv...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			var pause *tracepb.Span
			for _, s := range recv.received() {
				if s.span.GetName() == "wlproj pause" {
					pause = s.span
				}
			}
			require.NotNil(t, pause, "wlproj pause exported its span before exiting")
			require.Equal(t, "pause", attrs(pause.GetAttributes())["wlproj.command"])
			require.Equal(t, tracepb.Status_STATUS_CODE_UNSET, pause.GetStatus().GetCode())
		})
	}
}
