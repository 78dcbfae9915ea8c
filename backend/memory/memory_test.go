package memory_test

import (
	"errors"
	"testing"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return memory.New() }, backendtest.Features{Chords: true})
}

func TestWait(t *testing.T) {
	be := memory.New()
	defer be.Close()
	ctx := t.Context()
	done := make(chan *protocol.ResultMeta, 1)
	errc := make(chan error, 1)
	go func() {
		m, err := be.Wait(ctx, "t1")
		errc <- err
		done <- m
	}()
	for _, st := range []protocol.State{protocol.StateStarted, protocol.StateRetry, protocol.StateSuccess} {
		if err := be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t1", Status: st, Result: string(st)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if m := <-done; m.Status != protocol.StateSuccess || m.Result != "SUCCESS" {
		t.Fatalf("Wait returned %+v, want the SUCCESS", m)
	}
}

func TestWaitClosed(t *testing.T) {
	be := memory.New()
	errc := make(chan error, 1)
	go func() {
		_, err := be.Wait(t.Context(), "never")
		errc <- err
	}()
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Wait after Close: %v, want ErrClosed", err)
	}
}

func TestStoreCopies(t *testing.T) {
	be := memory.New()
	defer be.Close()
	res := []any{"a", map[string]any{"k": "v"}}
	m := &protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess, Result: res}
	if err := be.Store(t.Context(), backend.StoreRequest{Meta: m}); err != nil {
		t.Fatal(err)
	}
	res[0] = "changed"
	res[1].(map[string]any)["k"] = "changed"
	got, err := be.Get(t.Context(), "t")
	if err != nil {
		t.Fatal(err)
	}
	r := got.Result.([]any)
	if r[0] != "a" || r[1].(map[string]any)["k"] != "v" {
		t.Fatalf("stored result changed with the caller's value: %#v", r)
	}
}

func TestChordPartUnencodable(t *testing.T) {
	be := memory.New()
	defer be.Close()
	_, err := be.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: "g", TaskID: "t", State: protocol.StateSuccess, Result: make(chan int)})
	if err == nil {
		t.Fatal("ChordPartReturn accepted a result that cannot be encoded")
	}
}
