package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

// The reliability fault suite (issue 10): N tasks published by Python
// Celery go through celeriac worker processes while the workers' broker
// connections are killed again and again, one worker is killed with -9
// and restarted, another receives SIGTERM and a new one takes over, and
// poison messages are mixed in. The effect of every task must happen
// exactly once, every poison message must end in the dead letters, and the
// workers must keep running.
//
// Redis dbs: 3 is the broker, 2 holds the effects and the results.
// CELERIAC_FLT_N sets N (default 10 000).

const (
	fltBrokerDB = 3
	fltEffectDB = 2
	// The workers' bounds in the suite: small enough that the 10 MB body
	// and the deep body are over them.
	fltMaxMessageSize  = 1 << 20
	fltMaxNestingDepth = 64
)

func fltN(t *testing.T) int {
	t.Helper()
	n := 10000
	if s := os.Getenv("CELERIAC_FLT_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 100 {
			t.Fatalf("CELERIAC_FLT_N=%q: want an integer >= 100", s)
		}
		n = v
	}
	return n
}

func TestFaultsRedis(t *testing.T) {
	runFaultSuite(t, "redis", redisDBURL(t, fltBrokerDB))
}

func TestFaultsRabbitMQ(t *testing.T) {
	runFaultSuite(t, "rabbitmq", amqpURL(t))
}

// fltRun is the state of one suite run.
type fltRun struct {
	t       *testing.T
	kind    string
	broker  string
	queue   string
	prefix  string
	effects *goredis.Client
	keys    fltKeys
	qargs   map[string]any
	marker  string
}

func runFaultSuite(t *testing.T, kind, broker string) {
	n := fltN(t)
	pythonBin(t)
	ctx := context.Background()
	stamp := time.Now().UnixNano() % 1e9
	r := &fltRun{t: t, kind: kind, broker: broker,
		queue:  fmt.Sprintf("it_flt_%s_%d", kind, stamp),
		prefix: fmt.Sprintf("it_flt:%s:%d", kind, stamp),
		marker: filepath.Join(t.TempDir(), "unpickled"),
	}
	r.keys = fltKeysOf(r.prefix)
	effectsURL := redisDBURL(t, fltEffectDB)
	opt, err := goredis.ParseURL(effectsURL)
	if err != nil {
		t.Fatal(err)
	}
	r.effects = goredis.NewClient(opt)
	t.Cleanup(func() {
		r.effects.Del(ctx, r.keys.deliveries, r.keys.effects, r.keys.effectCount, r.keys.redelivered)
		r.effects.Close()
	})
	r.setupBroker(ctx)

	wcfg := func(name string) fltWorkerConfig {
		return fltWorkerConfig{
			Broker: broker, Backend: effectsURL, Effects: effectsURL, Prefix: r.prefix, Queue: r.queue,
			Name: r.queue + "-" + name, Hostname: name + "@" + r.queue, Concurrency: 4,
			VisibilityTimeout: 6, RestoreInterval: 1,
			MaxMessageSize: fltMaxMessageSize, MaxNestingDepth: fltMaxNestingDepth,
			QueueArguments: map[string]map[string]any{r.queue: r.qargs},
		}
	}
	start := time.Now()
	a := startFltWorker(t, wcfg("a"))
	b := startFltWorker(t, wcfg("b"))

	// The connection killer: only this run's worker connections.
	killCtx, stopKilling := context.WithCancel(ctx)
	var kills atomic.Int64
	var killerWG sync.WaitGroup
	killerWG.Go(func() { r.killConnections(killCtx, &kills) })
	defer func() { stopKilling(); killerWG.Wait() }()

	// Python publishes N tasks in the background.
	pub := r.startPublisher(n)

	var sent []poison
	sendPoisons := func(round int) {
		ps := poisons(round, kind == "redis", r.marker, fltMaxNestingDepth)
		r.publishPoisons(ctx, ps)
		sent = append(sent, ps...)
	}
	sendPoisons(1)

	r.waitEffects(n/4, 3*time.Minute, a, b)
	t.Logf("%d effects after %s: kill -9 worker a and restart it", r.effectCount(), time.Since(start).Round(time.Millisecond))
	a.Kill9()
	a2 := startFltWorker(t, wcfg("a2"))
	sendPoisons(2)

	r.waitEffects(n/2, 3*time.Minute, a2, b)
	t.Logf("%d effects after %s: SIGTERM to worker b; worker c takes over", r.effectCount(), time.Since(start).Round(time.Millisecond))
	c := startFltWorker(t, wcfg("c"))
	if err := b.Term(60 * time.Second); err != nil {
		t.Fatalf("worker b after SIGTERM: %v\n%s", err, tail(b.Log(), 40))
	}
	sendPoisons(3)

	if err := pub.wait(5 * time.Minute); err != nil {
		t.Fatalf("python publisher: %v", err)
	}
	r.waitEffects(n, 4*time.Minute, a2, c)
	dead := r.waitDead(len(sent), 4*time.Minute)
	// A message whose effect happened but whose ack was lost (its worker
	// was killed, or its connection, before the ack reached the broker) is
	// still unacked: it comes back after the visibility timeout, runs again
	// without repeating the effect, and is acked then.
	ready, unacked := r.waitDrained(ctx, 2*time.Minute)
	elapsed := time.Since(start)
	stopKilling()
	killerWG.Wait()

	// The effects: every valid task exactly once, delivered at least once.
	deliveries, err := r.effects.HGetAll(ctx, r.keys.deliveries).Result()
	if err != nil {
		t.Fatal(err)
	}
	members, err := r.effects.SCard(ctx, r.keys.effects).Result()
	if err != nil {
		t.Fatal(err)
	}
	effectCount := r.effectCount()
	flagged, _ := r.effects.Get(ctx, r.keys.redelivered).Int()
	total, redelivered, missing := 0, 0, 0
	for i := range n {
		d, _ := strconv.Atoi(deliveries[fmt.Sprintf("k%d", i)])
		if d < 1 {
			missing++
			continue
		}
		total += d
		if d > 1 {
			redelivered++
		}
	}
	extra := len(deliveries) - n + missing
	if missing > 0 || members != int64(n) || effectCount != n || extra != 0 {
		t.Errorf("effects: %d keys never delivered, %d in the effects set, effect counter %d, %d unexpected keys; want 0, %d, %d, 0",
			missing, members, effectCount, extra, n, n)
	}

	// The dead letters: every poison message, with a reason.
	r.checkDead(ctx, sent, dead)
	if _, err := os.Stat(r.marker); err == nil {
		t.Errorf("the pickle payload ran: %s exists", r.marker)
	}

	// Nothing left behind on the broker.
	if ready != 0 || unacked != 0 {
		t.Errorf("left on the broker: %d ready, %d unacked; want 0 and 0", ready, unacked)
	}

	// The workers kept running through it all.
	for name, p := range map[string]*fltProc{"a2": a2, "c": c} {
		if p.Exited() {
			t.Errorf("worker %s exited: %v\n%s", name, p.err, tail(p.Log(), 40))
		}
	}
	for name, p := range map[string]*fltProc{"a2": a2, "c": c} {
		if err := p.Term(60 * time.Second); err != nil {
			t.Errorf("worker %s after SIGTERM: %v\n%s", name, err, tail(p.Log(), 40))
		}
	}

	t.Logf("COUNTS %s: %d tasks published by Python, %d effects (exactly once each), %d deliveries (%d tasks delivered more than once, %d redeliveries), "+
		"%d deliveries flagged redelivered by the broker; %d poison messages sent, %d dead-lettered; %d broker connections killed; "+
		"worker a killed -9 and restarted, worker b SIGTERM'd (exit 0) and replaced; %s",
		kind, n, effectCount, total, redelivered, total-n, flagged, len(sent), len(dead), kills.Load(), elapsed.Round(time.Millisecond))
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// setupBroker prepares the queue: on RabbitMQ the queue with a dead-letter
// exchange and the dead-letter queue bound to it, declared as every party
// (Python, the workers) declares them; on Redis nothing (kombu's lists
// need no declaration).
func (r *fltRun) setupBroker(ctx context.Context) {
	t := r.t
	switch r.kind {
	case "redis":
		t.Cleanup(func() {
			rdb := r.brokerRedis()
			defer rdb.Close()
			rdb.Del(context.Background(), r.queue, r.queue+"\x06\x163", r.queue+"\x06\x166", r.queue+"\x06\x169",
				"_kombu.binding."+r.queue, "celeriac.dead."+r.queue)
		})
	case "rabbitmq":
		dlx := r.queue + ".dlx"
		r.qargs = map[string]any{"x-dead-letter-exchange": dlx}
		conn, err := amqp091.Dial(r.broker)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(ch.ExchangeDeclare(r.queue, "direct", true, false, false, false, nil))
		_, err = ch.QueueDeclare(r.queue, true, false, false, false, amqp091.Table(r.qargs))
		must(err)
		must(ch.QueueBind(r.queue, r.queue, r.queue, false, nil))
		must(ch.ExchangeDeclare(dlx, "direct", true, false, false, false, nil))
		_, err = ch.QueueDeclare(r.queue+".dlq", true, false, false, false, nil)
		must(err)
		must(ch.QueueBind(r.queue+".dlq", r.queue, dlx, false, nil))
		t.Cleanup(func() {
			conn, err := amqp091.Dial(r.broker)
			if err != nil {
				return
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			_, _ = ch.QueueDelete(r.queue, false, false, false)
			_, _ = ch.QueueDelete(r.queue+".dlq", false, false, false)
			_ = ch.ExchangeDelete(r.queue, false, false)
			_ = ch.ExchangeDelete(dlx, false, false)
		})
	}
}

func (r *fltRun) brokerRedis() *goredis.Client {
	opt, err := goredis.ParseURL(r.broker)
	if err != nil {
		r.t.Fatal(err)
	}
	return goredis.NewClient(opt)
}

func (r *fltRun) publishPoisons(ctx context.Context, ps []poison) {
	t := r.t
	switch r.kind {
	case "redis":
		rdb := r.brokerRedis()
		defer rdb.Close()
		for _, p := range ps {
			publishPoisonRedis(ctx, t, rdb, r.queue, p)
		}
	case "rabbitmq":
		conn, err := amqp091.Dial(r.broker)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, len(ps)))
		for _, p := range ps {
			publishPoisonAMQP(ctx, t, ch, r.queue, p)
		}
		for range ps {
			if c := <-confirms; !c.Ack {
				t.Fatal("poison message nacked by the broker")
			}
		}
	}
}

// killConnections closes the workers' broker connections every few
// seconds until ctx ends: Redis CLIENT KILL and rabbitmqctl
// close_connection, selected by the connection names this run gave its
// workers, so that no other client of the shared brokers is touched.
func (r *fltRun) killConnections(ctx context.Context, kills *atomic.Int64) {
	every := 2 * time.Second
	if r.kind == "rabbitmq" {
		every = 3 * time.Second
	}
	var rdb *goredis.Client
	if r.kind == "redis" {
		rdb = r.brokerRedis()
		defer rdb.Close()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		switch r.kind {
		case "redis":
			kills.Add(int64(killRedisClients(ctx, rdb, func(name string) bool {
				return strings.HasPrefix(name, r.queue+"-") && !strings.HasSuffix(name, "-effects")
			})))
		case "rabbitmq":
			kills.Add(int64(killAMQPConnections(ctx, []string{"rabbitmqctl"}, r.queue+"-")))
		}
	}
}

// killRedisClients kills the clients whose CLIENT SETNAME name matches.
func killRedisClients(ctx context.Context, rdb *goredis.Client, match func(name string) bool) int {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		var id, name string
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id = v
			case "name":
				name = v
			}
		}
		if id != "" && name != "" && match(name) {
			if rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err() == nil {
				n++
			}
		}
	}
	return n
}

// killAMQPConnections closes, with rabbitmqctl (ctl is its command line),
// the connections whose connection_name starts with prefix.
func killAMQPConnections(ctx context.Context, ctl []string, prefix string) int {
	args := append(append([]string(nil), ctl[1:]...), "list_connections", "pid", "client_properties", "-q")
	out, err := exec.CommandContext(ctx, ctl[0], args...).Output()
	if err != nil {
		return 0
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		pid, props, ok := strings.Cut(sc.Text(), "\t")
		if !ok || !strings.Contains(props, `{"connection_name","`+prefix) {
			continue
		}
		args := append(append([]string(nil), ctl[1:]...), "close_connection", pid, "celeriac fault suite")
		if exec.CommandContext(ctx, ctl[0], args...).Run() == nil {
			n++
		}
	}
	return n
}

// publisher is the background Python process.
type publisher struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	out  strings.Builder
	err  error
}

func (r *fltRun) startPublisher(n int) *publisher {
	qa, _ := json.Marshal(r.qargs)
	return startFltPublisher(r.t, n, map[string]string{"IT_BROKER": r.broker, "IT_QUEUE": r.queue, "IT_QUEUE_ARGS": string(qa)})
}

// startFltPublisher starts it_flt_publish.py in the background.
func startFltPublisher(t *testing.T, n int, env map[string]string) *publisher {
	cmd := exec.Command(pythonBin(t), "testdata/py/it_flt_publish.py", strconv.Itoa(n))
	cmd.Env = pyEnv(env)
	p := &publisher{cmd: cmd, done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.err = cmd.Wait()
		pr.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *publisher) wait(timeout time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return fmt.Errorf("not done after %s", timeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil || !strings.Contains(p.out.String(), "DONE") {
		return fmt.Errorf("%v\n%s", p.err, p.out.String())
	}
	return nil
}

func (r *fltRun) effectCount() int {
	n, _ := r.effects.Get(context.Background(), r.keys.effectCount).Int()
	return n
}

// waitEffects waits until at least n effects happened, failing if a worker
// that should be running exits.
func (r *fltRun) waitEffects(n int, timeout time.Duration, running ...*fltProc) {
	t := r.t
	t.Helper()
	deadline := time.Now().Add(timeout)
	// Anything a dead worker held comes back within the visibility timeout
	// plus a restore interval (seconds here): a long stall means a loss.
	last, lastChange := -1, time.Now()
	for r.effectCount() < n {
		if c := r.effectCount(); c != last {
			last, lastChange = c, time.Now()
		} else if time.Since(lastChange) > 45*time.Second {
			deadline = time.Now()
		}
		for _, p := range running {
			if p.Exited() {
				t.Fatalf("a worker exited: %v\n%s", p.err, tail(p.Log(), 60))
			}
		}
		if time.Now().After(deadline) {
			r.diagnose(n, running...)
			t.Fatalf("only %d of %d effects (no progress for %s)", r.effectCount(), n, time.Since(lastChange).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// deadStore opens a transport on the broker to read its dead letters.
func (r *fltRun) deadStore(ctx context.Context) (transport.DeadLetterStore, func()) {
	t := r.t
	switch r.kind {
	case "redis":
		tr, err := redistransport.Dial(ctx, redistransport.Config{URL: r.broker, DisableRestore: true})
		if err != nil {
			t.Fatal(err)
		}
		return tr, func() { tr.Close() }
	default:
		tr, err := amqptransport.Dial(ctx, amqptransport.Config{URLs: []string{r.broker}})
		if err != nil {
			t.Fatal(err)
		}
		return tr, func() { tr.Close() }
	}
}

func (r *fltRun) waitDead(n int, timeout time.Duration) []transport.DeadMessage {
	t := r.t
	ctx := context.Background()
	store, closeStore := r.deadStore(ctx)
	defer closeStore()
	deadline := time.Now().Add(timeout)
	for {
		dead, err := store.DeadLetters(ctx, r.queue, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) >= n || time.Now().After(deadline) {
			return dead
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// deadID says which poison message a dead letter is: the id the suite gave
// it, found in the task id, the correlation id or the raw envelope.
func deadID(d transport.DeadMessage) string {
	if d.Reason.TaskID != "" {
		return d.Reason.TaskID
	}
	if id, ok := d.Message.Headers["id"].(string); ok && id != "" {
		return id
	}
	if d.Message.Properties.CorrelationID != "" {
		return d.Message.Properties.CorrelationID
	}
	if len(d.Message.Body) < 1<<20 {
		s := string(d.Message.Body)
		if i := strings.Index(s, "flt-poison-"); i >= 0 {
			end := i + len("flt-poison-")
			for end < len(s) && (s[end] == '-' || s[end] >= 'a' && s[end] <= 'z' || s[end] >= '0' && s[end] <= '9' || s[end] >= 'A' && s[end] <= 'Z') {
				end++
			}
			return s[i:end]
		}
	}
	return ""
}

// checkDead matches the dead letters with the poison messages sent.
func (r *fltRun) checkDead(ctx context.Context, sent []poison, dead []transport.DeadMessage) {
	t := r.t
	byID := map[string][]transport.DeadMessage{}
	for _, d := range dead {
		id := deadID(d)
		byID[id] = append(byID[id], d)
	}
	reasons := map[string]string{}
	for _, p := range sent {
		ds := byID[p.id]
		delete(byID, p.id)
		if len(ds) != 1 {
			t.Errorf("poison %s (%s): %d dead letters, want 1", p.id, p.kind, len(ds))
			continue
		}
		d := ds[0]
		switch r.kind {
		case "redis":
			if d.Reason.Reason != p.wantReason || d.Reason.Error == "" {
				t.Errorf("poison %s: dead-letter reason %q (%q), want %q with an error", p.id, d.Reason.Reason, d.Reason.Error, p.wantReason)
			}
			reasons[p.kind] = d.Reason.Reason + ": " + trim(d.Reason.Error, 90)
		case "rabbitmq":
			// RabbitMQ records why it dead-lettered (x-death); the
			// worker's reason is in the task's FAILURE result and the log.
			if d.Reason.Reason != "rejected" {
				t.Errorf("poison %s: x-death reason %q, want rejected", p.id, d.Reason.Reason)
			}
			reasons[p.kind] = "x-death " + d.Reason.Reason
			if why := r.failureOf(ctx, p.id); why != "" {
				reasons[p.kind] += "; FAILURE " + trim(why, 90)
			} else if p.headers["id"] != nil {
				t.Errorf("poison %s: no FAILURE result stored", p.id)
			}
		}
	}
	for id, ds := range byID {
		t.Errorf("unexpected dead letters %q: %d (%+v)", id, len(ds), ds[0].Reason)
	}
	kinds := make([]string, 0, len(reasons))
	for k := range reasons {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		t.Logf("dead letter %-22s %s", k, reasons[k])
	}
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// failureOf returns the exception stored for a task id ("" if none).
func (r *fltRun) failureOf(ctx context.Context, id string) string {
	raw, err := r.effects.Get(ctx, "celery-task-meta-"+id).Bytes()
	if err != nil {
		return ""
	}
	var meta struct {
		Status string `json:"status"`
		Result struct {
			Type    string `json:"exc_type"`
			Message any    `json:"exc_message"`
		} `json:"result"`
	}
	if json.Unmarshal(raw, &meta) != nil || meta.Status != string(protocol.StateFailure) {
		return ""
	}
	return fmt.Sprintf("%s%v", meta.Result.Type, meta.Result.Message)
}

// waitDrained waits until nothing is left on the broker, and returns what
// is left when timeout passes first.
func (r *fltRun) waitDrained(ctx context.Context, timeout time.Duration) (ready, unacked int) {
	deadline := time.Now().Add(timeout)
	for {
		ready, unacked = r.leftOnBroker(ctx)
		if ready == 0 && unacked == 0 || time.Now().After(deadline) {
			return ready, unacked
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// leftOnBroker counts the suite queue's messages still ready, and (Redis)
// still unacked.
func (r *fltRun) leftOnBroker(ctx context.Context) (ready, unacked int) {
	t := r.t
	switch r.kind {
	case "redis":
		rdb := r.brokerRedis()
		defer rdb.Close()
		for _, k := range []string{r.queue, r.queue + "\x06\x163", r.queue + "\x06\x166", r.queue + "\x06\x169"} {
			n, err := rdb.LLen(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			ready += int(n)
		}
		n, err := rdb.HLen(ctx, "unacked").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ready, int(n)
	default:
		return readyMessages(t, brokerCase{broker: r.broker}, r.queue), 0
	}
}

// diagnose logs where the tasks whose effect is missing are: still queued,
// unacked (and since when), or nowhere; and the workers' warnings.
func (r *fltRun) diagnose(n int, procs ...*fltProc) {
	t := r.t
	ctx := context.Background()
	var missing []string
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		if ok, _ := r.effects.SIsMember(ctx, r.keys.effects, k).Result(); !ok {
			missing = append(missing, k)
		}
		if len(missing) > 20 {
			break
		}
	}
	t.Logf("missing effects (first 20): %v", missing)
	if r.kind == "redis" {
		rdb := r.brokerRedis()
		defer rdb.Close()
		ready, unacked := r.leftOnBroker(ctx)
		t.Logf("broker: %d ready, %d unacked", ready, unacked)
		all, _ := rdb.HGetAll(ctx, "unacked").Result()
		for tag, v := range all {
			score, _ := rdb.ZScore(ctx, "unacked_index", tag).Result()
			t.Logf("unacked %s (index %.3f, now %d): %s", tag, score, time.Now().Unix(), trim(v, 400))
		}
		items, _ := rdb.LRange(ctx, r.queue, 0, 5).Result()
		for _, it := range items {
			t.Logf("queued: %s", trim(it, 300))
		}
	}
	if r.kind == "rabbitmq" {
		out, _ := exec.Command("rabbitmqctl", "list_queues", "-q", "name", "messages_ready", "messages_unacknowledged", "consumers").Output()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, r.queue) {
				t.Logf("rabbitmq queue (name ready unacked consumers): %s", line)
			}
		}
		out, _ = exec.Command("rabbitmqctl", "list_channels", "-q", "name", "prefetch_count", "messages_unacknowledged", "consumer_count").Output()
		t.Logf("rabbitmq channels (name prefetch unacked consumers):\n%s", out)
	}
	for i, p := range procs {
		var warn []string
		for _, line := range strings.Split(p.Log(), "\n") {
			if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
				warn = append(warn, trim(line, 500))
			}
		}
		t.Logf("worker %d warnings/errors (%d), last 30:\n%s", i, len(warn), tail(strings.Join(warn, "\n"), 30))
	}
}
