package otelenv_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/celeriac/celeriac/worker/otelenv"
)

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "OTLP"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, true},
		// A list, as the specification allows: console is not offered, otlp is.
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console, otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp,none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": ",", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
	} {
		if got := otelenv.Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestNewOffWithoutEnvironment(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	tp, err := otelenv.New(context.Background(), "x")
	if err != nil || tp != nil {
		t.Fatalf("New = %v, %v; want nil, nil", tp, err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
}

// TestNewUnknownProtocolFallsBack: the specification says an unrecognised
// OTEL_EXPORTER_OTLP_PROTOCOL (http/json, which this package does not
// offer) is warned about and the default used, not a failure to start.
func TestNewUnknownProtocolFallsBack(t *testing.T) {
	for _, proto := range []string{"http/json", "carrier-pigeon"} {
		t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
		tp, err := otelenv.New(context.Background(), "x")
		if err != nil || tp == nil {
			t.Fatalf("%s: New = %v, %v; want a provider on http/protobuf", proto, tp, err)
		}
		_ = tp.Shutdown(context.Background())
	}
}

// TestPropagator: OTEL_PROPAGATORS picks the propagator (b3 writes b3
// headers, none writes nothing); unset is W3C trace context and baggage.
func TestPropagator(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want []string
	}{
		{"", []string{"baggage", "traceparent", "tracestate"}},
		{"b3", []string{"b3"}},
		{"b3multi", []string{"x-b3-traceid", "x-b3-spanid"}},
		{"none", nil},
		{"carrier-pigeon", []string{"baggage", "traceparent", "tracestate"}},
	} {
		t.Setenv("OTEL_PROPAGATORS", tc.env)
		got := otelenv.Propagator().Fields()
		if tc.want == nil && len(got) != 0 {
			t.Errorf("OTEL_PROPAGATORS=%q: fields %v, want none", tc.env, got)
		}
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("OTEL_PROPAGATORS=%q: fields %v, want %s among them", tc.env, got, w)
			}
		}
	}
}

// exported decodes what an OTLP receiver got and returns the span names and
// the service name.
func exported(t *testing.T, req *coltrace.ExportTraceServiceRequest) (names []string, service string) {
	t.Helper()
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				names = append(names, s.GetName())
			}
		}
	}
	return names, service
}

// TestNewExportsOverHTTP: with OTEL_EXPORTER_OTLP_ENDPOINT and the default
// protocol, spans reach an OTLP/HTTP receiver, named for the service.
func TestNewExportsOverHTTP(t *testing.T) {
	var mu sync.Mutex
	var got []*coltrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &coltrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Write(b)
	}))
	defer srv.Close()
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	tp, err := otelenv.New(context.Background(), "celeriac-test")
	if err != nil || tp == nil {
		t.Fatalf("New = %v, %v", tp, err)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "run/tasks.add")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d export requests, want 1", len(got))
	}
	names, service := exported(t, got[0])
	if len(names) != 1 || names[0] != "run/tasks.add" || service != "celeriac-test" {
		t.Fatalf("exported %v from %q", names, service)
	}
}

type traceService struct {
	coltrace.UnimplementedTraceServiceServer
	got chan *coltrace.ExportTraceServiceRequest
}

func (s *traceService) Export(ctx context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	s.got <- req
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// TestNewExportsOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc, and
// OTEL_SERVICE_NAME wins over the default name.
func TestNewExportsOverGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc := &traceService{got: make(chan *coltrace.ExportTraceServiceRequest, 4)}
	coltrace.RegisterTraceServiceServer(gs, svc)
	go gs.Serve(ln)
	defer gs.Stop()
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_SERVICE_NAME", "payments-worker")
	tp, err := otelenv.New(context.Background(), "celeriac-test")
	if err != nil || tp == nil {
		t.Fatalf("New = %v, %v", tp, err)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "apply_async/tasks.add")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-svc.got:
		names, service := exported(t, req)
		if len(names) != 1 || names[0] != "apply_async/tasks.add" || service != "payments-worker" {
			t.Fatalf("exported %v from %q", names, service)
		}
	default:
		t.Fatal("the gRPC receiver got nothing")
	}
}
