package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/client"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
)

// TestHAClusterScaleOut: 1, 2 and 4 celeriac worker processes drain the
// same backlog from one quorum queue replicated on the 3 nodes of the
// test cluster (each process 4 slots, acks_late, an effect recorded in
// Redis per task). It prints the throughput and the CPU the 3 RabbitMQ
// nodes spent per task, for docs/performance.md. On 2 shared
// cores the point is where the broker saturates; nothing is asserted on
// the figures, only that every task ran once.
func TestHAClusterScaleOut(t *testing.T) {
	c := rabbitCluster(t)
	const m = 5000 // tasks per run
	var lines []string
	for _, procs := range []int{1, 2, 4} {
		r := newHARun(t, fmt.Sprintf("scale%d", procs), m)
		declareQuorum(t, c.url(0), r.queue)
		publishRecords(t, c.urls(0), r.queue, m)
		r.sample()
		var ps []*fltProc
		for i := range procs {
			ps = append(ps, startFltWorker(t, fltWorkerConfig{Broker: c.urls(i % 3), Effects: redisDBURL(t, fltEffectDB),
				Prefix: r.prefix, Queue: r.queue, Name: fmt.Sprintf("%s-%d", r.queue, i), Hostname: fmt.Sprintf("w%d@%s", i, r.queue),
				Concurrency: 4, QueueArguments: map[string]map[string]any{r.queue: {"x-queue-type": "quorum"}}}))
		}
		from := r.waitCount(m/10, 3*time.Minute, ps...)
		cpu0, n0 := c.cpu(), r.fr.effectCount()
		to := r.waitCount(m*9/10, 3*time.Minute, ps...)
		cpu1, n1 := c.cpu(), r.fr.effectCount()
		rate := r.rate(from, to)
		perTask := (cpu1 - cpu0) / time.Duration(max(n1-n0, 1))
		r.waitCount(m, 3*time.Minute, ps...)
		r.finish()
		lost, dups, _, _ := r.counts()
		if lost != 0 || dups != 0 {
			t.Errorf("%d processes: %d lost, %d duplicate effects", procs, lost, dups)
		}
		for _, p := range ps {
			if err := p.Term(60 * time.Second); err != nil {
				t.Errorf("worker after SIGTERM: %v\n%s", err, tail(p.Log(), 20))
			}
		}
		lines = append(lines, fmt.Sprintf("%d process(es): %.0f tasks/s, broker CPU %.2f ms/task", procs, rate, float64(perTask)/1e6))
	}
	t.Logf("COUNTS rabbitmq cluster scale-out (%d tasks per run, quorum queue on 3 nodes, 4 slots per process, acks_late): %s",
		m, strings.Join(lines, "; "))
}

// declareQuorum declares queue as Celery 5.5 does with quorum queues: a
// direct exchange of the same name and a quorum queue bound to it.
func declareQuorum(t *testing.T, url, queue string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(queue, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp091.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, queue, queue, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(queue, false, false)
		}
	})
}

// publishRecords publishes n flt.record tasks (keys k0..k<n-1>, no sleep)
// with celeriac's producer, 16 at a time, each confirmed by the broker.
func publishRecords(t *testing.T, urls, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{URL: urls, ConnectionName: queue + "-publisher"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	p := client.New(tr, client.Config{DefaultQueue: queue})
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, err := p.Send(ctx, "flt.record", []any{fmt.Sprintf("k%d", i), 0}, nil, client.Exchange(queue, queue, "")); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("publish: %v", err)
	}
}
