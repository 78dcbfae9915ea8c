package backendtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
)

// A Faulty with no fault set must be indistinguishable from what it wraps.
func TestFaultyConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return backendtest.NewFaulty(memory.New()).Chords().(backend.Backend)
	}, backendtest.Features{Chords: true})
}

func TestFaultyFailNext(t *testing.T) {
	ctx := context.Background()
	f := backendtest.NewFaulty(memory.New())
	defer f.Close()
	f.FailNext(backendtest.OpStore, 2, nil)
	req := backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess, Result: int64(1)}}
	for i := 0; i < 2; i++ {
		if err := f.Store(ctx, req); !errors.Is(err, backendtest.ErrInjected) {
			t.Fatalf("store %d = %v, want ErrInjected", i, err)
		}
		if _, err := f.Get(ctx, "t"); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("a failed store wrote something: %v", err)
		}
	}
	if err := f.Store(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := f.Calls(backendtest.OpStore); got != 3 {
		t.Fatalf("calls = %d, want 3", got)
	}
	if backendtest.NewFaulty(noChords{}).Chords() != nil {
		t.Fatal("Chords() of a backend without chords is not nil")
	}
}

type noChords struct{ backend.Backend }
