// Package otelenv builds an OpenTelemetry TracerProvider from the standard
// OTEL_* environment variables, for worker.Config.TracerProvider and
// client.Config.TracerProvider, the way an OpenTelemetry SDK is
// configured in any language:
//
//   - tracing is on when OTEL_TRACES_EXPORTER is "otlp", or when it is unset
//     and an OTLP endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true or
//     OTEL_TRACES_EXPORTER=none turns it off;
//   - OTEL_EXPORTER_OTLP_PROTOCOL (or ..._TRACES_PROTOCOL) picks the
//     exporter: "grpc", or "http/protobuf" (the default, as the
//     specification says);
//   - the exporters read their own settings (endpoint, headers, timeout,
//     TLS) and the SDK reads OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG,
//     OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_*.
//
// Tracing costs nothing when it is off: New returns a nil provider then.
package otelenv

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Enabled reports whether the environment asks for tracing (see the package
// doc), reading variables with getenv (os.Getenv when nil).
func Enabled(getenv func(string) string) bool {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "otlp":
		return true
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return false // "none", or an exporter this package does not offer
	}
}

// New returns a TracerProvider exporting over OTLP as the environment says,
// with a batch span processor and the resource of OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES, or nil when the environment does not ask for
// tracing. defaultService names the service when OTEL_SERVICE_NAME is
// unset. Shut the provider down before exiting, so that the last spans are
// sent.
func New(ctx context.Context, defaultService string) (*sdktrace.TracerProvider, error) {
	if !Enabled(nil) {
		return nil, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch strings.ToLower(strings.TrimSpace(proto)) {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("otelenv: OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("otelenv: OTLP exporter: %w", err)
	}
	// Built here rather than resource.Default, which is computed once per
	// process: later detectors win, so the environment overrides the default
	// service name.
	opts := []resource.Option{resource.WithTelemetrySDK()}
	if defaultService != "" {
		opts = append(opts, resource.WithAttributes(serviceName(defaultService)))
	}
	attrs, err := resource.New(ctx, append(opts, resource.WithFromEnv())...)
	if err != nil {
		return nil, fmt.Errorf("otelenv: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(attrs)), nil
}

func serviceName(name string) attribute.KeyValue { return attribute.String("service.name", name) }
