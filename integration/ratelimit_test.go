package integration

// Evidence for priorities, queue order and rate limits (issue 7) on real
// brokers with real Python producers:
//
//   - TestRateLimitSMS: examples/sms in 3 worker processes, 50 messages from
//     examples/sms/producer.py, sends counted by the fake provider: the
//     global limit holds 5/s across processes, Celery's per-worker limit
//     multiplies by 3.
//   - TestQueueOrderStrict: 500 low tasks, then 1 high, concurrency 1: how
//     many low tasks start after the high one was published.
//   - TestMessagePriority: apply_async(priority=...) on RabbitMQ
//     (x-max-priority) and Redis (kombu's bands), run in priority order.
//   - TestPerWorkerRateLimit: `celeriac worker --rate-limit tasks.add=10/s`
//     spaces starts and drops nothing.
//
// All of them use Redis db 6 and queue, key and bucket names starting with
// it_rl_; RabbitMQ queues too. They log the numbers they measure.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/examples/sms/smsapi"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// rlRedisDB is the rate-limit evidence's Redis database.
const rlRedisDB = 6

// rlName returns a name no other test uses, under the it_rl_ prefix.
func rlName(kind string) string {
	return fmt.Sprintf("it_rl_%s_%d", kind, time.Now().UnixNano()%1e10)
}

// rlBrokers are the brokers of the order and priority evidence.
func rlBrokers(t *testing.T) []brokerCase {
	r := redisDBURL(t, rlRedisDB)
	return []brokerCase{{"redis", r, r}, {"rabbitmq", amqpURL(t), r}}
}

// cleanRLRedis deletes what the tests and the workers they ran left in
// db 6: queues, bindings, dead letters, results, buckets, unacked entries.
func cleanRLRedis(t *testing.T) {
	t.Helper()
	opt, err := goredis.ParseURL(redisDBURL(t, rlRedisDB))
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	var keys []string
	for _, pat := range []string{"it_rl_*", "_kombu.binding.*", "celeriac.dead.it_rl_*", "celery-task-meta-*",
		"celeriac.ratelimit.it_rl_*", "celeriac.idem.sms.send:it_rl_*", "unacked*"} {
		it := rdb.Scan(ctx, 0, pat, 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}

// startSMSWorker starts an examples/sms worker process and waits until it
// consumes. It gets SIGTERM (a warm shutdown) when the test ends.
func startSMSWorker(t *testing.T, env map[string]string, args ...string) *workerProc {
	t.Helper()
	return startProc(t, "sms worker", "./examples/sms", procOptions{Env: env, Stop: syscall.SIGTERM}, args...)
}

// smsRun is what the fake provider saw during one run.
type smsRun struct {
	requests  int
	perSecond []int
	byStatus  map[int]int
	span      time.Duration
}

func (r smsRun) String() string {
	return fmt.Sprintf("%d requests in %.2f s (%d sent, %d × 429, %d × 503, %d × 400); requests per second %v, at most %d",
		r.requests, r.span.Seconds(), r.byStatus[200], r.byStatus[429], r.byStatus[503], r.byStatus[400], r.perSecond, slices.Max(r.perSecond))
}

// runSMS publishes messages with examples/sms/producer.py to 3 sms worker
// processes and waits until each message is sent or refused by the fake
// provider.
func runSMS(t *testing.T, broker, scope string, failureRate float64) smsRun {
	t.Helper()
	// 5 messages are queued twice: with the Redis idempotency store the
	// second task must not reach the provider, whichever worker takes it.
	const messages, bad, duplicates, workers = 50, 2, 5, 3
	api := smsapi.NewServer(smsapi.Config{FailureRate: failureRate})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	queue, bucket := rlName("sms"), rlName("bucket")
	t.Cleanup(func() {
		deleteQueue(t, brokerCase{broker: broker}, queue)
		cleanRLRedis(t)
	})
	// The Redis result backend is the rate limiter and the idempotency
	// store.
	env := map[string]string{"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": redisDBURL(t, rlRedisDB)}
	for i := range workers {
		startSMSWorker(t, env, "-queue", queue, "-api", srv.URL, "-scope", scope, "-rate", "5/s",
			"-bucket", bucket, "-c", "4", "-n", fmt.Sprintf("%s-%d@%%h", queue, i), "-debug")
	}
	src, err := os.ReadFile("../examples/sms/producer.py")
	if err != nil {
		t.Fatal(err)
	}
	out := runPython(t, 2*time.Minute, map[string]string{"CELERY_BROKER_URL": broker}, string(src),
		"--queue", queue, "--run", queue, "--count", fmt.Sprint(messages), "--bad", fmt.Sprint(bad),
		"--duplicates", fmt.Sprint(duplicates))
	if n := strings.Count(out, "\n"); n != messages+duplicates {
		t.Fatalf("producer printed %d tasks, want %d:\n%s", n, messages+duplicates, out)
	}

	// Every message ends sent (200) or refused (400); transient failures
	// are retried, and exhausting 8 retries at a 5% failure rate (plus the
	// odd 429) is practically impossible.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done := map[string]bool{}
		for _, r := range api.Records() {
			if r.Status == http.StatusOK || r.Status == http.StatusBadRequest {
				done[r.MessageID] = true
			}
		}
		if len(done) == messages {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages done after 2 minutes", len(done), messages)
		}
		time.Sleep(100 * time.Millisecond)
	}
	recs := api.Records()
	var times []time.Time
	run := smsRun{requests: len(recs), byStatus: map[int]int{}}
	sends := map[string]int{}
	for _, r := range recs {
		times = append(times, r.Time)
		run.byStatus[r.Status]++
		if r.Status == http.StatusOK && !r.Replayed {
			sends[r.MessageID]++
		}
		if r.IdempotencyKey != r.MessageID {
			t.Errorf("request for %s with Idempotency-Key %q", r.MessageID, r.IdempotencyKey)
		}
		if r.Replayed {
			t.Errorf("a second send of %s reached the provider", r.MessageID)
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	run.perSecond = smsapi.PerWindow(times, time.Second)
	run.span = times[len(times)-1].Sub(times[0])
	if len(sends) != messages-bad || run.byStatus[400] != bad {
		t.Errorf("%d messages sent, %d refused; want %d and %d", len(sends), run.byStatus[400], messages-bad, bad)
	}
	for id, n := range sends {
		if n != 1 {
			t.Errorf("message %s sent %d times", id, n)
		}
	}
	return run
}

// TestRateLimitSMS is the outbound-SMS evidence: with the global limit the
// sends stay within 5/s plus the one-token burst across 3 processes, so 50
// messages take about 10 s; with Celery's per-worker limit the 3 processes
// send about 15/s and the provider answers most of them 429.
func TestRateLimitSMS(t *testing.T) {
	pythonBin(t)
	for _, bc := range rlBrokers(t) {
		t.Run("global/"+bc.name, func(t *testing.T) {
			run := runSMS(t, bc.broker, "global", 0.05)
			t.Logf("global 5/s, burst 1, 3 workers on %s: %v", bc.name, run)
			if m := slices.Max(run.perSecond); m > 6 {
				t.Errorf("%d requests in one second, over 5/s plus a burst of 1: %v", m, run.perSecond)
			}
			// A bucket of 1 at 5/s spaces n requests over at least (n-1)/5 s
			// (by Redis's clock; the sends carry some network jitter).
			if min := time.Duration(float64(run.requests-1) / 5 * float64(time.Second)); run.span < min-100*time.Millisecond {
				t.Errorf("%d requests spanned %v, want at least %v at 5/s", run.requests, run.span, min)
			}
		})
	}
	for _, bc := range rlBrokers(t) {
		t.Run("per-worker/"+bc.name, func(t *testing.T) {
			// No 503s here: two requests in three get 429, and Celery counts
			// those retries too, so a 503 late in a message's life could
			// exhaust its retries and dead-letter it.
			run := runSMS(t, bc.broker, "worker", 0)
			t.Logf("per-worker 5/s, 3 workers on %s: %v", bc.name, run)
			// Three workers at 5/s each send about 15/s; at least twice the
			// cap in some second is the multiplication the seeds warn about.
			if m := slices.Max(run.perSecond); m < 10 {
				t.Errorf("per-worker limits on 3 workers peaked at %d requests/s; the multiplication did not show: %v", m, run.perSecond)
			}
		})
	}
}

// jobRecorder is an in-process worker running it_rl.job(label, i), which
// records when each run started.
type jobRecorder struct {
	mu     sync.Mutex
	starts []jobStart
}

type jobStart struct {
	label string
	i     int
	at    time.Time
}

func (r *jobRecorder) snapshot() []jobStart {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts)
}

// waitFor polls the recorder until cond holds.
func (r *jobRecorder) waitFor(t *testing.T, what string, cond func([]jobStart) bool) []jobStart {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s := r.snapshot()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (%d runs)", what, len(s))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startJobWorker runs a worker for it_rl.job until the test ends; each run
// takes d.
func startJobWorker(t *testing.T, broker, queueOrderStrategy string, cfg worker.Config, d time.Duration) *jobRecorder {
	t.Helper()
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: broker, QueueOrderStrategy: queueOrderStrategy,
		ConnectionName: "it_rl"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &jobRecorder{}
	mux := worker.NewMux()
	mux.HandleFunc("it_rl.job", func(ctx context.Context, task *worker.Task) (any, error) {
		var label string
		var i int
		if err := task.Bind(&label, &i); err != nil {
			return nil, err
		}
		rec.mu.Lock()
		rec.starts = append(rec.starts, jobStart{label, i, time.Now()})
		rec.mu.Unlock()
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return nil, nil
	})
	cfg.WithoutControl, cfg.WithoutHeartbeat = true, true
	cfg.Hostname = rlName("w") + "@%h"
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	w, err := worker.New(conn.Transport, mux, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker.Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("worker did not stop")
		}
		conn.Close()
	})
	return rec
}

// highLowQueues names a high and a low queue for a queue-order test and
// removes them (and what the workers left in db 6) when it ends.
func highLowQueues(t *testing.T, bc brokerCase) (high, low string) {
	high, low = rlName("high"), rlName("low")
	t.Cleanup(func() {
		deleteQueue(t, bc, high)
		deleteQueue(t, bc, low)
		cleanRLRedis(t)
	})
	return high, low
}

// TestQueueOrderStrict: a worker consuming -Q high,low with concurrency 1
// is busy with a backlog of 500 low tasks when one high task arrives. In
// strict order the high task runs as soon as it is in the worker, ahead of
// the prefetched low ones: few low tasks start after it was published, and
// no more than the prefetch count. Arrival order (Celery's) runs the
// prefetched low tasks first.
func TestQueueOrderStrict(t *testing.T) {
	pythonBin(t)
	for _, bc := range rlBrokers(t) {
		for _, tc := range []struct {
			order      worker.QueueOrder
			multiplier int // prefetch = concurrency (1) × multiplier
		}{
			{worker.QueueOrderStrict, 4},
			{worker.QueueOrderStrict, 32},
			{worker.QueueOrderArrival, 32},
		} {
			mode := string(tc.order)
			if mode == "" {
				mode = "arrival"
			}
			t.Run(fmt.Sprintf("%s/%s/prefetch%d", bc.name, mode, tc.multiplier), func(t *testing.T) {
				high, low := highLowQueues(t, bc)
				strategy := ""
				if tc.order == worker.QueueOrderStrict {
					strategy = "priority" // what `celeriac worker --queue-order strict` sets on Redis
				}
				rec := startJobWorker(t, bc.broker, strategy, worker.Config{
					Queues: []string{high, low}, QueueOrder: tc.order, Concurrency: 1, PrefetchMultiplier: tc.multiplier,
				}, 10*time.Millisecond)
				out := runPython(t, 2*time.Minute, map[string]string{"IT_BROKER": bc.broker},
					fmt.Sprintf("import it_rl; it_rl.backlog_then_high(%q, %q, 500)", low, high))
				var sent struct {
					HighSent float64 `json:"high_sent"`
				}
				if err := json.Unmarshal([]byte(out), &sent); err != nil {
					t.Fatalf("python output %q: %v", out, err)
				}
				published := time.Unix(0, int64(sent.HighSent*1e9))
				starts := rec.waitFor(t, "the high task", func(s []jobStart) bool {
					return slices.ContainsFunc(s, func(j jobStart) bool { return j.label == "high" })
				})
				at := slices.IndexFunc(starts, func(j jobStart) bool { return j.label == "high" })
				overtaken := 0
				for _, s := range starts[:at] {
					if s.at.After(published) {
						overtaken++
					}
				}
				prefetch := tc.multiplier
				t.Logf("%s, %s order, prefetch %d: the high task started %v after it was published, after %d low tasks (%d of them started after it was published)",
					bc.name, mode, prefetch, starts[at].at.Sub(published).Round(time.Millisecond), at, overtaken)
				if overtaken == at || at >= 500 {
					// The worker must have been busy with the backlog, and
					// the backlog not done, when the high task came.
					t.Fatalf("no backlog to overtake: %d low tasks ran before the high one, %d of them after it was published", at, overtaken)
				}
				if tc.order == worker.QueueOrderStrict && overtaken > prefetch {
					t.Errorf("%d low tasks started after the high one was published, over the prefetch bound %d", overtaken, prefetch)
				}
			})
		}
	}
}

// TestQueueOrderUnderBacklog: with a backlog on both queues, strict order
// runs only high tasks while high has work, and weighted order (high=3,
// low=1) runs three high tasks for every low one, on both brokers: what the
// worker holds follows what it takes (per-queue prefetch), so the broker's
// refill order does not even the queues out.
func TestQueueOrderUnderBacklog(t *testing.T) {
	pythonBin(t)
	for _, bc := range rlBrokers(t) {
		for _, order := range []worker.QueueOrder{worker.QueueOrderStrict, worker.QueueOrderWeighted} {
			t.Run(fmt.Sprintf("%s/%s", bc.name, order), func(t *testing.T) {
				high, low := highLowQueues(t, bc)
				runPython(t, 2*time.Minute, map[string]string{"IT_BROKER": bc.broker},
					fmt.Sprintf("import it_rl; it_rl.fill([%q, %q], 300)", high, low))
				strategy := ""
				if order == worker.QueueOrderStrict {
					strategy = "priority"
				}
				rec := startJobWorker(t, bc.broker, strategy, worker.Config{
					Queues: []string{high, low}, QueueOrder: order, QueueWeights: map[string]int{high: 3, low: 1},
					Concurrency: 1, PrefetchMultiplier: 8,
				}, 2*time.Millisecond)
				starts := rec.waitFor(t, "200 starts", func(s []jobStart) bool { return len(s) >= 200 })[:200]
				var perWindow []int // high tasks in each 40 starts
				total := 0
				for w := 0; w < 200; w += 40 {
					n := 0
					for _, s := range starts[w : w+40] {
						if s.label == high {
							n++
						}
					}
					perWindow = append(perWindow, n)
					total += n
				}
				t.Logf("%s, %s order: high tasks in each 40 of the first 200 starts: %v", bc.name, order, perWindow)
				switch order {
				case worker.QueueOrderStrict:
					if total != 200 {
						t.Errorf("strict order ran %d low tasks while high had a backlog: %v", 200-total, perWindow)
					}
				case worker.QueueOrderWeighted:
					for _, n := range perWindow {
						if n < 26 || n > 34 {
							t.Errorf("weighted order 3:1 ran %d high of 40 in a window, want about 30: %v", n, perWindow)
							break
						}
					}
				}
			})
		}
	}
}

// TestQueueOrderWithHeldETATasks: with per-queue prefetch windows (strict
// order), tasks held for their ETA still raise the window, so the tasks
// queued behind more ETA tasks than the prefetch run, on both brokers.
func TestQueueOrderWithHeldETATasks(t *testing.T) {
	pythonBin(t)
	for _, bc := range rlBrokers(t) {
		t.Run(bc.name, func(t *testing.T) {
			high, low := highLowQueues(t, bc)
			runPython(t, 2*time.Minute, map[string]string{"IT_BROKER": bc.broker},
				fmt.Sprintf("import it_rl; it_rl.eta_then_jobs(%q, 50, 20)", high))
			rec := startJobWorker(t, bc.broker, "priority", worker.Config{
				Queues: []string{high, low}, QueueOrder: worker.QueueOrderStrict, Concurrency: 1, PrefetchMultiplier: 4,
			}, time.Millisecond)
			starts := rec.waitFor(t, "the 20 tasks behind 50 held ETA tasks", func(s []jobStart) bool { return len(s) >= 20 })
			for _, s := range starts {
				if s.label != "now" {
					t.Fatalf("an ETA task due in an hour ran: %+v", s)
				}
			}
		})
	}
}

// TestMessagePriority: Python's apply_async(priority=p) to a RabbitMQ queue
// declared with x-max-priority, and to Redis (kombu's bands), runs in
// priority order on a worker with prefetch 1.
func TestMessagePriority(t *testing.T) {
	pythonBin(t)
	prios := []int{0, 5, 9, 3, 7, 1, 8, 2, 6, 4, 9, 0, 5, 3, 8, 1}
	for _, bc := range rlBrokers(t) {
		t.Run(bc.name, func(t *testing.T) {
			q := rlName("prio")
			t.Cleanup(func() {
				deleteQueue(t, bc, q)
				cleanRLRedis(t)
			})
			env := map[string]string{"IT_BROKER": bc.broker}
			cfg := worker.Config{Queues: []string{q}, Concurrency: 1, PrefetchMultiplier: 1}
			type job struct{ prio, i int }
			var want []job
			for i, p := range prios {
				want = append(want, job{p, i})
			}
			if bc.name == "rabbitmq" {
				env["IT_MAX_PRIORITY"] = "10"
				cfg.QueueArguments = map[string]map[string]any{q: {"x-max-priority": 10}}
				// Highest first; FIFO among equals.
				slices.SortStableFunc(want, func(a, b job) int { return b.prio - a.prio })
			} else {
				// kombu's Redis bands 0-2, 3-5, 6-8, 9: the lowest band first,
				// FIFO inside a band (Celery documents the reversed order).
				band := func(p int) int { return min(p/3, 3) }
				slices.SortStableFunc(want, func(a, b job) int { return band(a.prio) - band(b.prio) })
			}
			// Everything is queued before the worker starts, so that the
			// order is the broker's, not the order of arrival.
			runPython(t, time.Minute, env, fmt.Sprintf("import it_rl; it_rl.with_priorities(%q, %s)", q,
				strings.ReplaceAll(fmt.Sprint(prios), " ", ", ")))
			rec := startJobWorker(t, bc.broker, "", cfg, 0)
			starts := rec.waitFor(t, "every task", func(s []jobStart) bool { return len(s) == len(prios) })
			var got []job
			for _, s := range starts {
				var p int
				fmt.Sscanf(s.label, "p%d", &p)
				got = append(got, job{p, s.i})
			}
			gotP, wantP := make([]int, len(got)), make([]int, len(want))
			for i := range got {
				gotP[i], wantP[i] = got[i].prio, want[i].prio
			}
			t.Logf("%s: published priorities %v, run in order %v", bc.name, prios, gotP)
			if !slices.Equal(got, want) {
				t.Errorf("run order %v, want %v", got, want)
			}
		})
	}
}

// TestPerWorkerRateLimit: Celery's per-worker rate_limit, given to
// `celeriac worker` as --rate-limit tasks.add=10/s, spaces the starts of
// 50 tasks 100 ms apart and every one of them succeeds.
func TestPerWorkerRateLimit(t *testing.T) {
	pythonBin(t)
	const n = 50
	for _, bc := range rlBrokers(t) {
		t.Run(bc.name, func(t *testing.T) {
			q := rlName("rate")
			t.Cleanup(func() {
				deleteQueue(t, bc, q)
				cleanRLRedis(t)
			})
			startWorkerProc(t, bc, "-Q", q, "-c", "4", "--rate-limit", "tasks.add=10/s", "-n", q+"@%h", "--without-heartbeat")
			out := runPython(t, 2*time.Minute, map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend},
				fmt.Sprintf("import it_rl; it_rl.adds_and_results(%q, %d, 60)", q, n))
			var results []struct {
				ID       string  `json:"id"`
				State    string  `json:"state"`
				Result   float64 `json:"result"`
				DateDone string  `json:"date_done"`
			}
			if err := json.Unmarshal([]byte(out), &results); err != nil {
				t.Fatalf("python output %q: %v", out, err)
			}
			if len(results) != n {
				t.Fatalf("%d results, want %d", len(results), n)
			}
			var done []time.Time
			for i, r := range results {
				if r.State != "SUCCESS" || r.Result != float64(2*i) {
					t.Errorf("task %d: %s %v", i, r.State, r.Result)
				}
				d, err := time.Parse("2006-01-02T15:04:05.999999", r.DateDone)
				if err != nil {
					t.Fatalf("date_done %q: %v", r.DateDone, err)
				}
				done = append(done, d)
			}
			slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
			perSecond := smsapi.PerWindow(done, time.Second)
			span := done[n-1].Sub(done[0])
			t.Logf("%s: %d tasks at 10/s finished over %.2f s; per second %v", bc.name, n, span.Seconds(), perSecond)
			// Starts are 100 ms apart; the results are stored right after.
			if want := time.Duration(n-1) * 100 * time.Millisecond; span < want-50*time.Millisecond {
				t.Errorf("%d tasks finished within %v, want at least %v at 10/s", n, span, want)
			}
			if m := slices.Max(perSecond); m > 11 {
				t.Errorf("%d tasks finished within one second at 10/s: %v", m, perSecond)
			}
		})
	}
}
