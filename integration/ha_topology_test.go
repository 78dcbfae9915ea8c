package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The highly available topologies of issue 16, started once per package by
// the first test that needs them and torn down when the package's tests
// end (TestMain): a RabbitMQ cluster of 3 nodes and a Redis master with a
// replica and 3 Sentinels. Every server has its own ports, data directory
// and (RabbitMQ) node name and Erlang cookie; the shared brokers are never
// touched. A topology that cannot start fails the test that asked for it,
// with the reason, and every later test that asks.

var (
	topoMu    sync.Mutex
	topoStops []func()
)

// stopTopologies tears down the topologies, for TestMain.
func stopTopologies() {
	topoMu.Lock()
	stops := topoStops
	topoStops = nil
	topoMu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

func onTopologyStop(f func()) {
	topoMu.Lock()
	defer topoMu.Unlock()
	topoStops = append(topoStops, f)
}

// ---------------------------------------------------------------- RabbitMQ

// rmqNode is one node of the test cluster.
type rmqNode struct {
	name   string // Erlang node name, haNNNN-1@localhost
	port   int    // AMQP
	dir    string
	env    []string
	server string
	ctl    string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// rmqCluster is 3 clustered nodes.
type rmqCluster struct {
	nodes []*rmqNode
	user  string
	pass  string
}

var (
	clusterOnce sync.Once
	clusterVal  *rmqCluster
	clusterErr  error
)

// rabbitCluster returns the package's RabbitMQ cluster, starting it on
// first use; it fails the test when the cluster cannot start.
func rabbitCluster(t *testing.T) *rmqCluster {
	t.Helper()
	clusterOnce.Do(func() {
		clusterVal, clusterErr = startRabbitCluster(3)
	})
	if clusterErr != nil {
		t.Fatalf("RabbitMQ cluster of the test's own did not start: %v", clusterErr)
	}
	return clusterVal
}

func startRabbitCluster(n int) (*rmqCluster, error) {
	const bin = "/usr/lib/rabbitmq/bin/"
	if _, err := os.Stat(bin + "rabbitmq-server"); err != nil {
		return nil, fmt.Errorf("RabbitMQ not installed at %s: %w", bin, err)
	}
	// A node started while no epmd runs would start one in its own process
	// group, and kill -9 of the node would take the port mapper of every
	// node on the machine with it, the shared broker's included.
	if out, err := exec.Command("epmd", "-daemon").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("epmd -daemon: %v: %s", err, out)
	}
	base, err := os.MkdirTemp("", "celeriac-ha-rmq")
	if err != nil {
		return nil, err
	}
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	c := &rmqCluster{user: "ha", pass: "ha-pw-" + hex.EncodeToString(id)}
	onTopologyStop(func() {
		var wg sync.WaitGroup
		for _, nd := range c.nodes {
			wg.Go(func() { nd.stop() })
		}
		wg.Wait()
		os.RemoveAll(base)
	})
	for i := range n {
		nd, err := newRMQNode(base, fmt.Sprintf("ha%s-%d@localhost", hex.EncodeToString(id), i+1), strings.ToUpper(hex.EncodeToString(cookie)), c.user, c.pass)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, nd)
	}
	// The nodes boot in parallel (each takes seconds), then join the first.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, nd := range c.nodes {
		wg.Go(func() { errs[i] = nd.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, nd := range c.nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.nodes[0].name}, {"start_app"}} {
			if out, err := nd.ctlRun(args...); err != nil {
				return nil, fmt.Errorf("%s: rabbitmqctl %s: %v\n%s", nd.name, strings.Join(args, " "), err, out)
			}
		}
	}
	if out, err := c.nodes[0].ctlRun("await_online_nodes", strconv.Itoa(n), "--timeout", "60"); err != nil {
		return nil, fmt.Errorf("cluster of %d did not form: %v\n%s", n, err, out)
	}
	return c, nil
}

func newRMQNode(base, name, cookie, user, pass string) (*rmqNode, error) {
	short, _, _ := strings.Cut(name, "@")
	dir := filepath.Join(base, short)
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "home", ".erlang.cookie"), []byte(cookie), 0o400); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return nil, err
	}
	port, err := freePortErr()
	if err != nil {
		return nil, err
	}
	dist, err := freePortErr()
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("default_user = %s\ndefault_pass = %s\nloopback_users = none\nlisteners.tcp.default = 127.0.0.1:%d\n", user, pass, port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	const bin = "/usr/lib/rabbitmq/bin/"
	nd := &rmqNode{name: name, port: port, dir: dir, server: bin + "rabbitmq-server", ctl: bin + "rabbitmqctl"}
	nd.env = append(os.Environ(),
		"HOME="+filepath.Join(dir, "home"),
		"RABBITMQ_NODENAME="+name,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		// Erlang schedulers busy-wait by default: on 2 shared cores three
		// idle nodes would burn CPU the tests need. Two schedulers each.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+sbwt none +sbwtdcpu none +sbwtdio none +S 2:2",
	)
	return nd, nil
}

func freePortErr() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start boots the node and waits until it serves AMQP.
func (nd *rmqNode) start() error {
	cmd := exec.Command(nd.server)
	cmd.Env = nd.env
	cmd.Dir = nd.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.OpenFile(filepath.Join(nd.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	nd.mu.Lock()
	nd.cmd = cmd
	nd.mu.Unlock()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	go func() {
		<-done
		nd.mu.Lock()
		if nd.cmd == cmd {
			nd.cmd = nil
		}
		nd.mu.Unlock()
	}()
	deadline := time.Now().Add(120 * time.Second)
	for !waitPort(nd.port, time.Second) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(nd.dir, "server.out"))
			return fmt.Errorf("node %s exited while starting:\n%s", nd.name, tail(string(log), 30))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(nd.dir, "server.out"))
			nd.kill9()
			return fmt.Errorf("node %s not listening on %d after 120 s:\n%s", nd.name, nd.port, tail(string(log), 30))
		}
	}
	return nil
}

// kill9 kills the node's whole process group with SIGKILL (the Erlang VM
// and its helpers; epmd runs as its own daemon).
func (nd *rmqNode) kill9() {
	nd.mu.Lock()
	cmd := nd.cmd
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	for range 100 {
		nd.mu.Lock()
		gone := nd.cmd != cmd
		nd.mu.Unlock()
		if gone {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the node gracefully, killing it if it does not stop.
func (nd *rmqNode) stop() {
	nd.mu.Lock()
	cmd := nd.cmd
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_, _ = nd.ctlRun("stop")
	for range 600 {
		nd.mu.Lock()
		gone := nd.cmd != cmd
		nd.mu.Unlock()
		if gone {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	nd.kill9()
}

func (nd *rmqNode) running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.cmd != nil
}

// ctlRun runs rabbitmqctl against the node.
func (nd *rmqNode) ctlRun(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nd.ctl, append([]string{"-n", nd.name}, args...)...)
	cmd.Env = nd.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cpu returns the CPU time the node's processes used so far.
func (nd *rmqNode) cpu() time.Duration {
	nd.mu.Lock()
	cmd := nd.cmd
	nd.mu.Unlock()
	if cmd == nil {
		return 0
	}
	return groupCPU(cmd.Process.Pid)
}

// groupCPU sums user and system time of the processes of a process group
// (from /proc; 100 clock ticks a second on Linux).
func groupCPU(pgid int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// After "(comm)": state ppid pgrp session tty tpgid flags minflt
		// cminflt majflt cmajflt utime stime ...
		if len(f) < 13 {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g != pgid {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// url is the AMQP URL of node i.
func (c *rmqCluster) url(i int) string {
	return fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d//", c.user, c.pass, c.nodes[i].port)
}

// urls lists every node's URL, starting with node first, ';'-separated
// (Celery's failover form).
func (c *rmqCluster) urls(first int) string {
	var us []string
	for k := range c.nodes {
		us = append(us, c.url((first+k)%len(c.nodes)))
	}
	return strings.Join(us, ";")
}

// nodeOfPort returns the index of the node listening on port, or -1.
func (c *rmqCluster) nodeOfPort(port int) int {
	for i, nd := range c.nodes {
		if nd.port == port {
			return i
		}
	}
	return -1
}

// ctl runs rabbitmqctl on the first running node.
func (c *rmqCluster) ctl(args ...string) (string, error) {
	for _, nd := range c.nodes {
		if nd.running() {
			return nd.ctlRun(args...)
		}
	}
	return "", errors.New("no node running")
}

// queueInfo returns a quorum queue's leader and members as RabbitMQ lists
// them.
func (c *rmqCluster) queueInfo(queue string) (leader string, members []string, err error) {
	out, err := c.ctl("list_queues", "name", "leader", "members", "--quiet", "--no-table-headers")
	if err != nil {
		return "", nil, fmt.Errorf("list_queues: %v: %s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 3 && f[0] == queue {
			ms := strings.Trim(f[2], "[]")
			for _, m := range strings.Split(ms, ",") {
				if m = strings.Trim(strings.TrimSpace(m), "'\""); m != "" {
					members = append(members, m)
				}
			}
			return f[1], members, nil
		}
	}
	return "", nil, fmt.Errorf("queue %s not listed:\n%s", queue, out)
}

// nodeIndex returns the index of the node named name, or -1.
func (c *rmqCluster) nodeIndex(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// cpu sums the CPU time of every running node.
func (c *rmqCluster) cpu() time.Duration {
	var d time.Duration
	for _, nd := range c.nodes {
		d += nd.cpu()
	}
	return d
}

// ---------------------------------------------------------------- Sentinel

// redisNode is a redis-server or a Sentinel of the test's own.
type redisNode struct {
	port int
	dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (r *redisNode) start() error {
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.Dir = r.dir
	out, err := os.OpenFile(filepath.Join(r.dir, "server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = cmd.Wait()
		r.mu.Lock()
		if r.cmd == cmd {
			r.cmd = nil
		}
		r.mu.Unlock()
	}()
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	if !waitPort(r.port, 30*time.Second) {
		log, _ := os.ReadFile(filepath.Join(r.dir, "server.out"))
		return fmt.Errorf("%s on %d did not start:\n%s", filepath.Base(r.args[0]), r.port, tail(string(log), 20))
	}
	return nil
}

func (r *redisNode) signal(sig syscall.Signal) {
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	for range 400 {
		r.mu.Lock()
		gone := r.cmd != cmd
		r.mu.Unlock()
		if gone {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
}

func (r *redisNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// sentinelSet is a master, a replica and 3 Sentinels monitoring them as
// master group name. Which server is the master changes with failovers.
type sentinelSet struct {
	name      string
	pass      string       // the data servers' password (requirepass, masterauth)
	spass     string       // the Sentinels' own password (kombu's sentinel_kwargs)
	servers   []*redisNode // the two data servers
	sentinels []*redisNode
	// lastFailover is when a test last made the Sentinels fail over.
	lastFailover time.Time
}

var (
	sentinelOnce sync.Once
	sentinelVal  *sentinelSet
	sentinelErr  error
)

// redisSentinels returns the package's Sentinel topology, starting it on
// first use; it fails the test when it cannot start.
func redisSentinels(t *testing.T) *sentinelSet {
	t.Helper()
	sentinelOnce.Do(func() {
		sentinelVal, sentinelErr = startSentinelSet()
	})
	if sentinelErr != nil {
		t.Fatalf("Redis master, replica and Sentinels of the test's own did not start: %v", sentinelErr)
	}
	return sentinelVal
}

func startSentinelSet() (*sentinelSet, error) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not installed: %w", err)
	}
	// Debian's redis-sentinel is redis-server started in Sentinel mode.
	sentinel := []string{server, "--sentinel"}
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		sentinel = []string{p}
	}
	base, err := os.MkdirTemp("", "celeriac-ha-redis")
	if err != nil {
		return nil, err
	}
	s := &sentinelSet{name: "ha_" + strings.ToLower(rand.Text()[:8]),
		pass: "ha-data-" + strings.ToLower(rand.Text()[:10]), spass: "ha-sentinel-" + strings.ToLower(rand.Text()[:10])}
	onTopologyStop(func() {
		for _, r := range append(append([]*redisNode(nil), s.sentinels...), s.servers...) {
			r.signal(syscall.SIGTERM)
		}
		os.RemoveAll(base)
	})
	for i := range 2 {
		port, err := freePortErr()
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(base, fmt.Sprintf("redis%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		// min-replicas-to-write: a master without a replica refuses
		// writes. After SENTINEL FAILOVER the Sentinels turn the old master
		// into a replica only some 10 s later; without this setting it
		// goes on accepting the writes of clients still connected to it
		// (kombu's), and they are lost when it resyncs.
		args := []string{server, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
			"--min-replicas-to-write", "1", "--min-replicas-max-lag", "10",
			"--requirepass", s.pass, "--masterauth", s.pass}
		s.servers = append(s.servers, &redisNode{port: port, dir: dir, args: args})
	}
	// The second server replicates the first.
	s.servers[1].args = append(s.servers[1].args, "--replicaof", "127.0.0.1", strconv.Itoa(s.servers[0].port))
	for _, r := range s.servers {
		if err := r.start(); err != nil {
			return nil, err
		}
	}
	for i := range 3 {
		port, err := freePortErr()
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(base, fmt.Sprintf("sentinel%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		// Passwords everywhere, as production Sentinels have them: the
		// data servers', and the Sentinels' own (requirepass, and
		// sentinel-pass to talk to each other).
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 3000\nsentinel parallel-syncs %s 1\n"+
			"sentinel auth-pass %s %s\nrequirepass %s\nsentinel sentinel-pass %s\n",
			port, dir, s.name, s.servers[0].port, s.name, s.name, s.name, s.name, s.pass, s.spass, s.spass)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		args := append([]string{sentinel[0], conf}, sentinel[1:]...)
		r := &redisNode{port: port, dir: dir, args: args}
		s.sentinels = append(s.sentinels, r)
		if err := r.start(); err != nil {
			return nil, err
		}
	}
	// Ready when every Sentinel knows the replica and the other Sentinels,
	// and the replica is in sync.
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok := true
		for _, sn := range s.sentinels {
			c := goredis.NewSentinelClient(&goredis.Options{Addr: sn.addr(), Password: s.spass})
			err := c.CkQuorum(ctx, s.name).Err()
			reps, rerr := c.Replicas(ctx, s.name).Result()
			c.Close()
			if err != nil || rerr != nil || len(reps) != 1 || reps[0]["flags"] != "slave" {
				ok = false
			}
			sents := goredis.NewClient(&goredis.Options{Addr: sn.addr(), Password: s.spass})
			n, _ := sents.Do(ctx, "SENTINEL", "SENTINELS", s.name).Slice()
			sents.Close()
			if len(n) != 2 {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("the Sentinels did not see the replica and each other within 60 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := s.waitSynced(ctx, s.servers[0].addr(), 60*time.Second); err != nil {
		return nil, err
	}
	return s, nil
}

// url is the kombu Sentinel URL list for database db: the first URL
// carries the master's password and the database.
func (s *sentinelSet) url(db int) string {
	var us []string
	for i, sn := range s.sentinels {
		if i == 0 {
			us = append(us, fmt.Sprintf("sentinel://:%s@%s/%d", s.pass, sn.addr(), db))
		} else {
			us = append(us, "sentinel://"+sn.addr())
		}
	}
	return strings.Join(us, ";")
}

// master asks a Sentinel for the master's address.
func (s *sentinelSet) master(ctx context.Context) (string, error) {
	var errs []error
	for _, sn := range s.sentinels {
		c := goredis.NewSentinelClient(&goredis.Options{Addr: sn.addr(), Password: s.spass})
		a, err := c.GetMasterAddrByName(ctx, s.name).Result()
		c.Close()
		if err == nil && len(a) == 2 {
			return net.JoinHostPort(a[0], a[1]), nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// server returns the data server listening on addr.
func (s *sentinelSet) server(addr string) *redisNode {
	for _, r := range s.servers {
		if r.addr() == addr {
			return r
		}
	}
	return nil
}

// waitMaster waits until the Sentinels name a master other than old that
// answers as a master, and returns it.
func (s *sentinelSet) waitMaster(ctx context.Context, old string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		m, err := s.master(ctx)
		if err == nil && m != old {
			c := goredis.NewClient(&goredis.Options{Addr: m, Password: s.pass})
			role, rerr := c.Do(ctx, "ROLE").Slice()
			c.Close()
			if rerr == nil && len(role) > 0 && role[0] == "master" {
				return m, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no new master after %s (Sentinels say %q, %v)", timeout, m, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitSynced waits until the master has a replica online that has caught
// up with everything the master had when the wait began.
func (s *sentinelSet) waitSynced(ctx context.Context, master string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := goredis.NewClient(&goredis.Options{Addr: master, Password: s.pass})
	defer c.Close()
	target := int64(-1)
	for {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil {
			var moff, roff int64 = -1, -1
			online := false
			for _, line := range strings.Split(info, "\n") {
				line = strings.TrimSpace(line)
				if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
					moff, _ = strconv.ParseInt(v, 10, 64)
				}
				if rest, ok := strings.CutPrefix(line, "slave0:"); ok {
					for _, f := range strings.Split(rest, ",") {
						if v, ok := strings.CutPrefix(f, "offset="); ok {
							roff, _ = strconv.ParseInt(v, 10, 64)
						}
						if f == "state=online" {
							online = true
						}
					}
				}
			}
			if target < 0 {
				target = moff
			}
			if online && target >= 0 && roff >= target {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica of %s not in sync after %s", master, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restartAsReplica starts a stopped data server again as a replica of
// master (Sentinel would turn a returning old master into one too, after a
// moment in which clients could still write to it).
func (s *sentinelSet) restartAsReplica(r *redisNode, master string) error {
	host, port, _ := net.SplitHostPort(master)
	args := slicesWithout(r.args, "--replicaof")
	r.args = append(args, "--replicaof", host, port)
	return r.start()
}

// slicesWithout drops flag and its two values from args.
func slicesWithout(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i += 2
			continue
		}
		out = append(out, args[i])
	}
	return out
}
