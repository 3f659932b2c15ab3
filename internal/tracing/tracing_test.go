package tracing

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Settings
		err  string
	}{
		{"nothing set: off", nil, Settings{}, ""},
		{"an endpoint turns it on, http/protobuf by default",
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, Settings{On: true, Protocol: ProtocolHTTP}, ""},
		{"a traces endpoint too",
			map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, Settings{On: true, Protocol: ProtocolHTTP}, ""},
		{"otlp without an endpoint: on, the exporter's default endpoint",
			map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, Settings{On: true, Protocol: ProtocolHTTP}, ""},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, Settings{On: true, Protocol: ProtocolGRPC}, ""},
		{"the traces protocol wins",
			map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
			Settings{On: true, Protocol: ProtocolHTTP}, ""},
		{"none wins over an endpoint",
			map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, Settings{}, ""},
		{"the SDK disabled wins over everything",
			map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, Settings{}, ""},
		{"an exporter wlproj lacks", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, Settings{}, "OTEL_TRACES_EXPORTER"},
		{"a protocol wlproj lacks",
			map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, Settings{}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
