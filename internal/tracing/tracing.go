// Package tracing turns on OpenTelemetry traces when the standard OTEL_*
// environment variables ask for them, and is a no-op otherwise: the spans
// the other packages start (consume's batches, the CLI's commands) then go
// to OpenTelemetry's no-op provider, which records nothing.
//
// On when OTEL_TRACES_EXPORTER is otlp, or when it is unset and an OTLP
// endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
// Unlike the SDKs' default of otlp, an unset exporter with no endpoint is
// off: a daemon that starts sending spans to localhost because nobody said
// otherwise surprises an operator. OTEL_SDK_DISABLED=true is always off.
// The protocol is OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the default) or grpc. The
// exporters read the endpoint, headers, timeout and TLS variables
// themselves, the batch processor the OTEL_BSP_* ones, and the resource
// OTEL_SERVICE_NAME (default wlproj) and OTEL_RESOURCE_ATTRIBUTES.
package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/wlproj/wlproj/internal/buildinfo"
)

// Protocols OTEL_EXPORTER_OTLP_PROTOCOL may name.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// serviceNameDefault is service.name unless OTEL_SERVICE_NAME says otherwise.
const serviceNameDefault = "wlproj"

// Settings is what the environment asks for.
type Settings struct {
	// On says whether spans are exported at all.
	On bool
	// Protocol is ProtocolHTTP or ProtocolGRPC when On.
	Protocol string
}

// FromEnv reads Settings with getenv (os.Getenv in the binary). An exporter
// or protocol it does not know is an error naming the variable.
func FromEnv(getenv func(string) string) (Settings, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return Settings{}, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return Settings{}, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return Settings{}, nil
		}
	case "otlp":
	default:
		return Settings{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: wlproj exports traces with otlp or none", exp)
	}
	protocol, name := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if protocol == "" {
		protocol, name = getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch protocol {
	case "", ProtocolHTTP:
		return Settings{On: true, Protocol: ProtocolHTTP}, nil
	case ProtocolGRPC:
		return Settings{On: true, Protocol: ProtocolGRPC}, nil
	}
	return Settings{}, fmt.Errorf("%s=%q: wlproj speaks %s or %s", name, protocol, ProtocolHTTP, ProtocolGRPC)
}

// Start installs the global tracer provider the environment asks for and
// returns what it asked for and the function that flushes and stops the
// provider (a no-op when off). When off, nothing is installed: the global
// provider stays OpenTelemetry's no-op one.
func Start(ctx context.Context) (s Settings, shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	s, err = FromEnv(os.Getenv)
	if err != nil || !s.On {
		return s, noop, err
	}
	var exp sdktrace.SpanExporter
	if s.Protocol == ProtocolGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return s, noop, fmt.Errorf("tracing: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", serviceNameDefault),
			attribute.String("service.version", buildinfo.Get().Version)),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return s, noop, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return s, tp.Shutdown, nil
}
