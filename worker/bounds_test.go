package worker_test

import (
	"bytes"
	"compress/zlib"
	"context"
	"io"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
)

func TestConfigValidateBounds(t *testing.T) {
	tests := []struct {
		name    string
		size    int
		depth   int
		wantErr string
	}{
		{name: "defaults", size: 0, depth: 0},
		{name: "set", size: 1 << 20, depth: 64},
		{name: "largest depth", depth: protocol.MaxDepthLimit},
		{name: "negative size", size: -1, wantErr: "negative MaxMessageSize"},
		{name: "negative depth", depth: -1, wantErr: "MaxNestingDepth -1 outside"},
		{name: "depth over the limit", depth: protocol.MaxDepthLimit + 1, wantErr: "MaxNestingDepth 10001 outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := worker.Config{MaxMessageSize: tt.size, MaxNestingDepth: tt.depth}.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// zeroReader yields zero bytes forever.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestDecompressionBombRefusedWithBoundedMemory: a zlib body that
// inflates to 64 MiB is dead-lettered as too large by a worker bounded to
// 1 MiB, and handling it allocates a small multiple of the bound, not of
// the inflated size (an unbounded decoder would allocate 64 MiB or more).
func TestDecompressionBombRefusedWithBoundedMemory(t *testing.T) {
	const bound = 1 << 20
	var bomb bytes.Buffer
	zw := zlib.NewWriter(&bomb)
	if _, err := io.CopyN(zw, zeroReader{}, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, worker.Config{MaxMessageSize: bound})
	var ran atomic.Int64
	h.mux.HandleFunc("tasks.add", func(ctx context.Context, tk *worker.Task) (any, error) {
		ran.Add(1)
		return add(ctx, tk)
	})
	h.start()
	m := protocol.Message{
		ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
		Headers: map[string]any{"task": "tasks.add", "id": "bomb", "lang": "py", "compression": "application/x-gzip"},
		Body:    bomb.Bytes(),
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := h.tr.Publish(context.Background(), &transport.Publishing{RoutingKey: "q", Message: m}); err != nil {
		t.Fatal(err)
	}
	dead := waitDead(t, h, "q", 1)
	runtime.ReadMemStats(&after)
	if got := dead[0].Reason; got.Reason != "too-large" || got.TaskID != "bomb" {
		t.Fatalf("dead letter reason %+v, want too-large for task bomb", got)
	}
	// The compressed body is copied by the in-memory transport a few
	// times; the decoder may hold the bound plus its read buffer.
	allocated := after.TotalAlloc - before.TotalAlloc
	limit := uint64(16*bound + 8*bomb.Len())
	t.Logf("a %d-byte bomb inflating to 64 MiB: %d bytes allocated while refusing it (limit %d)", bomb.Len(), allocated, limit)
	if allocated > limit {
		t.Errorf("refusing the bomb allocated %d bytes, want at most %d", allocated, limit)
	}
	if ran.Load() != 0 {
		t.Errorf("the handler ran %d times for a refused message", ran.Load())
	}
	if r := h.wait("bomb"); r.Status != protocol.StateFailure {
		t.Errorf("bomb state %s, want FAILURE", r.Status)
	}
}

// TestPickleNeverReachesADecoder: a pickle payload that would run a
// command when unpickled is dead-lettered as an unaccepted content type,
// even when Accept lists pickle, and the handler never sees it. Nothing in
// celeriac can unpickle: TestNoPickleDecoderLinked checks that no pickle
// package is linked into any of its packages.
func TestPickleNeverReachesADecoder(t *testing.T) {
	h := newHarness(t, worker.Config{Accept: []string{protocol.ContentTypeJSON, protocol.ContentTypePickle}})
	var ran atomic.Int64
	h.mux.HandleFunc("tasks.add", func(ctx context.Context, tk *worker.Task) (any, error) {
		ran.Add(1)
		return add(ctx, tk)
	})
	h.start()
	m := protocol.Message{
		ContentType: protocol.ContentTypePickle, ContentEncoding: "binary",
		Headers: map[string]any{"task": "tasks.add", "id": "pickled", "lang": "py"},
		Body:    []byte("cos\nsystem\n(S'touch /tmp/celeriac-pwned'\ntR."),
	}
	if err := h.tr.Publish(context.Background(), &transport.Publishing{RoutingKey: "q", Message: m}); err != nil {
		t.Fatal(err)
	}
	dead := waitDead(t, h, "q", 1)
	if got := dead[0].Reason; got.Reason != "content-type" || !strings.Contains(got.Error, "pickle") {
		t.Fatalf("dead letter reason %+v, want content-type mentioning pickle", got)
	}
	if !bytes.Equal(dead[0].Message.Body, m.Body) {
		t.Errorf("the dead letter's body changed: %q", dead[0].Message.Body)
	}
	if ran.Load() != 0 {
		t.Errorf("the handler ran %d times for a pickle message", ran.Load())
	}
}

// TestNoPickleDecoderLinked: no package of the module, and none of their
// dependencies, is a pickle implementation, so that a pickle body cannot be
// handed to anything that would unpickle it.
func TestNoPickleDecoderLinked(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/celeriac/celeriac/...").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps listed %d packages; the check would prove nothing", len(deps))
	}
	for _, p := range deps {
		if strings.Contains(strings.ToLower(p), "pickle") {
			t.Errorf("package %s is linked: a pickle decoder must never be", p)
		}
	}
}
