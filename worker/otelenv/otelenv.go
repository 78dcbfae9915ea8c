// Package otelenv builds an OpenTelemetry TracerProvider from the standard
// OTEL_* environment variables, for worker.Config.TracerProvider and
// client.Config.TracerProvider, the way an OpenTelemetry SDK is
// configured in any language:
//
//   - tracing is on when the list OTEL_TRACES_EXPORTER names "otlp"
//     ("otlp,console" too: exporters this package does not offer are
//     warned about and ignored, as the specification says), or when it is
//     unset and an OTLP endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true or
//     OTEL_TRACES_EXPORTER=none turns it off;
//   - OTEL_EXPORTER_OTLP_PROTOCOL (or ..._TRACES_PROTOCOL) picks the
//     exporter: "grpc", or "http/protobuf" (the default, as the
//     specification says); another value (http/json) is warned about and
//     the default used;
//   - Propagator reads OTEL_PROPAGATORS (tracecontext, baggage, b3,
//     b3multi, jaeger, xray, ottrace, none);
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

	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
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
	otlp, _, set := exporters(getenv("OTEL_TRACES_EXPORTER"))
	if !set {
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	return otlp
}

// exporters reads the comma-separated OTEL_TRACES_EXPORTER: whether it
// names otlp (and not none), the names this package does not offer, and
// whether it is set at all.
func exporters(v string) (otlp bool, unknown []string, set bool) {
	none := false
	for _, e := range strings.Split(v, ",") {
		switch e = strings.ToLower(strings.TrimSpace(e)); e {
		case "":
		case "otlp":
			otlp, set = true, true
		case "none":
			none, set = true, true
		default:
			unknown, set = append(unknown, e), true
		}
	}
	// "none" wins over everything else in the list, as the specification's
	// "no automatically configured exporter" says.
	return otlp && !none, unknown, set
}

// Propagator returns the propagator OTEL_PROPAGATORS asks for (the W3C
// trace context plus baggage when it is unset; a no-op one for "none"),
// for worker.Config.Propagator and client.Config.Propagator. An unknown
// name is warned about (otel.Handle) and the default used, as the
// specification says.
func Propagator() propagation.TextMapPropagator {
	return autoprop.NewTextMapPropagator()
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
	if _, unknown, _ := exporters(os.Getenv("OTEL_TRACES_EXPORTER")); len(unknown) > 0 {
		otel.Handle(fmt.Errorf("otelenv: OTEL_TRACES_EXPORTER: ignoring %s: only otlp is offered", strings.Join(unknown, ", ")))
	}
	switch strings.ToLower(strings.TrimSpace(proto)) {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		// The specification: an unrecognised enum value is warned about and
		// ignored, so the default protocol is used rather than refusing to
		// start.
		otel.Handle(fmt.Errorf("otelenv: OTEL_EXPORTER_OTLP_PROTOCOL %q is not offered (grpc, http/protobuf): using http/protobuf", proto))
		exp, err = otlptracehttp.New(ctx)
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
