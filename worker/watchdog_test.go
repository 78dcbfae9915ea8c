package worker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// grayTransport is the in-memory transport whose consumers can go gray:
// connected, not failing, and delivering nothing more, as a consumer the
// broker cancelled silently or one wedged behind a half-dead link.
type grayTransport struct {
	*memory.Transport
	mu     sync.Mutex
	builds int
	cur    *grayConsumer
}

func (g *grayTransport) Consume(ctx context.Context, qs []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	c, err := g.Transport.Consume(ctx, qs, opts)
	if err != nil {
		return nil, err
	}
	gc := &grayConsumer{Consumer: c, out: make(chan *transport.Delivery), grayed: make(chan struct{}), stopped: make(chan struct{})}
	go gc.forward()
	g.mu.Lock()
	g.builds++
	g.cur = gc
	g.mu.Unlock()
	return gc, nil
}

// goGray makes the current consumer deliver nothing more.
func (g *grayTransport) goGray() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.cur.grayed)
}

func (g *grayTransport) consumersBuilt() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.builds
}

type grayConsumer struct {
	transport.Consumer
	out     chan *transport.Delivery
	grayed  chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func (c *grayConsumer) Deliveries() <-chan *transport.Delivery { return c.out }

func (c *grayConsumer) Stop(ctx context.Context) error {
	c.once.Do(func() { close(c.stopped) })
	return c.Consumer.Stop(ctx)
}

func (c *grayConsumer) forward() {
	defer close(c.out)
	for {
		select {
		case <-c.grayed:
			// What the broker handed to the gray consumer goes back to the
			// queue when the consumer is stopped, as a closed channel's
			// unacknowledged messages do.
			<-c.stopped
			for d := range c.Consumer.Deliveries() {
				_ = d.Reject(context.Background(), true)
			}
			return
		case d, ok := <-c.Consumer.Deliveries():
			if !ok {
				return
			}
			select {
			case c.out <- d:
			case <-c.grayed:
				_ = d.Reject(context.Background(), true)
			}
		}
	}
}

// restartCounter counts consumer restarts by reason.
type restartCounter struct {
	lossCounter
	mu      sync.Mutex
	reasons map[string]int
	total   atomic.Int32
}

func (r *restartCounter) ConsumerRestarted(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reasons == nil {
		r.reasons = map[string]int{}
	}
	r.reasons[reason]++
	r.total.Add(1)
}

// watchdogHarness is a synctest harness whose worker consumes through a
// grayTransport, with a 10 s watchdog and a restart counter.
func watchdogHarness(t *testing.T, cfg worker.Config) (*harness, *grayTransport, *restartCounter) {
	rc := &restartCounter{}
	if cfg.ConsumerWatchdog == 0 {
		cfg.ConsumerWatchdog = 10 * time.Second
	}
	cfg.Observer = rc
	h := newHarness(t, cfg)
	h.waitLimit = 24 * time.Hour
	gt := &grayTransport{Transport: h.tr}
	h.wrap = func(transport.Transport) transport.Transport { return gt }
	h.mux.HandleFunc("tasks.add", add)
	return h, gt, rc
}

// A consumer that goes gray with messages waiting is rebuilt within the
// watchdog's bound; every message runs, readiness reports the stall
// meanwhile, and the restart is counted with its reason. Without the
// watchdog the same stall lasts forever.
func TestWatchdogRebuildsAStalledConsumer(t *testing.T) {
	for _, on := range []bool{true, false} {
		name := "watchdog"
		if !on {
			name = "no watchdog"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := worker.Config{Concurrency: 1, PrefetchMultiplier: 1}
				if !on {
					cfg.ConsumerWatchdog = -1
				}
				h, gt, rc := watchdogHarness(t, cfg)
				h.start()
				if m := h.wait(h.send("tasks.add", []any{int64(1), int64(1)}, nil)); m.Result != int64(2) {
					t.Fatalf("before the stall: %v", m.Result)
				}
				gt.goGray()
				var ids []string
				for i := range 5 {
					ids = append(ids, h.send("tasks.add", []any{int64(i), int64(1)}, nil))
				}
				// Past one period of silence, the first sighting of ready
				// messages arms the watchdog and the next one, a quarter
				// period later, restarts the consumer.
				time.Sleep(15 * time.Second)
				synctest.Wait()
				if !on {
					time.Sleep(time.Hour)
					synctest.Wait()
					if m, _ := h.be.Get(context.Background(), ids[0]); m != nil && m.Status.Ready() {
						t.Fatalf("without the watchdog a task ran anyway: %s", m.Status)
					}
					if gt.consumersBuilt() != 1 || rc.total.Load() != 0 {
						t.Fatalf("%d consumers built, %d restarts, want 1 and 0", gt.consumersBuilt(), rc.total.Load())
					}
					gt.mu.Lock()
					gt.cur.once.Do(func() { close(gt.cur.stopped) }) // let the harness stop
					gt.mu.Unlock()
					return
				}
				time.Sleep(time.Minute)
				for i, id := range ids {
					if m := h.wait(id); m.Result != int64(i+1) {
						t.Fatalf("task %d after the restart: %v", i, m.Result)
					}
				}
				if got := rc.reasons["no-progress"]; got != 1 || gt.consumersBuilt() != 2 {
					t.Fatalf("restarts %v, consumers built %d; want 1 no-progress restart, 2 consumers", rc.reasons, gt.consumersBuilt())
				}
				if err := h.w.ConsumerHealth(); err != nil {
					t.Fatalf("ConsumerHealth after the rebuild: %v", err)
				}
				synctest.Wait()
				if st := h.tr.Broker().Stats(); st.Unacked != 0 || st.Ready != 0 {
					t.Fatalf("broker after the run: %+v, want nothing ready or unacknowledged", st)
				}
			})
		})
	}
}

// While the stall is being repaired, ConsumerHealth says so (for /readyz).
func TestWatchdogReportsTheStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, gt, _ := watchdogHarness(t, worker.Config{Concurrency: 1, PrefetchMultiplier: 1})
		// Building the new consumer blocks until released: the stall is
		// visible meanwhile.
		release := make(chan struct{})
		h.wrap = func(transport.Transport) transport.Transport {
			return &slowRebuild{grayTransport: gt, release: release}
		}
		h.start()
		h.wait(h.send("tasks.add", []any{int64(1), int64(1)}, nil))
		gt.goGray()
		for i := range 3 {
			h.send("tasks.add", []any{int64(i), int64(1)}, nil)
		}
		time.Sleep(15 * time.Second)
		synctest.Wait()
		if err := h.w.ConsumerHealth(); err == nil {
			t.Fatal("ConsumerHealth = nil while the stalled consumer is rebuilt")
		}
		close(release)
		synctest.Wait()
		if err := h.w.ConsumerHealth(); err != nil {
			t.Fatalf("ConsumerHealth after the rebuild: %v", err)
		}
	})
}

type slowRebuild struct {
	*grayTransport
	release chan struct{}
	n       int
}

func (s *slowRebuild) Consume(ctx context.Context, qs []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	if s.n++; s.n > 1 {
		<-s.release
	}
	return s.grayTransport.Consume(ctx, qs, opts)
}

// Legitimate idleness is never a stall: with messages ready at the broker
// (or none), each of these workers receives nothing for an hour and the
// watchdog, at 10 s, restarts nothing.
func TestWatchdogNoFalsePositive(t *testing.T) {
	cases := []struct {
		name string
		cfg  worker.Config
		run  func(t *testing.T, h *harness)
	}{
		{
			// The prefetch window is full of countdown tasks (ETATaskLimit
			// stops it growing): the broker rightly sends nothing more.
			name: "prefetch full of ETA tasks",
			cfg:  worker.Config{Concurrency: 1, PrefetchMultiplier: 1, ETATaskLimit: 1},
			run: func(t *testing.T, h *harness) {
				for range 6 {
					h.send("tasks.add", []any{int64(1), int64(1)}, nil, client.Countdown(2*time.Hour))
				}
			},
		},
		{
			// Received tasks wait for their rate limit and fill the window.
			name: "rate limit",
			cfg:  worker.Config{Concurrency: 2, PrefetchMultiplier: 1},
			run: func(t *testing.T, h *harness) {
				for range 8 {
					h.send("tasks.limited", nil, nil)
				}
			},
		},
		{
			// Strict order: a long task of the first queue holds the only
			// slot, and the second queue's tasks wait their turn.
			name: "strict queue order",
			cfg:  worker.Config{Concurrency: 1, PrefetchMultiplier: 1, Queues: []string{"q", "low"}, QueueOrder: worker.QueueOrderStrict},
			run: func(t *testing.T, h *harness) {
				h.send("tasks.long", nil, nil)
				for range 5 {
					h.send("tasks.add", []any{int64(1), int64(1)}, nil, client.Queue("low"))
				}
			},
		},
		{
			// cancel_consumer: the queue is not consumed, whatever it holds.
			name: "paused consumer",
			cfg:  worker.Config{Concurrency: 1},
			run: func(t *testing.T, h *harness) {
				if r := worker.CancelConsumer(h.w, "q"); r["ok"] == nil {
					t.Fatalf("cancel_consumer: %v", r)
				}
				for range 5 {
					h.send("tasks.add", []any{int64(1), int64(1)}, nil)
				}
			},
		},
		{
			name: "empty queue",
			cfg:  worker.Config{Concurrency: 1},
			run:  func(t *testing.T, h *harness) {},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, gt, rc := watchdogHarness(t, c.cfg)
				h.mux.HandleFunc("tasks.limited", add, worker.RateLimit("1/h"))
				h.mux.HandleFunc("tasks.long", func(ctx context.Context, t *worker.Task) (any, error) {
					select {
					case <-time.After(2 * time.Hour):
					case <-ctx.Done():
					}
					return nil, nil
				})
				h.start()
				synctest.Wait()
				c.run(t, h)
				time.Sleep(time.Hour)
				synctest.Wait()
				if n := rc.total.Load(); n != 0 || gt.consumersBuilt() != 1 {
					t.Fatalf("%d restarts, %d consumers built; want 0 and 1", n, gt.consumersBuilt())
				}
				if err := h.w.ConsumerHealth(); err != nil {
					t.Fatalf("ConsumerHealth: %v", err)
				}
				// The idleness was real: the broker still holds messages
				// (except for the empty queue).
				ready := 0
				for _, q := range h.cfg.Queues {
					n, _ := h.tr.Len(context.Background(), q)
					ready += n
				}
				if ready == 0 && c.name != "empty queue" {
					t.Fatalf("no message left ready at the broker: the case did not exercise the watchdog")
				}
			})
		})
	}
}
