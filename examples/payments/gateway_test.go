package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func newTestGateway(t *testing.T, cfg GatewayConfig) (*Gateway, *Client) {
	t.Helper()
	g := NewGateway(cfg)
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, &Client{BaseURL: srv.URL, HTTP: srv.Client()}
}

func TestGatewayCharges(t *testing.T) {
	order := ChargeRequest{OrderID: "o-1", Amount: 4200, Currency: "eur"}
	type call struct {
		key          string
		req          ChargeRequest
		wantStatus   int // 200, or the status of the error
		wantReplayed bool
		wantCharge   string
	}
	tests := []struct {
		name        string
		calls       []call
		wantCharges int
	}{
		{"one charge", []call{{"k1", order, 200, false, "ch_000001"}}, 1},
		{"same key replays the charge", []call{
			{"k1", order, 200, false, "ch_000001"},
			{"k1", order, 200, true, "ch_000001"},
			{"k1", order, 200, true, "ch_000001"},
		}, 1},
		{"another key is another charge", []call{
			{"k1", order, 200, false, "ch_000001"},
			{"k2", order, 200, false, "ch_000002"},
		}, 2},
		{"same key other parameters", []call{
			{"k1", order, 200, false, "ch_000001"},
			{"k1", ChargeRequest{OrderID: "o-1", Amount: 1, Currency: "eur"}, 400, false, ""},
		}, 1},
		{"no key", []call{{"", order, 400, false, ""}}, 0},
		{"bad amount is not saved", []call{
			{"k1", ChargeRequest{OrderID: "o-1", Amount: 0, Currency: "eur"}, 400, false, ""},
			{"k1", order, 200, false, "ch_000001"},
		}, 1},
		{"bad currency", []call{{"k1", ChargeRequest{OrderID: "o-1", Amount: 5, Currency: "euro"}, 400, false, ""}}, 0},
		{"declined is saved and replayed", []call{
			{"k1", ChargeRequest{OrderID: "declined-1", Amount: 5, Currency: "eur"}, 402, false, ""},
			{"k1", ChargeRequest{OrderID: "declined-1", Amount: 5, Currency: "eur"}, 402, false, ""},
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, c := newTestGateway(t, GatewayConfig{})
			for i, cl := range tt.calls {
				ch, replayed, err := c.Charge(t.Context(), cl.key, cl.req)
				if cl.wantStatus == 200 {
					if err != nil {
						t.Fatalf("call %d: %v", i, err)
					}
					if ch.ID != cl.wantCharge || replayed != cl.wantReplayed {
						t.Fatalf("call %d: charge %s replayed %v, want %s replayed %v", i, ch.ID, replayed, cl.wantCharge, cl.wantReplayed)
					}
					continue
				}
				var perm *PermanentError
				if !errors.As(err, &perm) || perm.Status != cl.wantStatus {
					t.Fatalf("call %d: error %v, want a permanent %d", i, err, cl.wantStatus)
				}
			}
			if n := len(g.Charges()); n != tt.wantCharges {
				t.Fatalf("%d charges, want %d", n, tt.wantCharges)
			}
		})
	}
}

func TestGatewayTransientFailures(t *testing.T) {
	order := ChargeRequest{OrderID: "o-1", Amount: 4200, Currency: "eur"}
	t.Run("injected 503 charges nothing", func(t *testing.T) {
		g, c := newTestGateway(t, GatewayConfig{FailRate: 1})
		_, _, err := c.Charge(t.Context(), "k", order)
		var tr *TransientError
		if !errors.As(err, &tr) || tr.Status != http.StatusServiceUnavailable {
			t.Fatalf("error %v, want a transient 503", err)
		}
		if s := g.Stats(); s.Charges != 0 || s.Failures != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("outage", func(t *testing.T) {
		g, c := newTestGateway(t, GatewayConfig{})
		setOutage(t, c, true)
		if _, _, err := c.Charge(t.Context(), "k", order); !isTransient(err, 503) {
			t.Fatalf("during the outage: %v", err)
		}
		setOutage(t, c, false)
		if _, _, err := c.Charge(t.Context(), "k", order); err != nil {
			t.Fatalf("after the outage: %v", err)
		}
		if n := len(g.Charges()); n != 1 {
			t.Fatalf("%d charges", n)
		}
	})
	t.Run("timeout after the charge, then a replay", func(t *testing.T) {
		// The gateway charges, then answers too late: the client gives up.
		// Asking again with the same key returns that charge, not a new one.
		g, c := newTestGateway(t, GatewayConfig{SlowRate: 1, SlowDelay: time.Minute})
		c.Timeout = 50 * time.Millisecond
		if _, _, err := c.Charge(t.Context(), "k", order); !isTransient(err, 0) {
			t.Fatalf("slow charge: %v, want a transient timeout", err)
		}
		// The first request is still "running" on the gateway until its
		// handler sees the client went away.
		var ch Charge
		var replayed bool
		for {
			var err error
			ch, replayed, err = c.Charge(t.Context(), "k", order)
			if err == nil {
				break
			}
			if !isTransient(err, http.StatusConflict) {
				t.Fatalf("retry: %v", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !replayed || ch.ID != "ch_000001" || len(g.Charges()) != 1 {
			t.Fatalf("retry got %+v replayed %v; %d charges", ch, replayed, len(g.Charges()))
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		c := &Client{BaseURL: "http://127.0.0.1:1"}
		if _, _, err := c.Charge(t.Context(), "k", order); !isTransient(err, 0) {
			t.Fatalf("%v", err)
		}
	})
}

// TestGatewayConcurrentSameKey: many requests with one key at once make
// one charge; the others are conflicts (409) or replays.
func TestGatewayConcurrentSameKey(t *testing.T) {
	g, c := newTestGateway(t, GatewayConfig{Latency: 20 * time.Millisecond})
	order := ChargeRequest{OrderID: "o-1", Amount: 4200, Currency: "eur"}
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			for {
				ch, _, err := c.Charge(context.Background(), "k", order)
				if err == nil {
					ids[i] = ch.ID
					return
				}
				if !isTransient(err, http.StatusConflict) {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		if id != "ch_000001" {
			t.Errorf("request %d got charge %q", i, id)
		}
	}
	if s := g.Stats(); s.Charges != 1 || s.Replays+s.Conflicts < len(ids)-1 {
		t.Fatalf("stats %+v", s)
	}
}

func isTransient(err error, status int) bool {
	var tr *TransientError
	return errors.As(err, &tr) && tr.Status == status
}

func setOutage(t *testing.T, c *Client, on bool) {
	t.Helper()
	v := "false"
	if on {
		v = "true"
	}
	resp, err := c.HTTP.Post(c.BaseURL+"/v1/outage?on="+v, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// FuzzGateway: any request body and key leave the gateway consistent: it
// answers, and it never makes more than one charge per key.
func FuzzGateway(f *testing.F) {
	f.Add("k1", `{"order_id": "o-1", "amount": 4200, "currency": "eur"}`)
	f.Add("k1", `{"order_id": "declined-1", "amount": 1, "currency": "usd"}`)
	f.Add("", `{}`)
	f.Add("k", `{"order_id": "o", "amount": 1e99, "currency": "eur"}`)
	f.Add("k", `{"order_id": "o", "amount": 5, "currency": "eur", "extra": 1}`)
	f.Add("k", `[`)
	g := NewGateway(GatewayConfig{Seed: 1})
	f.Fuzz(func(t *testing.T, key, body string) {
		defer fuzzwatch.Watch(t, key, body)()
		for range 2 {
			req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
			req.Header.Set("Idempotency-Key", key)
			rec := httptest.NewRecorder()
			g.ServeHTTP(rec, req)
			if rec.Code == 0 || rec.Body.Len() == 0 {
				t.Fatalf("no answer: %d %q", rec.Code, rec.Body)
			}
		}
		seen := map[string]bool{}
		for _, c := range g.Charges() {
			if seen[c.Key] {
				t.Fatalf("two charges with key %q", c.Key)
			}
			seen[c.Key] = true
		}
	})
}
