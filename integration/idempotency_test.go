package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The idempotency evidence of issue 7: examples/payments worker PROCESSES
// (acks_late, payments.charge idempotent per order, the key passed to a
// fake gateway that records every request) fed by Python Celery producers,
// on Redis and on RabbitMQ. They use Redis db 7 and names starting with
// it_idem_, and delete what they wrote.
const idemDB = 7

func idemBrokers(t *testing.T) []brokerCase {
	u := redisDBURL(t, idemDB)
	return []brokerCase{
		{"redis", u, u},
		{"rabbitmq", amqpURL(t), u},
	}
}

// idemRun is one test's names: a queue and order ids that no other run
// uses, removed from the brokers when the test ends.
type idemRun struct {
	id    string // it_idem_<random>; also the orders' prefix
	queue string
	bc    brokerCase
	rdb   *goredis.Client
}

func newIdemRun(t *testing.T, bc brokerCase, kind string) *idemRun {
	t.Helper()
	r := &idemRun{id: "it_idem_" + kind + "_" + strings.ToLower(rand.Text()[:8]), bc: bc}
	r.queue = r.id
	opt, err := goredis.ParseURL(bc.backend)
	if err != nil {
		t.Fatal(err)
	}
	r.rdb = goredis.NewClient(opt)
	t.Cleanup(func() {
		deleteQueue(t, bc, r.queue)
		deleteQueue(t, bc, r.queue+".dlq")
		ctx := context.Background()
		// Claims, results of the run's orders and the Redis broker's
		// bookkeeping all carry the run id; results carry task ids.
		var keys []string
		iter := r.rdb.Scan(ctx, 0, "*"+r.id+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		// The workers' remote-control bindings on a Redis broker (db 7
		// is this file's alone).
		keys = append(keys, "_kombu.binding.celery.pidbox", "_kombu.binding.celeryev")
		r.rdb.Del(ctx, keys...)
		r.rdb.Close()
	})
	return r
}

// forget deletes the result keys of task ids (they do not carry the run id).
func (r *idemRun) forget(ids []string) {
	ctx := context.Background()
	for _, id := range ids {
		r.rdb.Del(ctx, "celery-task-meta-"+id)
	}
}

// payProc is a payments process (gateway or worker).
type payProc = proc

// startPayments starts `payments args...` and waits for a log line
// containing ready. The process is killed when the test ends.
func startPayments(t *testing.T, name, ready string, args ...string) *payProc {
	t.Helper()
	return startProc(t, name, "./examples/payments", procOptions{Ready: ready, ReadyTimeout: time.Minute}, args...)
}

// gateway is the fake payment gateway of examples/payments, as seen from
// its HTTP API.
type gateway struct {
	url  string
	proc *payProc
}

func startGateway(t *testing.T, args ...string) *gateway {
	t.Helper()
	p := startPayments(t, "gateway", "gateway listening on ", append([]string{"gateway", "-addr", "127.0.0.1:0"}, args...)...)
	m := regexp.MustCompile(`gateway listening on (\S+)`).FindStringSubmatch(p.Log())
	if m == nil {
		t.Fatalf("no address in the gateway log:\n%s", p.Log())
	}
	return &gateway{url: m[1], proc: p}
}

// gatewayStats mirrors the gateway's GET /v1/stats.
type gatewayStats struct {
	Requests  int            `json:"requests"`
	PerKey    map[string]int `json:"per_key"`
	Charges   int            `json:"charges"`
	Replays   int            `json:"replays"`
	Conflicts int            `json:"conflicts"`
	Failures  int            `json:"failures"`
	Inflight  int            `json:"inflight"`
}

// gatewayCharge mirrors one charge of GET /v1/charges.
type gatewayCharge struct {
	ID       string `json:"id"`
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Key      string `json:"idempotency_key"`
	Created  int64  `json:"created"`
}

func (g *gateway) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(g.url + path)
	if err != nil {
		t.Fatalf("gateway %s: %v", path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("gateway %s: %v", path, err)
	}
}

func (g *gateway) stats(t *testing.T) gatewayStats {
	t.Helper()
	var s gatewayStats
	g.get(t, "/v1/stats", &s)
	return s
}

// charges returns the gateway's charges by order id, failing the test if
// any order was charged twice.
func (g *gateway) charges(t *testing.T) map[string]gatewayCharge {
	t.Helper()
	var list []gatewayCharge
	g.get(t, "/v1/charges", &list)
	by := map[string]gatewayCharge{}
	for _, c := range list {
		if prev, dup := by[c.OrderID]; dup {
			t.Errorf("order %s charged twice: %s and %s", c.OrderID, prev.ID, c.ID)
		}
		by[c.OrderID] = c
	}
	return by
}

// startPaymentsWorker starts a payments worker process on the run's queue.
func startPaymentsWorker(t *testing.T, r *idemRun, g *gateway, node string, extra ...string) *payProc {
	t.Helper()
	args := []string{"worker", "-broker", r.bc.broker, "-result-backend", r.bc.backend, "-queue", r.queue,
		"-gateway", g.url, "-n", node + "-" + r.id + "@%h", "-loglevel", "debug"}
	return startPayments(t, "worker "+node, "worker ready", append(args, extra...)...)
}

// pyIdem starts a function of testdata/py/it_idem_payments.py in the
// background.
func pyIdem(t *testing.T, r *idemRun, fn string, args ...string) *pyProc {
	t.Helper()
	env := map[string]string{"IT_BROKER": r.bc.broker, "IT_BACKEND": r.bc.backend, "IT_QUEUE": r.queue}
	argv := append([]string{"-c", "import sys, it_idem_payments as m; getattr(m, sys.argv[1])(*sys.argv[2:])", fn}, args...)
	p := &pyProc{cmd: exec.Command(pythonBin(t), argv...), lines: make(chan map[string]any, 16), done: make(chan struct{})}
	p.cmd.Env = pyEnv(env)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.lines <- m
			}
		}
		p.err = p.cmd.Wait()
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// pyResult is one message's outcome as Python's AsyncResult.get() saw it.
type pyResult struct {
	Order  string         `json:"order"`
	Copy   int            `json:"copy"`
	TaskID string         `json:"task_id"`
	Result map[string]any `json:"result"`
	Error  string         `json:"error"`
}

// collect reads the producer's result lines up to its done line.
func collect(t *testing.T, p *pyProc, timeout time.Duration) []pyResult {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var out []pyResult
	for {
		m := p.next(t, time.Until(deadline))
		if m["done"] == true {
			p.wait(t, 30*time.Second)
			return out
		}
		b, _ := json.Marshal(m)
		var r pyResult
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("python line %s: %v", b, err)
		}
		out = append(out, r)
	}
}

var (
	taskStartedRE = regexp.MustCompile(`task started\s.*"task_id": "([^"]+)"`)
	busyRE        = regexp.MustCompile(`task retry scheduled.*same idempotency key in progress`)
	chargedRE     = regexp.MustCompile(`\tcharged\t.*"replayed": (true|false)`)
)

// workerCounts are what the workers' logs say they did.
type workerCounts struct {
	starts    map[string]int // task id -> runs started
	busy      int            // deliveries that found the key held and were retried
	charged   int            // handler runs that got a charge back from the gateway
	replayed  int            // ... of which the gateway replayed
	perWorker map[string]int // runs started per process
}

func countLogs(procs []*payProc) workerCounts {
	c := workerCounts{starts: map[string]int{}, perWorker: map[string]int{}}
	for _, p := range procs {
		for _, line := range strings.Split(p.Log(), "\n") {
			if m := taskStartedRE.FindStringSubmatch(line); m != nil {
				c.starts[m[1]]++
				c.perWorker[p.name]++
			}
			if busyRE.MatchString(line) {
				c.busy++
			}
			if m := chargedRE.FindStringSubmatch(line); m != nil {
				c.charged++
				if m[1] == "true" {
					c.replayed++
				}
			}
		}
	}
	return c
}

// waitUntil polls cond until it holds, failing after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdempotencyKill9: a worker process is killed with SIGKILL three times
// while it charges orders (acks_late, the kill landing while the gateway
// has charges in flight) and restarted each time. Every order is charged
// exactly once, every message was delivered (and run) at least once, and
// Python's .get() returns each order's one charge.
func TestIdempotencyKill9(t *testing.T) {
	for _, bc := range idemBrokers(t) {
		t.Run(bc.name, func(t *testing.T) {
			const (
				orders      = 40
				kills       = 3
				concurrency = 4
				lease       = 2 * time.Second
				visibility  = 3 * time.Second
			)
			r := newIdemRun(t, bc, "kill")
			// Charges take 400 ms to answer, so a kill finds some in flight;
			// 5 % of requests fail with a 503 (retried with backoff).
			g := startGateway(t, "-latency", "400ms", "-fail-rate", "0.05", "-slow-rate", "0", "-seed", "7")
			// The example's default -max-retries (5): redeliveries that find
			// a dead worker's claim still held must not use it up.
			workerArgs := []string{"-c", fmt.Sprint(concurrency), "-lease", lease.String(),
				"-visibility-timeout", visibility.String()}
			w := startPaymentsWorker(t, r, g, "a", workerArgs...)
			procs := []*payProc{w}

			py := pyIdem(t, r, "charge_all", r.id, fmt.Sprint(orders), "240")
			if m := py.next(t, 60*time.Second); m["sent"] != float64(orders) {
				t.Fatalf("producer: %v", m)
			}
			var atKill []gatewayStats
			for k := range kills {
				target := (k + 1) * orders / (kills + 2)
				var s gatewayStats
				waitUntil(t, 120*time.Second, fmt.Sprintf("%d charges with one in flight", target), func() bool {
					s = g.stats(t)
					return s.Charges >= target && s.Inflight > 0
				})
				w.kill()
				atKill = append(atKill, s)
				if bc.name == "redis" {
					// The dead worker's messages come back once their
					// visibility timeout passed, at the next restore sweep:
					// a new consumer sweeps when it starts.
					time.Sleep(visibility + time.Second)
				}
				w = startPaymentsWorker(t, r, g, fmt.Sprintf("a%d", k+1), workerArgs...)
				procs = append(procs, w)
			}
			results := collect(t, py, 300*time.Second)
			var ids []string
			for _, res := range results {
				ids = append(ids, res.TaskID)
			}
			t.Cleanup(func() { r.forget(ids) })

			charges := g.charges(t)
			st := g.stats(t)
			counts := countLogs(procs)
			if len(results) != orders {
				t.Fatalf("python got %d results, want %d", len(results), orders)
			}
			redelivered := 0
			for _, res := range results {
				if res.Error != "" {
					t.Errorf("order %s (task %s): %s", res.Order, res.TaskID, res.Error)
					continue
				}
				ch, ok := charges[res.Order]
				if !ok {
					t.Errorf("order %s: Python got %v but the gateway has no charge", res.Order, res.Result)
					continue
				}
				if res.Result["charge_id"] != ch.ID || res.Result["order_id"] != res.Order {
					t.Errorf("order %s: Python got %v, the gateway charged %s", res.Order, res.Result, ch.ID)
				}
				// At least once: every message ran, some more than once.
				switch n := counts.starts[res.TaskID]; {
				case n == 0:
					t.Errorf("order %s: task %s never started in any worker log", res.Order, res.TaskID)
				case n > 1:
					redelivered++
				}
			}
			if len(charges) != orders || st.Charges != orders {
				t.Errorf("gateway made %d charges (%d orders), want exactly %d", st.Charges, len(charges), orders)
			}
			// A kill with charges in flight leaves charges the worker never
			// recorded; their redeliveries reach the gateway again with the
			// same key and get the original charge: the downstream key is
			// what keeps those exactly once. Nothing else reaches the
			// gateway twice: at most `concurrency` tasks run per kill.
			if st.Replays < 1 {
				t.Errorf("no replay at the gateway: no kill hit a charge in flight (stats at the kills: %+v)", atKill)
			}
			if st.Replays > kills*concurrency {
				t.Errorf("%d replays, more than the %d tasks the kills could interrupt: completed orders reached the gateway again", st.Replays, kills*concurrency)
			}
			total := 0
			for _, n := range counts.starts {
				total += n
			}
			inflight := make([]int, len(atKill))
			for i, s := range atKill {
				inflight[i] = s.Inflight
			}
			t.Logf("%s: %d orders, %d kills -9 (gateway requests in flight at each: %v); runs started %d (messages run more than once: %d), duplicates retried while a claim was held %d; gateway: %d requests, %d charges, %d replays of an existing charge, %d injected 503s, %d conflicts",
				bc.name, orders, kills, inflight, total, redelivered, counts.busy, st.Requests, st.Charges, st.Replays, st.Failures, st.Conflicts)
		})
	}
}

// TestIdempotencyDuplicates: each order is sent 5 times, 3 copies at once
// (shuffled among the other orders' copies, consumed by 2 worker processes)
// and 2 after those finished. Each order reaches the gateway exactly once,
// and every copy's .get() in Python returns the same, original charge.
func TestIdempotencyDuplicates(t *testing.T) {
	for _, bc := range idemBrokers(t) {
		t.Run(bc.name, func(t *testing.T) {
			const orders = 8
			r := newIdemRun(t, bc, "dup")
			// No injected failures: any second request for a key would be
			// celeriac running a duplicate.
			g := startGateway(t, "-latency", "200ms", "-fail-rate", "0", "-slow-rate", "0")
			procs := []*payProc{
				startPaymentsWorker(t, r, g, "a", "-c", "4"),
				startPaymentsWorker(t, r, g, "b", "-c", "4"),
			}
			py := pyIdem(t, r, "duplicates", r.id, fmt.Sprint(orders), "120")
			if m := py.next(t, 60*time.Second); m["sent"] != float64(3*orders) {
				t.Fatalf("producer: %v", m)
			}
			results := collect(t, py, 240*time.Second)
			var ids []string
			for _, res := range results {
				ids = append(ids, res.TaskID)
			}
			t.Cleanup(func() { r.forget(ids) })

			charges := g.charges(t)
			st := g.stats(t)
			counts := countLogs(procs)
			if len(results) != 5*orders {
				t.Fatalf("python got %d results, want %d", len(results), 5*orders)
			}
			byOrder := map[string][]pyResult{}
			for _, res := range results {
				if res.Error != "" {
					t.Errorf("order %s copy %d: %s", res.Order, res.Copy, res.Error)
				}
				byOrder[res.Order] = append(byOrder[res.Order], res)
			}
			for order, copies := range byOrder {
				ch := charges[order]
				want := map[string]any{"charge_id": ch.ID, "order_id": order, "amount": float64(4200),
					"currency": "eur", "created": float64(ch.Created)}
				for _, c := range copies {
					if !reflect.DeepEqual(c.Result, want) {
						t.Errorf("order %s copy %d: Python got %v, want the original charge %v", order, c.Copy, c.Result, want)
					}
				}
				if n := st.PerKey["order-"+order]; n != 1 {
					t.Errorf("order %s reached the gateway %d times, want once", order, n)
				}
			}
			if len(byOrder) != orders || st.Charges != orders || st.Requests != orders {
				t.Errorf("%d orders answered; gateway: %d requests, %d charges; want %d of each", len(byOrder), st.Requests, st.Charges, orders)
			}
			if counts.charged != orders {
				t.Errorf("the handler charged %d times, want %d (once per order)", counts.charged, orders)
			}
			for _, p := range procs {
				if counts.perWorker[p.name] == 0 {
					t.Errorf("%s ran no task: the copies were not spread over both processes", p.name)
				}
			}
			total := 0
			for _, n := range counts.starts {
				total += n
			}
			t.Logf("%s: %d orders x 5 copies; runs started %d (%v); the handler charged %d times; duplicates retried while a claim was held %d, the rest answered from the stored result; gateway: %d requests, %d charges, %d replays",
				bc.name, orders, total, counts.perWorker, counts.charged, counts.busy, st.Requests, st.Charges, st.Replays)
		})
	}
}
