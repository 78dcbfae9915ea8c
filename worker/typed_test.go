package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	mtransport "github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

type point struct {
	X, Y int
}

type addArgs struct {
	A int `celery:"a,required"`
	B int `celery:"b"`
}

func TestFunc(t *testing.T) {
	h := newHarness(t, worker.Config{})
	worker.Func(h.mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	worker.Func(h.mux, "tasks.norm", func(ctx context.Context, p point, scale float64) (map[string]float64, error) {
		return map[string]float64{"x": float64(p.X) * scale, "y": float64(p.Y) * scale}, nil
	})
	worker.Func(h.mux, "tasks.nothing", func(ctx context.Context) error { return nil })
	worker.Func(h.mux, "tasks.fails", func(ctx context.Context, s string) (string, error) {
		return "", worker.NewException("ValueError", "no "+s)
	})
	worker.FuncKwargs(h.mux, "tasks.kwadd", func(ctx context.Context, a addArgs) (int, error) { return a.A + a.B, nil })
	h.start()

	for _, tc := range []struct {
		name   string
		args   []any
		kwargs map[string]any
		state  protocol.State
		want   string // result, or the exception type and message
	}{
		{"tasks.add", []any{int64(2), int64(3)}, nil, protocol.StateSuccess, "5"},
		{"tasks.norm", []any{map[string]any{"X": int64(1), "Y": int64(2)}, 1.5}, nil, protocol.StateSuccess, "map[x:1.5 y:3]"},
		{"tasks.nothing", nil, nil, protocol.StateSuccess, "<nil>"},
		{"tasks.fails", []any{"way"}, nil, protocol.StateFailure, "ValueError [no way]"},
		{"tasks.add", []any{int64(2)}, nil, protocol.StateFailure, "TypeError"},
		{"tasks.add", []any{int64(2), "x"}, nil, protocol.StateFailure, "TypeError"},
		{"tasks.add", nil, map[string]any{"a": int64(1)}, protocol.StateFailure, "TypeError"},
		{"tasks.kwadd", nil, map[string]any{"a": int64(1), "b": int64(2)}, protocol.StateSuccess, "3"},
		{"tasks.kwadd", nil, map[string]any{"b": int64(2)}, protocol.StateFailure, "TypeError"},
		{"tasks.kwadd", []any{int64(1)}, nil, protocol.StateFailure, "TypeError"},
	} {
		m := h.wait(h.send(tc.name, tc.args, tc.kwargs))
		got := fmt.Sprint(m.Result)
		if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
			got = ex.Type + " " + fmt.Sprint(ex.Message)
		}
		if m.Status != tc.state || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s%v%v: %s %s, want %s %s", tc.name, tc.args, tc.kwargs, m.Status, got, tc.state, tc.want)
		}
	}
}

func TestFuncRefusesOtherShapes(t *testing.T) {
	for _, f := range []any{
		nil,
		42,
		func(a, b int) (int, error) { return 0, nil },
		func(ctx context.Context) int { return 0 },
		func(ctx context.Context) (int, int) { return 0, 0 },
		func(ctx context.Context, xs ...int) error { return nil },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Func accepted %T", f)
				}
			}()
			worker.Func(worker.NewMux(), "tasks.x", f)
		}()
	}
}

func ExampleFunc() {
	tr := mtransport.New(mtransport.Config{})
	defer tr.Close()
	be := memory.New()
	defer be.Close()

	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) {
		return a + b, nil
	})
	w, _ := worker.New(tr, mux, worker.Config{Queues: []string{"celery"}, Backend: be, WithoutHeartbeat: true, WithoutControl: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// What Python's add.delay(2, 3) sends.
	r, _ := client.New(tr, client.Config{}).Send(ctx, "tasks.add", []any{2, 3}, nil)
	m, _ := be.Wait(ctx, r.ID)
	fmt.Println(m.Status, m.Result)
	cancel()
	<-done
	// Output: SUCCESS 5
}
