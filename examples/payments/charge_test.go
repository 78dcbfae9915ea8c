package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// chargeHandler is payments.charge as Register wraps it, on an in-memory
// idempotency store, plus the task's retry policy.
func chargeHandler(t *testing.T, cfg GatewayConfig) (worker.Handler, retry.Policy, *Gateway) {
	t.Helper()
	g, c := newTestGateway(t, cfg)
	p := &Payments{Gateway: c, Log: zaptest.NewLogger(t)}
	o := ChargeOptions{Store: membackend.NewIdempotency(), Lease: time.Minute, MaxRetries: 5}
	return p.handler(o), chargePolicy(o.MaxRetries), g
}

func task(id string, args []any, kwargs map[string]any) *worker.Task {
	return &worker.Task{ID: id, Name: TaskName, Args: args, Kwargs: kwargs, Hostname: "test@host"}
}

func TestChargeOncePerOrder(t *testing.T) {
	h, _, g := chargeHandler(t, GatewayConfig{})
	ctx := context.Background()
	var results []any
	for i, tk := range []*worker.Task{
		task("t1", []any{"o-1", int64(4200)}, nil),
		task("t2", []any{"o-1", int64(4200)}, nil), // a duplicate message
		task("t1", []any{"o-1", int64(4200)}, nil), // a redelivery
		task("t3", nil, map[string]any{"order_id": "o-1", "amount": int64(4200)}),
	} {
		r, err := h.HandleTask(ctx, tk)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		results = append(results, r)
	}
	for i, r := range results[1:] {
		// The duplicates get the stored result, decoded from JSON.
		if d := cmp.Diff(results[1], r); d != "" {
			t.Errorf("duplicate %d differs (-first duplicate +this):\n%s", i+1, d)
		}
	}
	first := results[0].(map[string]any)
	if first["charge_id"] != "ch_000001" || first["order_id"] != "o-1" || first["currency"] != "eur" {
		t.Fatalf("first result %v", first)
	}
	if d := cmp.Diff(map[string]any{"charge_id": "ch_000001", "order_id": "o-1", "amount": int64(4200),
		"currency": "eur", "created": first["created"]}, results[1]); d != "" {
		t.Fatalf("stored result differs from the charge (-want +got):\n%s", d)
	}
	if s := g.Stats(); s.Requests != 1 || s.Charges != 1 || s.PerKey["order-o-1"] != 1 {
		t.Fatalf("gateway saw %+v, want one request with key order-o-1", s)
	}
}

func TestChargeErrors(t *testing.T) {
	tests := []struct {
		name      string
		cfg       GatewayConfig
		task      *worker.Task
		wantRetry bool   // the policy retries it
		wantPy    string // the Python exception type
	}{
		{"gateway 503", GatewayConfig{FailRate: 1}, task("t", []any{"o-1", int64(5)}, nil), true, "ConnectionError"},
		{"declined", GatewayConfig{}, task("t", []any{"declined-1", int64(5)}, nil), false, "ValueError"},
		{"bad amount", GatewayConfig{}, task("t", []any{"o-1", int64(-5)}, nil), false, "ValueError"},
		{"bad currency", GatewayConfig{}, task("t", []any{"o-1", int64(5), "euros"}, nil), false, "ValueError"},
		{"missing amount", GatewayConfig{}, task("t", []any{"o-1"}, nil), false, ""},
		{"order id not a string", GatewayConfig{}, task("t", []any{int64(7), int64(5)}, nil), false, ""},
		{"currency not a string", GatewayConfig{}, task("t", []any{"o-1", int64(5)}, map[string]any{"currency": int64(1)}), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, policy, g := chargeHandler(t, tt.cfg)
			_, err := h.HandleTask(context.Background(), tt.task)
			if err == nil {
				t.Fatal("no error")
			}
			d := policy.Decide(err, 0, time.Now(), func(n int) int { return 0 })
			if d.Retry != tt.wantRetry {
				t.Fatalf("retry %v, want %v (error %v)", d.Retry, tt.wantRetry, err)
			}
			var ex *worker.Exception
			if tt.wantPy != "" && (!errors.As(err, &ex) || ex.Type != tt.wantPy) {
				t.Fatalf("error %v reaches Python as %v, want %s", err, ex, tt.wantPy)
			}
			if s := g.Stats(); s.Charges != 0 {
				t.Fatalf("a failed task charged: %+v", s)
			}
		})
	}
}

// TestChargeRetryAfterTimeoutReplays: the gateway charged but the answer
// came too late; the retry carries the same key and gets that charge back.
func TestChargeRetryAfterTimeoutReplays(t *testing.T) {
	g, c := newTestGateway(t, GatewayConfig{SlowRate: 1, SlowDelay: time.Minute})
	c.Timeout = 50 * time.Millisecond
	p := &Payments{Gateway: c, Log: zaptest.NewLogger(t)}
	h := p.handler(ChargeOptions{Store: membackend.NewIdempotency(), Lease: time.Minute})
	tk := task("t1", []any{"o-1", int64(4200)}, nil)
	_, err := h.HandleTask(context.Background(), tk)
	if !isTransient(err, 0) {
		t.Fatalf("first run: %v, want a transient timeout", err)
	}
	var r any
	for {
		// The retries; the gateway says 409 until the first request ends.
		r, err = h.HandleTask(context.Background(), tk)
		if err == nil {
			break
		}
		if !isTransient(err, 409) {
			t.Fatalf("retry: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r.(map[string]any)["charge_id"] != "ch_000001" || len(g.Charges()) != 1 {
		t.Fatalf("retry result %v, charges %v", r, g.Charges())
	}
}

func TestChargeWithoutIdempotentRefuses(t *testing.T) {
	_, c := newTestGateway(t, GatewayConfig{})
	p := &Payments{Gateway: c, Log: zaptest.NewLogger(t)}
	_, err := p.Charge(context.Background(), task("t", []any{"o-1", int64(5)}, nil))
	if !errors.Is(err, retry.ErrSkip) || !strings.Contains(err.Error(), "no idempotency key") {
		t.Fatalf("%v", err)
	}
}

func TestOrderKey(t *testing.T) {
	for _, tt := range []struct {
		args   []any
		kwargs map[string]any
		want   string
	}{
		{[]any{"1001", int64(5)}, nil, "order-1001"},
		{[]any{"1001", int64(5), "usd"}, nil, "order-1001"},
		{nil, map[string]any{"order_id": "1001", "amount": int64(5)}, "order-1001"},
		{[]any{"", int64(5)}, nil, ""},
		{nil, map[string]any{"amount": int64(5)}, ""},
		{[]any{"a", int64(1), "eur", "x"}, nil, ""},
	} {
		got, err := OrderKey(task("t", tt.args, tt.kwargs))
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("OrderKey(%v, %v) = %q, %v; want %q", tt.args, tt.kwargs, got, err, tt.want)
		}
	}
}
