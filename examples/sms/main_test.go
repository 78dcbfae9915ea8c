package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/examples/sms/smsapi"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// scripted wraps the fake provider: a message id may get canned statuses
// for its first requests before the provider sees it.
type scripted struct {
	api *smsapi.Server
	mu  sync.Mutex
	// canned statuses by message id, consumed in order; 503 forever when
	// the list is [-503].
	canned map[string][]int
	calls  map[string]int
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var m smsapi.Message
	_ = json.Unmarshal(body, &m)
	s.mu.Lock()
	s.calls[m.MessageID]++
	var status int
	if c := s.canned[m.MessageID]; len(c) > 0 {
		if c[0] < 0 {
			status = -c[0]
		} else {
			status, s.canned[m.MessageID] = c[0], c[1:]
		}
	}
	s.mu.Unlock()
	if status != 0 {
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(status)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.api.ServeHTTP(w, r)
}

// TestSMS runs sms.send in a worker against the fake provider: sends,
// a bad number, transient failures retried or exhausted, a 429, and
// duplicates.
func TestSMS(t *testing.T) {
	api := &scripted{
		api:    smsapi.NewServer(smsapi.Config{Limit: 1000}),
		canned: map[string][]int{"flaky": {503}, "throttled": {429}, "doomed": {-503}},
		calls:  map[string]int{},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()

	tr := memory.New(memory.Config{})
	defer tr.Close()
	be := membackend.New()
	defer be.Close()
	log := zaptest.NewLogger(t)
	mux := worker.NewMux()
	register(mux, taskConfig{
		Rate: "50/s", Global: true, Bucket: "sms-api", Burst: 1,
		MaxRetries: 2, BackoffMax: time.Second, RateLimitedRetries: 5,
		Store: membackend.NewIdempotency(), Client: &smsapi.Client{URL: srv.URL}, Logger: log,
	})
	w, err := worker.New(tr, mux, worker.Config{Queues: []string{"sms"}, Concurrency: 4, Backend: be,
		GlobalRateLimiter: membackend.NewRateLimiter(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	prod := client.New(tr, client.Config{DefaultQueue: "sms"})
	send := func(id, to string) string {
		t.Helper()
		kw := map[string]any{"message_id": id, "to": to, "body": "hello " + id}
		if id == "" {
			kw = map[string]any{"to": to}
		}
		r, err := prod.Send(ctx, TaskName, nil, kw)
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	wait := func(tid string) *protocol.ResultMeta {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		m, err := be.Wait(wctx, tid)
		if err != nil {
			t.Fatalf("waiting for %s: %v", tid, err)
		}
		return m
	}
	const good = "+15550001234"
	tasks := map[string]string{}
	for _, id := range []string{"ok-1", "ok-2", "ok-3", "flaky", "throttled", "doomed"} {
		tasks[id] = send(id, good)
	}
	tasks["bad"] = send("bad", "555-1234")
	tasks["no-id"] = send("", good)

	results := map[string]*protocol.ResultMeta{}
	for id, tid := range tasks {
		results[id] = wait(tid)
	}
	for id, want := range map[string]struct {
		status protocol.State
		calls  int
	}{
		"ok-1": {protocol.StateSuccess, 1}, "ok-2": {protocol.StateSuccess, 1}, "ok-3": {protocol.StateSuccess, 1},
		"flaky":     {protocol.StateSuccess, 2}, // 503, then sent
		"throttled": {protocol.StateSuccess, 2}, // 429, Retry-After, then sent
		"doomed":    {protocol.StateFailure, 3}, // 503 three times: MaxRetries 2
		"bad":       {protocol.StateFailure, 1}, // 400 is never retried
		"":          {protocol.StateFailure, 0}, // no message_id: the task never calls
	} {
		key := id
		if id == "" {
			key = "no-id"
		}
		if m := results[key]; m.Status != want.status {
			t.Errorf("%s: %s %v, want %s", key, m.Status, m.Result, want.status)
		}
		api.mu.Lock()
		if got := api.calls[id]; got != want.calls {
			t.Errorf("%s: %d requests to the provider, want %d", key, got, want.calls)
		}
		api.mu.Unlock()
	}
	if r, ok := results["ok-1"].Result.(map[string]any); !ok || r["message_id"] != "ok-1" || r["sid"] == "" {
		t.Errorf("ok-1 result %v", results["ok-1"].Result)
	}

	// A second task for a message already sent is answered from the
	// idempotency record, without another request.
	again := wait(send("ok-1", good))
	if again.Status != protocol.StateSuccess || again.Result.(map[string]any)["sid"] != results["ok-1"].Result.(map[string]any)["sid"] {
		t.Errorf("duplicate of ok-1: %s %v, want the first send's result", again.Status, again.Result)
	}
	for _, r := range api.api.Records() {
		if r.IdempotencyKey != r.MessageID {
			t.Errorf("request for %s carried Idempotency-Key %q", r.MessageID, r.IdempotencyKey)
		}
	}
	api.mu.Lock()
	if n := api.calls["ok-1"]; n != 1 {
		t.Errorf("ok-1 reached the provider %d times", n)
	}
	api.mu.Unlock()

	// The messages that failed for good are dead letters, ready for replay.
	dead, err := tr.DeadLetters(ctx, "sms", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, d := range dead {
		id, _ := d.Message.Headers["id"].(string)
		got[id] = true
	}
	for _, id := range []string{"doomed", "bad", "no-id"} {
		if !got[tasks[id]] {
			t.Errorf("%s is not dead-lettered (dead letters: %v)", id, got)
		}
	}
	if len(dead) != 3 {
		t.Errorf("%d dead letters, want 3", len(dead))
	}
}
