package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// TestHAClusterFaults is issue 16's RabbitMQ fault run: N tasks (default
// 10 000, CELERIAC_FLT_N) published by Python Celery with confirm_publish
// into a quorum queue replicated on the 3 nodes of a cluster of the test's
// own, run by two celeriac worker processes (acks_late, each effect
// recorded exactly once) that reach the cluster through Celery's failover
// URLs. During the run the node worker a consumes from is killed with -9
// and restarted; later the node leading the quorum queue is stopped and
// restarted. Nothing may be lost and no effect may happen twice; it prints
// the redeliveries, the seconds each worker took to consume again, and the
// throughput while degraded against healthy.
func TestHAClusterFaults(t *testing.T) {
	n := fltN(t)
	pythonBin(t)
	c := rabbitCluster(t)
	r := newHARun(t, "rmq", n)
	qargs := map[string]any{"x-queue-type": "quorum"}

	// Python publishes everything first, through the third node, in two
	// processes: the workers then drain a backlog, so their throughput is
	// what is measured. Each task sleeps 60 ms (133 tasks/s at most for the
	// 8 slots), so that the run lasts through two faults and a restart of
	// a node (which takes 20-45 s on a loaded machine).
	pubStart := time.Now()
	var pubs []*publisher
	for i := range 2 {
		pubs = append(pubs, startFltPublisher(t, n/2, map[string]string{
			"IT_BROKER": c.urls(2), "IT_QUEUE": r.queue, "IT_QUEUE_ARGS": `{"x-queue-type": "quorum"}`,
			"IT_OFFSET": fmt.Sprint(i * (n / 2)), "IT_SLEEP_MS": "60"}))
	}
	for _, p := range pubs {
		if err := p.wait(5 * time.Minute); err != nil {
			t.Fatalf("python publisher: %v", err)
		}
	}
	pubSecs := time.Since(pubStart).Seconds()
	leader, members, err := c.queueInfo(r.queue)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("quorum queue %s has members %v, want all 3 nodes", r.queue, members)
	}
	t.Logf("%d tasks published in %.1f s; quorum queue leader %s, members %v", n, pubSecs, leader, members)
	t.Cleanup(func() {
		conn, err := amqp091.Dial(c.url(0))
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(r.queue, false, false, false)
			_ = ch.ExchangeDelete(r.queue, false, false)
		}
	})

	wcfg := func(name string, first int) fltWorkerConfig {
		return fltWorkerConfig{Broker: c.urls(first), Effects: redisDBURL(t, fltEffectDB), Prefix: r.prefix, Queue: r.queue,
			Name: r.queue + "-" + name, Hostname: name + "@" + r.queue, Concurrency: 4,
			QueueArguments: map[string]map[string]any{r.queue: qargs}}
	}
	r.sample()
	a := startFltWorker(t, wcfg("a", 0))
	// b starts with the third node, where the queue was declared and where
	// its leader usually is, so that stopping the leader moves b too.
	b := startFltWorker(t, wcfg("b", 2))
	healthyFrom := r.waitCount(n/20, 3*time.Minute, a, b)
	healthyTo := r.waitCount(n/5, 3*time.Minute, a, b)
	healthy := r.rate(healthyFrom, healthyTo)

	// Fault 1: kill -9 the node worker a consumes from.
	aNode := c.nodeOfPort(amqpNodePort(a.Log()))
	if aNode < 0 {
		t.Fatalf("cannot tell which node worker a uses:\n%s", tail(a.Log(), 20))
	}
	bBefore := amqpNodePort(b.Log())
	killedAt := time.Now()
	c.nodes[aNode].kill9()
	t.Logf("%d effects: node %s (worker a's) killed -9", r.fr.effectCount(), c.nodes[aNode].name)
	degraded1To := r.waitCount(n*40/100, 3*time.Minute, a, b)
	degraded1 := r.rate(killedAt, degraded1To)
	resumeA, ok := resumedAfter(a.Log(), "amqp consumer resumed", killedAt)
	if !ok {
		t.Errorf("worker a never logged that its consumer resumed after the kill:\n%s", tail(a.Log(), 30))
	}
	resume := map[string]float64{"a (node killed -9)": resumeA.Sub(killedAt).Seconds()}
	if bBefore == c.nodes[aNode].port {
		if rb, ok := resumedAfter(b.Log(), "amqp consumer resumed", killedAt); ok {
			resume["b (node killed -9)"] = rb.Sub(killedAt).Seconds()
		}
	}
	pause1 := r.longestPause(killedAt, degraded1To)
	if err := c.nodes[aNode].start(); err != nil {
		t.Fatalf("restarting the killed node: %v", err)
	}
	if out, err := c.nodes[aNode].ctlRun("await_online_nodes", "3", "--timeout", "60"); err != nil {
		t.Fatalf("the killed node did not rejoin: %v\n%s", err, out)
	}
	rejoined := time.Since(killedAt).Seconds()
	if r.fr.effectCount() >= n/2 {
		t.Logf("the run passed 50%% before the killed node rejoined (%.1f s after the kill): the leader stop comes later than planned", rejoined)
	}

	// Fault 2: stop the node leading the quorum queue.
	r.waitCount(n/2, 3*time.Minute, a, b)
	if r.fr.effectCount() >= n*95/100 {
		t.Fatalf("%d of %d effects before the leader stop: the run is too short to measure it (killed node rejoined after %.1f s)", r.fr.effectCount(), n, rejoined)
	}
	leader, _, err = c.queueInfo(r.queue)
	if err != nil {
		t.Fatal(err)
	}
	li := c.nodeIndex(leader)
	if li < 0 {
		t.Fatalf("leader %q is none of the cluster's nodes", leader)
	}
	users := map[string]bool{}
	for name, p := range map[string]*fltProc{"a": a, "b": b} {
		if amqpNodePort(p.Log()) == c.nodes[li].port {
			users[name] = true
		}
	}
	stoppedAt := time.Now()
	c.nodes[li].stop()
	stopSecs := time.Since(stoppedAt).Seconds()
	t.Logf("%d effects: quorum leader %s stopped (%.1f s), used by workers %v", r.fr.effectCount(), leader, stopSecs, users)
	degraded2To := r.waitCount(min(r.fr.effectCount()+n/5, n), 3*time.Minute, a, b)
	degraded2 := r.rate(stoppedAt, degraded2To)
	pause2 := r.longestPause(stoppedAt, degraded2To)
	for name, p := range map[string]*fltProc{"a": a, "b": b} {
		if !users[name] {
			continue
		}
		if at, ok := resumedAfter(p.Log(), "amqp consumer resumed", stoppedAt); ok {
			resume[name+" (leader stopped)"] = at.Sub(stoppedAt).Seconds()
		} else {
			t.Errorf("worker %s never logged that its consumer resumed after the leader stopped:\n%s", name, tail(p.Log(), 30))
		}
	}
	newLeader, _, _ := c.queueInfo(r.queue)
	if err := c.nodes[li].start(); err != nil {
		t.Fatalf("restarting the stopped leader: %v", err)
	}

	r.waitCount(n, 4*time.Minute, a, b)
	elapsed := time.Since(healthyFrom)
	// What a killed connection held comes back; wait until the queue is
	// empty (messages ready and unacknowledged).
	var left string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := c.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
		left = "?"
		if err == nil {
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == r.queue {
					left = f[1]
				}
			}
		}
		if left == "0" || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.finish()
	lost, dups, redeliveries, flagged := r.counts()
	if lost != 0 || dups != 0 {
		t.Errorf("%d tasks lost, %d effects repeated; want 0 and 0", lost, dups)
	}
	if left != "0" {
		t.Errorf("%s messages left in the quorum queue, want 0", left)
	}
	for name, p := range map[string]*fltProc{"a": a, "b": b} {
		if err := p.Term(60 * time.Second); err != nil {
			t.Errorf("worker %s after SIGTERM: %v\n%s", name, err, tail(p.Log(), 30))
		}
	}
	var rs []string
	for k, v := range resume {
		rs = append(rs, fmt.Sprintf("%s %.1f s", k, v))
	}
	t.Logf("COUNTS rabbitmq cluster: %d tasks published by Python (confirm_publish, %.1f s) to a quorum queue on 3 nodes, 2 celeriac workers (acks_late); "+
		"node killed -9 and restarted, quorum leader stopped (leader moved %s -> %s) and restarted: %d lost, %d duplicate effects, "+
		"%d redeliveries (%d flagged redelivered); consumer resumed on another node after: %s; longest pause in effects after the kill %.1f s, "+
		"after the leader stop %.1f s; killed node back in the cluster after %.1f s; throughput healthy %.0f/s, "+
		"after the kill %.0f/s (%.0f%%), after the leader stop %.0f/s (%.0f%%); %s",
		n, pubSecs, leader, newLeader, lost, dups, redeliveries, flagged, strings.Join(rs, ", "), pause1.Seconds(), pause2.Seconds(), rejoined,
		healthy, degraded1, 100*degraded1/healthy, degraded2, 100*degraded2/healthy, elapsed.Round(time.Millisecond))
}
