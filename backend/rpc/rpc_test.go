package rpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// fakePublisher records what is published.
type fakePublisher struct {
	mu   sync.Mutex
	sent []*transport.Publishing
	err  error
}

func (f *fakePublisher) Publish(ctx context.Context, p *transport.Publishing) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.sent = append(f.sent, p)
	return nil
}

func (f *fakePublisher) published() []*transport.Publishing {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*transport.Publishing(nil), f.sent...)
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		pub := &fakePublisher{}
		b, err := rpc.New(pub, rpc.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Every store the suite accepted was sent as a reply.
			for _, p := range pub.published() {
				if p.RoutingKey != "bt-reply" || len(p.Message.Body) == 0 {
					t.Errorf("unexpected publishing %+v", p)
				}
			}
		})
		return b
	}, backendtest.Features{NoGet: true})
}

// TestReplyWire checks the reply against the one captured from a Celery
// 5.2.6 worker (celery-protocol.md §6.5).
func TestReplyWire(t *testing.T) {
	failure := &protocol.ResultMeta{
		TaskID: "b2000000-0000-0000-0000-000000000002", Status: protocol.StateFailure,
		Result:    &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"nope"}, Module: "builtins"},
		Traceback: "Traceback (most recent call last):\nValueError: nope\n",
		DateDone:  time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC), GroupID: "g", Extended: true, Name: "tasks.fail",
	}
	tests := []struct {
		name     string
		cfg      rpc.Config
		req      backend.StoreRequest
		wantCT   string
		wantEnc  string
		wantMode uint8
		wantCorr string
		wantBody map[string]any
	}{
		{
			name:   "success",
			req:    backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "b1000000-0000-0000-0000-000000000001", Status: protocol.StateSuccess, Result: int64(5)}, ReplyTo: "q-reply", CorrelationID: "b1000000-0000-0000-0000-000000000001"},
			wantCT: protocol.ContentTypeJSON, wantEnc: "utf-8", wantMode: 1, wantCorr: "b1000000-0000-0000-0000-000000000001",
			wantBody: map[string]any{"task_id": "b1000000-0000-0000-0000-000000000001", "status": "SUCCESS", "result": int64(5), "traceback": nil, "children": []any{}},
		},
		{
			name:   "failure without correlation id",
			req:    backend.StoreRequest{Meta: failure, ReplyTo: "q-reply"},
			wantCT: protocol.ContentTypeJSON, wantEnc: "utf-8", wantMode: 1, wantCorr: failure.TaskID,
			wantBody: map[string]any{"task_id": failure.TaskID, "status": "FAILURE", "traceback": failure.Traceback, "children": []any{},
				"result": map[string]any{"exc_type": "ValueError", "exc_message": []any{"nope"}, "exc_module": "builtins"}},
		},
		{
			name:   "msgpack persistent",
			cfg:    rpc.Config{Serializer: "msgpack", Persistent: true},
			req:    backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t", Status: protocol.StateStarted, Result: map[string]any{"pid": int64(1), "hostname": "h"}}, ReplyTo: "q", CorrelationID: "c"},
			wantCT: protocol.ContentTypeMsgpack, wantEnc: "binary", wantMode: 2, wantCorr: "c",
			wantBody: map[string]any{"task_id": "t", "status": "STARTED", "result": map[string]any{"pid": int64(1), "hostname": "h"}, "traceback": nil, "children": []any{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &fakePublisher{}
			b, err := rpc.New(pub, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := b.Store(t.Context(), tt.req); err != nil {
				t.Fatal(err)
			}
			sent := pub.published()
			if len(sent) != 1 {
				t.Fatalf("published %d messages, want 1", len(sent))
			}
			p := sent[0]
			if p.Exchange != "" || p.RoutingKey != tt.req.ReplyTo || p.NoConfirm {
				t.Errorf("destination exchange %q routing key %q noconfirm %v", p.Exchange, p.RoutingKey, p.NoConfirm)
			}
			m := p.Message
			if m.ContentType != tt.wantCT || m.ContentEncoding != tt.wantEnc || m.Headers == nil || len(m.Headers) != 0 {
				t.Errorf("content type %q encoding %q headers %#v", m.ContentType, m.ContentEncoding, m.Headers)
			}
			if d := cmp.Diff(protocol.Properties{CorrelationID: tt.wantCorr, DeliveryMode: tt.wantMode}, m.Properties); d != "" {
				t.Errorf("properties (-want +got):\n%s", d)
			}
			body, err := protocol.Unmarshal(m.ContentType, m.Body, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(any(tt.wantBody), body); d != "" {
				t.Errorf("body (-want +got):\n%s", d)
			}
		})
	}
}

func TestNoReplyTo(t *testing.T) {
	pub := &fakePublisher{}
	b, _ := rpc.New(pub, rpc.Config{})
	defer b.Close()
	if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess}}); err != nil {
		t.Fatal(err)
	}
	if n := len(pub.published()); n != 0 {
		t.Fatalf("published %d messages without reply_to", n)
	}
}

func TestPublishError(t *testing.T) {
	boom := errors.New("boom")
	b, _ := rpc.New(&fakePublisher{err: boom}, rpc.Config{})
	defer b.Close()
	err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess}, ReplyTo: "q"})
	if !errors.Is(err, boom) {
		t.Fatalf("Store err = %v, want the publisher's", err)
	}
}

func TestNew(t *testing.T) {
	if _, err := rpc.New(nil, rpc.Config{}); err == nil {
		t.Error("New accepted a nil publisher")
	}
	if _, err := rpc.New(&fakePublisher{}, rpc.Config{Serializer: "pickle"}); err == nil {
		t.Error("New accepted pickle")
	}
}
