package bench

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// otlpSink is an OTLP/HTTP trace receiver that reads every export request
// and answers success, keeping only a count: the far end a traced worker
// exports to, so that the benchmark measures the worker's cost of tracing
// and not a collector's.
type otlpSink struct {
	srv      *http.Server
	url      string
	requests atomic.Int64
	bytes    atomic.Int64
}

func (h *harness) otlpURL() (string, error) {
	if h.sink == nil {
		s, err := startOTLPSink()
		if err != nil {
			return "", err
		}
		h.sink = s
	}
	return h.sink.url, nil
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		s.bytes.Add(n)
		// An empty ExportTraceServiceResponse is zero bytes of protobuf.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	go s.srv.Serve(ln)
	return s, nil
}

func (s *otlpSink) close() { _ = s.srv.Close() }
