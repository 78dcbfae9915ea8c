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

// transferArgs is shared by the caller (client.Typed) and the task
// (worker.FuncKwargs): celery tags name the keywords on both sides.
type transferArgs struct {
	Amount int    `celery:"amount,required" json:"amt"`
	Note   string `celery:"note,optional"`
}

// TestFuncKwargsStrict: keyword binding follows Python's call rules (an
// unexpected or missing keyword is a TypeError naming kwargs.<name>), and a
// struct shared with client.Typed round-trips through its celery tags.
func TestFuncKwargsStrict(t *testing.T) {
	h := newHarness(t, worker.Config{})
	worker.FuncKwargs(h.mux, "tasks.transfer", func(ctx context.Context, a transferArgs) (string, error) {
		return fmt.Sprint(a.Amount, a.Note), nil
	})
	h.start()
	for _, tc := range []struct {
		kwargs map[string]any
		state  protocol.State
		want   string
	}{
		{map[string]any{"amount": int64(5), "note": "x"}, protocol.StateSuccess, "5x"},
		{map[string]any{"amount": int64(5)}, protocol.StateSuccess, "5"},
		{map[string]any{"amount": int64(5), "extra": int64(1)}, protocol.StateFailure, "TypeError [protocol: kwargs.extra: unexpected keyword argument]"},
		{map[string]any{"note": "x"}, protocol.StateFailure, "TypeError [protocol: kwargs.amount: required but missing]"},
		{map[string]any{"amount": "x"}, protocol.StateFailure, "TypeError [protocol: kwargs.amount: cannot bind"},
	} {
		m := h.wait(h.send("tasks.transfer", nil, tc.kwargs))
		got := fmt.Sprint(m.Result)
		if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
			got = ex.Type + " " + fmt.Sprint(ex.Message)
		}
		if m.Status != tc.state || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v: %s %s, want %s %s", tc.kwargs, m.Status, got, tc.state, tc.want)
		}
	}
	c := client.New(h.tr, client.Config{Backend: h.be, DefaultQueue: "q"})
	r, err := client.NewTyped[transferArgs, string](c, "tasks.transfer").Call(context.Background(), transferArgs{Amount: 7})
	if err != nil || r != "7" {
		t.Fatalf("typed transfer = %q, %v; want 7", r, err)
	}
}
