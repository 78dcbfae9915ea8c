package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
//
// It runs on both pops (pop=script, the default, and pop=staged,
// Config.StagedPop) and reports the Redis process's CPU a message (INFO
// cpu: run it against a Redis nobody else uses); compare them with
//
//	go test ./transport/redis -run '^$' -bench '^BenchmarkDrain$' -count 6 | benchstat -col /pop -
func BenchmarkDrain(b *testing.B) {
	for _, staged := range []bool{false, true} {
		name := "pop=script"
		if staged {
			name = "pop=staged"
		}
		b.Run(name, func(b *testing.B) { benchDrain(b, 64, 256, staged) })
	}
}

func BenchmarkDrainHandlers(b *testing.B) {
	for _, h := range []int{8, 256} {
		for _, p := range []int{256, 4096} {
			b.Run(fmt.Sprintf("h%d-p%d", h, p), func(b *testing.B) { benchDrain(b, h, p, false) })
		}
	}
}

func benchDrain(b *testing.B, handlers, prefetch int, staged bool) {
	e := newEnv(b)
	cfg := e.config()
	cfg.Logger = nil
	cfg.StagedPop = staged
	tr := e.dial(cfg)
	var total, redisCPU time.Duration
	for b.Loop() {
		b.StopTimer()
		preload(b, e, "rt_bench", drainN)
		cpu0 := serverCPU(b, e.raw)
		b.StartTimer()
		total += drainTransport(b, e, tr, handlers, prefetch)
		b.StopTimer()
		redisCPU += serverCPU(b, e.raw) - cpu0
		b.StartTimer()
	}
	b.ReportMetric(float64(drainN*b.N)/total.Seconds(), "msg/s")
	b.ReportMetric(float64(redisCPU.Nanoseconds())/1e3/float64(drainN*b.N), "redis-cpu-µs/msg")
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

// BenchmarkSweepIdle measures what the restore sweep costs Redis when
// nothing is due, which is what a sweep every second (a short visibility
// timeout, see Config.SweepPeriod) adds: SET NX of the mutex, one
// ZREVRANGEBYSCORE of the index and the compare-and-delete unlock script.
// The index holds 10 000 entries delivered just now (a busy fleet's
// unacked messages), none due. It reports the server's own time for those
// commands from INFO commandstats (redis-µs/sweep); other clients of the
// shared server using the same commands at the same time add noise, so
// take the smallest of a few runs.
func BenchmarkSweepIdle(b *testing.B) {
	e := newEnv(b)
	cfg := e.config()
	cfg.VisibilityTimeout = 5 * time.Second
	tr, err := Dial(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ctx := context.Background()
	now := float64(time.Now().Add(time.Hour).UnixNano()) / 1e9
	for i := 0; i < 10000; i += 1000 {
		zs := make([]goredis.Z, 0, 1000)
		for j := i; j < i+1000; j++ {
			zs = append(zs, goredis.Z{Score: now, Member: fmt.Sprintf("tag-%d", j)})
		}
		if err := e.raw.ZAdd(ctx, e.key("unacked_index"), zs...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	before := commandUsec(b, e.raw, "set", "zrevrangebyscore", "evalsha")
	b.ResetTimer()
	for range b.N {
		n, err := tr.Sweep(ctx)
		if err != nil || n != 0 {
			b.Fatalf("Sweep = %d, %v; want 0 restored", n, err)
		}
	}
	b.StopTimer()
	after := commandUsec(b, e.raw, "set", "zrevrangebyscore", "evalsha")
	b.ReportMetric((after-before)/float64(b.N), "redis-µs/sweep")
}

// commandUsec sums the usec field of INFO commandstats for the commands.
func commandUsec(b *testing.B, rdb *goredis.Client, cmds ...string) float64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		for _, c := range cmds {
			if !strings.HasPrefix(line, "cmdstat_"+c+":") {
				continue
			}
			for _, f := range strings.Split(strings.TrimSpace(line[len("cmdstat_"+c+":"):]), ",") {
				if k, v, ok := strings.Cut(f, "="); ok && k == "usec" {
					var n float64
					fmt.Sscan(v, &n)
					total += n
				}
			}
		}
	}
	return total
}

// BenchmarkConsumeScriptCost splits the consume script's Redis-side cost
// per message into stages, each a script that does one step more than the
// one before, run on the same batch of Python envelopes: the pop alone,
// the pop with its reply, kombu's unacked record of each message (HSET and
// ZADD) keyed by a made-up tag, the record in kombu's format
// ([envelope, exchange, routing_key]), and the real script, which also
// reads each envelope's delivery tag, exchange and routing key. A last
// stage, staging, is the design without Lua: LMOVE each message into a
// list of the consumer's own, write kombu's records from the client. The
// unacked hash and index already hold 1 000 messages, a worker's window.
// redis-µs/msg is Redis' time in commands (INFO commandstats: a script's
// commands count in its EVALSHA), redis-cpu-µs/msg the Redis process's
// CPU time (INFO cpu, which also counts parsing commands and writing
// replies), so run it against a Redis nobody else uses:
//
//	CELERIAC_REDIS_URL=redis://127.0.0.1:6393 go test ./transport/redis -run '^$' -bench ConsumeScriptCost -count 6
//
// What it shows (docs/performance.md): the step from kombu's record to
// the real script is the part of the cost that atomicity with the pop
// needs; the record itself is what every kombu-compatible consumer pays.
func BenchmarkConsumeScriptCost(b *testing.B) {
	const batch, heldN = 256, 1000
	stages := []struct {
		name, src string
		// run, for a stage without a script: pop and record the batch
		// from the client.
		run func(ctx context.Context, r *goredis.Client, ks []string, prefix string) error
	}{
		{name: "pop", src: `local v = redis.call('RPOP', KEYS[3], ARGV[1]); return #v`},
		{name: "pop+reply", src: `return redis.call('RPOP', KEYS[3], ARGV[1])`},
		{name: "record", src: `local v = redis.call('RPOP', KEYS[3], ARGV[1]); local h, z = {}, {}
for i, x in ipairs(v) do h[#h+1] = ARGV[6]..i; h[#h+1] = x; z[#z+1] = ARGV[2]; z[#z+1] = ARGV[6]..i end
redis.call('HSET', KEYS[1], unpack(h)); redis.call('ZADD', KEYS[2], unpack(z)); return v`},
		{name: "record-kombu", src: `local v = redis.call('RPOP', KEYS[3], ARGV[1]); local h, z = {}, {}
for i, x in ipairs(v) do h[#h+1] = ARGV[6]..i; h[#h+1] = '[' .. x .. ', "", "q"]'; z[#z+1] = ARGV[2]; z[#z+1] = ARGV[6]..i end
redis.call('HSET', KEYS[1], unpack(h)); redis.call('ZADD', KEYS[2], unpack(z)); return v`},
		{name: "consume.lua", src: luaConsume},
		// The staging-list design (docs/performance.md), not built: one
		// LMOVE a message into a list of the consumer's own, then kombu's
		// record written from the client, and the staging list emptied.
		{name: "staging", run: func(ctx context.Context, r *goredis.Client, ks []string, prefix string) error {
			staging := ks[len(ks)-1] + ".staging"
			moves, err := r.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for range batch {
					p.LMove(ctx, ks[2], staging, "RIGHT", "LEFT")
				}
				return nil
			})
			if err != nil {
				return err
			}
			h := make([]any, 0, 2*len(moves))
			z := make([]goredis.Z, 0, len(moves))
			at := scoreFloat(time.Now())
			for i, m := range moves {
				tag := prefix + strconv.Itoa(i+1)
				h = append(h, tag, "["+m.(*goredis.StringCmd).Val()+`, "", "q"]`)
				z = append(z, goredis.Z{Score: at, Member: tag})
			}
			_, err = r.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				p.HSet(ctx, ks[0], h...)
				p.ZAdd(ctx, ks[1], z...)
				p.Del(ctx, staging)
				return nil
			})
			return err
		}},
	}
	for _, st := range stages {
		b.Run(st.name, func(b *testing.B) {
			e := newEnv(b)
			ctx := context.Background()
			run := st.run
			if run == nil {
				scr := goredis.NewScript(st.src)
				run = func(ctx context.Context, r *goredis.Client, ks []string, prefix string) error {
					return scr.Run(ctx, r, ks, batch, score(time.Now()), 1, 4, "1", prefix, "1", "q").Err()
				}
			}
			k := keys{prefix: e.prefix, sep: DefaultSep, steps: []int{0, 3, 6, 9}}
			ks := []string{e.key("unacked"), e.key("unacked_index")}
			for _, s := range k.steps {
				ks = append(ks, e.prefix+k.queueBand("q", s))
			}
			ks = append(ks, e.key("dead.q"))
			// A worker's window of held messages is already recorded, so
			// the records go into a hash table and a skiplist, as in
			// production, not into a small key's listpack.
			held := make([]any, 0, 2*heldN)
			var heldIdx []goredis.Z
			for range heldN {
				tag := newTag()
				held = append(held, tag, "x")
				heldIdx = append(heldIdx, goredis.Z{Score: scoreFloat(time.Now()), Member: tag})
			}
			if err := e.raw.HSet(ctx, ks[0], held...).Err(); err != nil {
				b.Fatal(err)
			}
			if err := e.raw.ZAdd(ctx, ks[1], heldIdx...).Err(); err != nil {
				b.Fatal(err)
			}
			items := make([]any, batch)
			var redisTime, redisCPU time.Duration
			msgs := 0
			for b.Loop() {
				b.StopTimer()
				tags := make([]string, 0, 2*batch)
				for i := range items {
					tag := newTag()
					items[i] = pyEnvelope(tag, "q", 0, i)
					tags = append(tags, tag)
				}
				prefix := newTag()
				for i := range batch {
					tags = append(tags, prefix+strconv.Itoa(i+1))
				}
				if err := e.raw.LPush(ctx, ks[2], items...).Err(); err != nil {
					b.Fatal(err)
				}
				before, beforeCPU := commandTime(b, e.raw), serverCPU(b, e.raw)
				b.StartTimer()
				if err := run(ctx, e.raw, ks, prefix); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				redisCPU += serverCPU(b, e.raw) - beforeCPU
				redisTime += commandTime(b, e.raw) - before
				msgs += batch
				e.raw.HDel(ctx, ks[0], tags...)
				e.raw.ZRem(ctx, ks[1], tags)
				b.StartTimer()
			}
			b.ReportMetric(float64(redisTime.Nanoseconds())/1e3/float64(msgs), "redis-µs/msg")
			b.ReportMetric(float64(redisCPU.Nanoseconds())/1e3/float64(msgs), "redis-cpu-µs/msg")
		})
	}
}

// commandTime is Redis' total time in commands so far (INFO commandstats),
// leaving out INFO itself: a script's commands count in its EVALSHA.
func commandTime(b *testing.B, r *goredis.Client) time.Duration {
	info, err := r.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for l := range strings.SplitSeq(info, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "cmdstat_") || strings.HasPrefix(l, "cmdstat_info:") {
			continue
		}
		_, rest, _ := strings.Cut(l, ":")
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				total += time.Duration(us) * time.Microsecond
			}
		}
	}
	return total
}

// serverCPU is the Redis process's user+system CPU time so far (INFO cpu):
// unlike commandTime it also counts reading and parsing commands and
// writing replies, which a pipeline of many small commands pays for each.
func serverCPU(b *testing.B, r *goredis.Client) time.Duration {
	info, err := r.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for l := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
