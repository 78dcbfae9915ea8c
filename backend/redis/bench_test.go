package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// The Store benchmarks write typical small SUCCESS documents. Compare with
// BenchmarkBareMulti, the loop perf-anchors.md §3 measured (MULTI SETEX
// PUBLISH EXEC per result, without the SUCCESS check): run them together,
//
//	go test -run '^$' -bench 'Store|BareMulti' -benchtime 20000x ./backend/redis
//
// "concurrent64" runs 64 goroutines; group commit shares round trips
// between them, "nobatch" (MaxBatch 1) shows the cost without it.

const benchWriters = 64

func benchMeta(id string) *protocol.ResultMeta {
	return &protocol.ResultMeta{
		TaskID: id, Status: protocol.StateSuccess, Result: int64(42), Children: []any{},
		DateDone: time.Date(2026, 11, 29, 13, 13, 55, 990025000, time.UTC),
	}
}

func BenchmarkStore(b *testing.B) {
	for _, bc := range []struct {
		name     string
		maxBatch int
		writers  int
	}{
		{"serial", 0, 1},
		{"concurrent64", 0, benchWriters},
		{"concurrent64-nobatch", 1, benchWriters},
	} {
		b.Run(bc.name, func(b *testing.B) {
			be, _ := newTest(b, Config{MaxBatch: bc.maxBatch, ResultExpires: time.Hour})
			ctx := context.Background()
			var n atomic.Int64
			store := func() error {
				id := fmt.Sprintf("bench-%d", n.Add(1))
				return be.Store(ctx, backend.StoreRequest{Meta: benchMeta(id)})
			}
			run(b, bc.writers, store)
		})
	}
}

func BenchmarkBareMulti(b *testing.B) {
	for _, bc := range []struct {
		name    string
		writers int
	}{{"serial", 1}, {"concurrent64", benchWriters}} {
		b.Run(bc.name, func(b *testing.B) {
			be, raw := newTest(b, Config{})
			ctx := context.Background()
			var n atomic.Int64
			store := func() error {
				id := fmt.Sprintf("bench-%d", n.Add(1))
				key := be.TaskKey(id)
				// Encoding is part of the work in both benchmarks.
				val, err := protocol.EncodeResult(benchMeta(id), protocol.ContentTypeJSON)
				if err != nil {
					return err
				}
				_, err = raw.TxPipelined(ctx, func(p goredis.Pipeliner) error {
					p.SetEx(ctx, key, val, time.Hour)
					p.Publish(ctx, key, val)
					return nil
				})
				return err
			}
			run(b, bc.writers, store)
		})
	}
}

// run calls store b.N times from the given number of goroutines and
// reports the rate.
func run(b *testing.B, writers int, store func() error) {
	b.Helper()
	b.ReportAllocs()
	b.ResetTimer()
	if writers == 1 {
		for range b.N {
			if err := store(); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		var left atomic.Int64
		left.Store(int64(b.N))
		errs := make(chan error, writers)
		done := make(chan struct{})
		for range writers {
			go func() {
				defer func() { done <- struct{}{} }()
				for left.Add(-1) >= 0 {
					if err := store(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		for range writers {
			<-done
		}
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "stores/s")
}
