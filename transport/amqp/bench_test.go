package amqp

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// BenchmarkConsumeAck drains b.N preloaded Celery task messages with
// prefetch 256, reading the task name and id and acking each, through
// celeriac's transport and through a bare amqp091-go loop (the ceiling
// measured in perf-anchors.md §3, about 18 700 msg/s there). Both run in
// the same invocation, so they can be compared:
//
//	go test -run '^$' -bench ConsumeAck -benchtime 20000x -count 5 ./transport/amqp
func BenchmarkConsumeAck(b *testing.B) {
	b.Run("celeriac", func(b *testing.B) {
		h := newHarness(b, Config{})
		q := h.q("bench")
		a := newAdmin(b)
		a.cleanup([]string{q}, []string{q})
		ctx := context.Background()
		// Declare as the transport does, then preload.
		c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		preload(b, q, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		c, err = h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 256})
		if err != nil {
			b.Fatal(err)
		}
		drainAcking(b, c, b.N)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		if err := c.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("amqp091", func(b *testing.B) {
		name := uniqueName(b)
		q := name + "_bench"
		a := newAdmin(b)
		a.cleanup([]string{q}, nil)
		a.declare(q, nil)
		preload(b, q, b.N)
		conn, err := amqp091.Dial(transporttest.AMQPURL(b))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		b.ReportAllocs()
		b.ResetTimer()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Qos(256, 0, true); err != nil {
			b.Fatal(err)
		}
		dels, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		drainBareAcking(b, dels, b.N)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	})
}

// BenchmarkConsumeAckPaired measures both consumers within each benchmark
// run (see pairedRun), each reading the task name and id of every delivery
// and acking it before the next. It reports each side's rate and their
// ratio:
//
//	go test -run '^$' -bench ConsumeAckPaired -benchtime 20000x -count 5 ./transport/amqp
func BenchmarkConsumeAckPaired(b *testing.B) {
	pairedRun(b, "paired", func(c transport.Consumer, n int) { drainAcking(b, c, n) },
		func(dels <-chan amqp091.Delivery, n int) { drainBareAcking(b, dels, n) })
}

// drainAcking takes n deliveries from c, reading each one's task name and
// id and acking it before the next.
func drainAcking(b *testing.B, c transport.Consumer, n int) {
	ctx := context.Background()
	for range n {
		d := <-c.Deliveries()
		task, _ := d.Message.Headers["task"].(string)
		id, _ := d.Message.Headers["id"].(string)
		if task == "" || id == "" {
			b.Fatal("no task name or id")
		}
		if err := d.Ack(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// drainBareAcking is drainAcking on a bare amqp091 consumer.
func drainBareAcking(b *testing.B, dels <-chan amqp091.Delivery, n int) {
	for range n {
		d := <-dels
		task, _ := d.Headers["task"].(string)
		id, _ := d.Headers["id"].(string)
		if task == "" || id == "" {
			b.Fatal("no task name or id")
		}
		if err := d.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
}

// pairedRun preloads four queues with b.N/2 messages each and drains them
// in the order celeriac, amqp091, amqp091, celeriac, with prefetch 256, so
// that load drifting on a shared machine affects both consumers alike.
// drainCeleriac and drainBare each consume n deliveries of one queue. It
// checks the queues are empty after, and reports each side's rate, its
// CPU per message and their ratio.
func pairedRun(b *testing.B, prefix string, drainCeleriac func(c transport.Consumer, n int), drainBare func(dels <-chan amqp091.Delivery, n int)) {
	h := newHarness(b, Config{})
	a := newAdmin(b)
	half := max(b.N/2, 1)
	var queues [4]string
	for i := range queues {
		queues[i] = h.q(prefix + strconv.Itoa(i))
		a.cleanup([]string{queues[i]}, []string{queues[i]})
		a.declare(queues[i], nil)
		preload(b, queues[i], half)
	}
	conn, err := amqp091.Dial(transporttest.AMQPURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	var celeriac, bare, celeriacCPU, bareCPU time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i, q := range queues {
		start, startCPU := time.Now(), cpuTime(b)
		if i == 0 || i == 3 {
			c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 256})
			if err != nil {
				b.Fatal(err)
			}
			drainCeleriac(c, half)
			celeriac += time.Since(start)
			celeriacCPU += cpuTime(b) - startCPU
			if err := c.Stop(ctx); err != nil {
				b.Fatal(err)
			}
			continue
		}
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if err := ch.Qos(256, 0, true); err != nil {
			b.Fatal(err)
		}
		dels, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		drainBare(dels, half)
		bare += time.Since(start)
		bareCPU += cpuTime(b) - startCPU
		_ = ch.Close()
	}
	b.StopTimer()
	for _, q := range queues {
		if n := a.ready(q); n != 0 {
			b.Fatalf("queue %s: %d messages left after the drain", q, n)
		}
	}
	b.ReportMetric(float64(2*half)/celeriac.Seconds(), "celeriac-msg/s")
	b.ReportMetric(float64(2*half)/bare.Seconds(), "amqp091-msg/s")
	b.ReportMetric(bare.Seconds()/celeriac.Seconds(), "celeriac/amqp091")
	b.ReportMetric(float64(celeriacCPU.Microseconds())/float64(2*half), "celeriac-cpu-µs/msg")
	b.ReportMetric(float64(bareCPU.Microseconds())/float64(2*half), "amqp091-cpu-µs/msg")
}

// cpuTime is the process's user+system CPU time so far. Under a loaded
// machine it says more about a consumer's cost than its wall-clock rate.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// preload publishes n Celery-like task messages to q with pipelined
// publisher confirms.
func preload(b testing.TB, q string, n int) {
	b.Helper()
	conn, err := amqp091.Dial(transporttest.AMQPURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	var last *amqp091.DeferredConfirmation
	for i := range n {
		id := "b0000000-0000-0000-0000-" + strconv.Itoa(100000000000+i)
		p := amqp091.Publishing{
			ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: 2,
			CorrelationId: id, ReplyTo: "2731d639-4e7d-349f-9ccc-abfd40bea425",
			Headers: amqp091.Table{
				"lang": "py", "task": "bench.noop", "id": id, "shadow": nil, "eta": nil, "expires": nil,
				"group": nil, "group_index": nil, "retries": int32(0), "timelimit": []any{nil, nil},
				"root_id": id, "parent_id": nil, "argsrepr": "(" + strconv.Itoa(i) + ",)", "kwargsrepr": "{}",
				"origin": "gen1@bench", "ignore_result": false,
			},
			Body: []byte("[[" + strconv.Itoa(i) + `], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
		}
		last, err = ch.PublishWithDeferredConfirm("", q, false, false, p)
		if err != nil {
			b.Fatal(err)
		}
	}
	if last != nil && !last.Wait() {
		b.Fatal("preload nacked")
	}
}

// BenchmarkConsumeAckWorkers is BenchmarkConsumeAckPaired with the acks
// sent as celeriac's worker sends them: each delivery goes to a goroutine of
// its own, at most 100 at a time (-c 100), which acks it (AckAsync, then
// its wait, as an early ack does) while the next deliveries arrive. The
// bare loop's deliveries are acked the same way, one basic.ack each.
//
//	go test -run '^$' -bench ConsumeAckWorkers -benchtime 20000x -count 5 ./transport/amqp
func BenchmarkConsumeAckWorkers(b *testing.B) {
	ctx := context.Background()
	var failed atomic.Int64
	// each runs ack in a goroutine of its own, at most 100 at a time.
	each := func(n int, next func() func() error) {
		slots := make(chan struct{}, 100)
		var wg sync.WaitGroup
		for range n {
			ack := next()
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				if err := ack(); err != nil {
					failed.Add(1)
				}
			})
		}
		wg.Wait()
	}
	pairedRun(b, "workers", func(c transport.Consumer, n int) {
		each(n, func() func() error {
			d := <-c.Deliveries()
			return func() error {
				wait, err := d.AckAsync(ctx)
				if err == nil {
					err = wait(ctx)
				}
				return err
			}
		})
	}, func(dels <-chan amqp091.Delivery, n int) {
		each(n, func() func() error {
			d := <-dels
			return func() error { return d.Ack(false) }
		})
	})
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d acks failed", n)
	}
}

// BenchmarkMessageFromDelivery converts a received Celery task delivery
// (protocol 2 headers as Celery 5.2 sends them) to a protocol.Message, as
// the consumer does for every delivery. Each conversion gets a header
// table of its own, as amqp091 reads a new one for every message; making
// them is outside the timer.
//
//	go test -run '^$' -bench MessageFromDelivery -count 6 ./transport/amqp
func BenchmarkMessageFromDelivery(b *testing.B) {
	headers := func(i int) amqp091.Table {
		id := "b0000000-0000-0000-0000-" + strconv.Itoa(100000000000+i)
		return amqp091.Table{
			"lang": "py", "task": "bench.noop", "id": id, "shadow": nil, "eta": nil, "expires": nil,
			"group": nil, "group_index": nil, "retries": int32(0), "timelimit": []any{nil, nil},
			"root_id": id, "parent_id": nil, "argsrepr": "(" + strconv.Itoa(i) + ",)", "kwargsrepr": "{}",
			"origin": "gen1@bench", "ignore_result": false,
		}
	}
	ds := make([]amqp091.Delivery, 1000)
	fill := func() {
		for i := range ds {
			ds[i] = amqp091.Delivery{
				ContentType: "application/json", ContentEncoding: "utf-8", DeliveryMode: 2,
				CorrelationId: "c", ReplyTo: "2731d639-4e7d-349f-9ccc-abfd40bea425",
				Headers: headers(i), Body: []byte(`[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
			}
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(ds) == 0 {
			b.StopTimer()
			fill()
			b.StartTimer()
		}
		if _, err := messageFromDelivery(&ds[i%len(ds)]); err != nil {
			b.Fatal(err)
		}
	}
}
