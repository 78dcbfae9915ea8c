package redis

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// drainN is the message count of the drain benchmarks (perf-anchors.md §3).
const drainN = 20000

// preload LPUSHes n Python-formatted task envelopes onto queue.
func preload(b *testing.B, e *env, queue string, n int) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 1000 {
		_, err := e.raw.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for j := i; j < min(i+1000, n); j++ {
				p.LPush(ctx, e.key(queue), pyEnvelope(newTag(), queue, 0, j))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrain preloads 20 000 messages and drains them through the
// transport: batched atomic pops with kombu's unacked bookkeeping, envelope
// decoding, and acks from 64 concurrent handlers (group-committed) with a
// prefetch of 256 (Celery's concurrency x 4).
func BenchmarkDrain(b *testing.B) {
	benchDrain(b, 64, 256)
}

func BenchmarkDrainHandlers(b *testing.B) {
	for _, h := range []int{8, 256} {
		for _, p := range []int{256, 4096} {
			b.Run(fmt.Sprintf("h%d-p%d", h, p), func(b *testing.B) { benchDrain(b, h, p) })
		}
	}
}

func benchDrain(b *testing.B, handlers, prefetch int) {
	e := newEnv(b)
	cfg := e.config()
	cfg.Logger = nil
	tr := e.dial(cfg)
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		preload(b, e, "rt_bench", drainN)
		b.StartTimer()
		total += drainTransport(b, e, tr, handlers, prefetch)
	}
	b.ReportMetric(float64(drainN*b.N)/total.Seconds(), "msg/s")
}

// drainTransport consumes drainN preloaded messages and acks them from
// concurrent handlers; it returns the time from Consume to the last ack.
func drainTransport(b *testing.B, e *env, tr *Transport, handlers, prefetch int) time.Duration {
	ctx := context.Background()
	start := time.Now()
	c, err := tr.Consume(ctx, []transport.Queue{{Name: "rt_bench"}}, transport.ConsumeOptions{Prefetch: prefetch})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	finished := make(chan struct{})
	for range handlers {
		wg.Go(func() {
			for d := range c.Deliveries() {
				if d.Message.Headers["task"] != "tasks.add" {
					b.Error("bad delivery")
				}
				if err := d.Ack(ctx); err != nil {
					b.Error(err)
				}
				mu.Lock()
				done++
				if done == drainN {
					close(finished)
				}
				mu.Unlock()
			}
		})
	}
	<-finished
	elapsed := time.Since(start)
	if err := c.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	wg.Wait()
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		b.Fatalf("unacked = %d after drain", n)
	}
	return elapsed
}

// BenchmarkDrainBareLoop is the ceiling of perf-anchors.md §3 ("RPOP key
// 256 + kombu bookkeeping pipelined"): pop 256, decode each envelope,
// one MULTI/EXEC pipeline of ZADD+HSET for the batch, then one of
// ZREM+HDEL. It
// has no prefetch accounting, no delivery channel and no atomicity between
// the pop and the record; BenchmarkDrain is measured against it.
func BenchmarkDrainBareLoop(b *testing.B) {
	e := newEnv(b)
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		preload(b, e, "rt_bench", drainN)
		b.StartTimer()
		total += drainBare(b, e)
	}
	b.ReportMetric(float64(drainN*b.N)/total.Seconds(), "msg/s")
}

// BenchmarkDrainPaired alternates the bare loop and the transport on the
// same preloaded messages (A B A B ...), so that both see the same broker
// load, and reports both rates and their ratio.
func BenchmarkDrainPaired(b *testing.B) {
	e := newEnv(b)
	cfg := e.config()
	cfg.Logger = nil
	tr := e.dial(cfg)
	var bare, ours, bareCPU, oursCPU time.Duration
	for b.Loop() {
		b.StopTimer()
		preload(b, e, "rt_bench", drainN)
		b.StartTimer()
		c0 := cpuTime()
		bare += drainBare(b, e)
		bareCPU += cpuTime() - c0
		b.StopTimer()
		preload(b, e, "rt_bench", drainN)
		b.StartTimer()
		c0 = cpuTime()
		ours += drainTransport(b, e, tr, 64, 256)
		oursCPU += cpuTime() - c0
	}
	b.ReportMetric(float64(bareCPU.Microseconds())/float64(drainN*b.N), "bare-cpu-us/msg")
	b.ReportMetric(float64(oursCPU.Microseconds())/float64(drainN*b.N), "transport-cpu-us/msg")
	b.ReportMetric(float64(drainN*b.N)/bare.Seconds(), "bare-msg/s")
	b.ReportMetric(float64(drainN*b.N)/ours.Seconds(), "transport-msg/s")
	b.ReportMetric(bare.Seconds()/ours.Seconds(), "ratio")
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drainBare drains drainN preloaded messages with the bare loop.
func drainBare(b *testing.B, e *env) time.Duration {
	ctx := context.Background()
	unacked, index := e.key("unacked"), e.key("unacked_index")
	start := time.Now()
	done := 0
	for done < drainN {
		items, err := e.raw.RPopCount(ctx, e.key("rt_bench"), 256).Result()
		if err != nil {
			b.Fatal(err)
		}
		tags := make([]string, 0, len(items))
		_, err = e.raw.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			now := scoreFloat(time.Now())
			for _, it := range items {
				env, err := protocol.DecodeEnvelope([]byte(it), protocol.DecodeOptions{})
				if err != nil || env.Message.Headers["task"] != "tasks.add" {
					b.Fatal("bad envelope", err)
				}
				tags = append(tags, env.DeliveryTag)
				p.ZAdd(ctx, index, goredis.Z{Score: now, Member: env.DeliveryTag})
				p.HSet(ctx, unacked, env.DeliveryTag, unackedValue([]byte(it), "", "rt_bench"))
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		_, err = e.raw.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			for _, tag := range tags {
				p.ZRem(ctx, index, tag)
				p.HDel(ctx, unacked, tag)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		done += len(items)
	}
	return time.Since(start)
}
