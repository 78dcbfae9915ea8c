package client_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// recorder is a Publisher that keeps what it is given.
type recorder struct{ sent []*transport.Publishing }

func (r *recorder) Publish(ctx context.Context, p *transport.Publishing) error {
	r.sent = append(r.sent, p)
	return nil
}

func TestTypedArguments(t *testing.T) {
	type areaArgs struct {
		Width  int `json:"width"`
		Height int `json:"height"`
	}
	ctx := context.Background()
	rec := &recorder{}
	c := client.New(rec, client.Config{})
	if _, err := client.NewTyped[areaArgs, int](c, "tasks.area").Send(ctx, areaArgs{3, 4}); err != nil {
		t.Fatal(err)
	}
	// An array or slice is positional: how worker.Func tasks are called.
	if _, err := client.NewTyped[[2]int, int](c, "tasks.add").Send(ctx, [2]int{2, 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.NewTyped[[]any, int](c, "tasks.echo").Send(ctx, []any{"x", 1.5}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		args   []any
		kwargs map[string]any
	}{
		{[]any{}, map[string]any{"width": int64(3), "height": int64(4)}},
		{[]any{int64(2), int64(3)}, map[string]any{}},
		{[]any{"x", 1.5}, map[string]any{}},
	}
	if len(rec.sent) != len(want) {
		t.Fatalf("sent %d messages, want %d", len(rec.sent), len(want))
	}
	for i, p := range rec.sent {
		m, err := protocol.DecodeTask(&p.Message, protocol.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want[i].args, m.Args); diff != "" {
			t.Errorf("message %d args mismatch (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(want[i].kwargs, m.Kwargs); diff != "" {
			t.Errorf("message %d kwargs mismatch (-want +got):\n%s", i, diff)
		}
	}
	if _, err := client.NewTyped[int, int](c, "tasks.x").Send(ctx, 5); err == nil {
		t.Error("Send with an int as the arguments succeeded")
	}
}
