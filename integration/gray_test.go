package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// The gray-failure matrix (issue 27): faults that leave the socket open
// (a blackholed link, one direction dropped, a slow link, a frozen broker)
// and servers that cut connections, put between each worker and its broker
// by Shopify's toxiproxy, run in-process as a library. The same fault, at
// the same moment, hits celeriac and each Python Celery version, each
// behind its own proxy, consuming its own queue, while a Python producer
// per subject publishes tasks straight to the broker. Per subject:
//
//	detect   seconds from the fault until the worker opened a new
//	         connection through its proxy (it noticed a dead link); "-"
//	         when it never did
//	resume   seconds from the heal until its next task effect
//	lost     tasks neither run nor still at the broker (must be 0)
//	dup      effects applied twice (0: flt.record is idempotent by key)
//	runs2x   tasks whose body ran more than once (what a task without an
//	         idempotency key would have done twice)
//	ping     seconds after the heal until remote control answered
//	readyz   what celeriac's /readyz said during the fault
//
// A blackhole holds the bytes of both directions (holdToxic): held, not
// dropped, as TCP retransmission holds them, so a connection nobody gave
// up on carries on after the heal exactly as it would on a real network. In CI: the 10 s and 90 s variants. CELERIAC_GRAY_LONG=1
// adds the 10 min blackhole and the 5 min freeze (docs/network-faults.md).

// grayN is the number of tasks per subject and run.
func grayN() int {
	if s := os.Getenv("CELERIAC_GRAY_N"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return 2000
}

// grayFault is one row of the matrix.
type grayFault struct {
	name string
	dur  time.Duration
	// toxics are added to every subject's proxy at the fault and removed at
	// the heal (type, stream, attributes).
	toxics []grayToxic
	// ownNode runs it on a RabbitMQ node of its own (Redis runs always
	// have their own server).
	ownNode bool
	// apply and heal, when set, act on the broker itself (a private node).
	// apply may start something that runs until stop is closed.
	apply, heal func(t *testing.T, r *grayRun)
}

type grayToxic struct {
	typ, stream string
	attrs       map[string]any
}

func blackholeToxics(streams ...string) []grayToxic {
	var ts []grayToxic
	for _, s := range streams {
		ts = append(ts, grayToxic{typ: holdToxicType, stream: s})
	}
	return ts
}

// holdToxic is the blackhole: it holds every chunk, forwarding nothing and
// closing nothing, until its run's gate opens, then passes everything on.
// It is toxiproxy's latency toxic in spirit (bytes are held, not lost, as
// TCP retransmission holds them), with an instant heal: removing a latency
// toxic waits until it has written what it held, which can take minutes
// when the reader is gone (the first runs measured that wait, not the
// workers), while a gate opens for every subject at once and the toxic
// stays in place as a pass-through.
type holdToxic struct {
	Gate string `json:"gate"`
	// Sticky keeps the connections that existed at the fault held after
	// the heal, for good: a NAT gateway or load balancer that dropped its
	// flow table. Only connections made afterwards work.
	Sticky bool `json:"sticky"`
}

// holdGate is a run's gate: closed at the heal.
type holdGate struct {
	open    chan struct{}
	addedAt time.Time // when the toxics went in
}

const holdToxicType = "celeriac_hold"

// holdGates are the open-able gates, by name.
var holdGates sync.Map

func init() { toxics.Register(holdToxicType, new(holdToxic)) }

func (h *holdToxic) Pipe(stub *toxics.ToxicStub) {
	var gate chan struct{}
	if v, ok := holdGates.Load(h.Gate); ok {
		g := v.(*holdGate)
		gate = g.open
		// A link of the moment the toxic was added existed before the
		// fault; one started later was dialled during it.
		if h.Sticky && time.Since(g.addedAt) < time.Second {
			gate = nil // never opens
		}
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			select {
			case <-gate:
			case <-stub.Interrupt:
				return
			}
			select {
			case stub.Output <- c:
			case <-stub.Interrupt:
				return
			}
		}
	}
}

func grayFaults(kind string) []grayFault {
	both := []string{"upstream", "downstream"}
	fs := []grayFault{
		{name: "blackhole-10s", dur: 10 * time.Second, toxics: blackholeToxics(both...)},
		{name: "blackhole-90s", dur: 90 * time.Second, toxics: blackholeToxics(both...)},
		// The connections of the moment die for good, without FIN or RST
		// (a NAT gateway or load balancer dropped its flows); after 90 s
		// new connections work again.
		{name: "dead-flow-90s", dur: 90 * time.Second, toxics: []grayToxic{
			{holdToxicType, "upstream", map[string]any{"sticky": true}},
			{holdToxicType, "downstream", map[string]any{"sticky": true}},
		}},
		// Half-open: what the worker sends is lost, what the broker sends
		// arrives; and the reverse.
		{name: "oneway-up-90s", dur: 90 * time.Second, toxics: blackholeToxics("upstream")},
		{name: "oneway-down-90s", dur: 90 * time.Second, toxics: blackholeToxics("downstream")},
		{name: "slow-90s", dur: 90 * time.Second, toxics: []grayToxic{
			{"latency", "upstream", map[string]any{"latency": 150, "jitter": 50}},
			{"latency", "downstream", map[string]any{"latency": 150, "jitter": 50}},
			{"bandwidth", "upstream", map[string]any{"rate": 32}},
			{"bandwidth", "downstream", map[string]any{"rate": 32}},
		}},
		{name: "reset-peer-10s", dur: 10 * time.Second, toxics: []grayToxic{{"reset_peer", "downstream", map[string]any{"timeout": 0}}}},
		{name: "slicer-10s", dur: 10 * time.Second, toxics: []grayToxic{
			{"slicer", "upstream", map[string]any{"average_size": 1, "size_variation": 0, "delay": 20}},
			{"slicer", "downstream", map[string]any{"average_size": 1, "size_variation": 0, "delay": 20}},
		}},
	}
	if kind == "amqp" {
		fs = append(fs,
			// SIGSTOP of a whole node of the run's own.
			grayFault{name: "frozen-30s", dur: 30 * time.Second, ownNode: true,
				apply: func(t *testing.T, r *grayRun) { r.rabbit.signal(syscall.SIGSTOP) },
				heal:  func(t *testing.T, r *grayRun) { r.rabbit.signal(syscall.SIGCONT) }},
		)
	}
	if kind == "redis" {
		fs = append(fs,
			grayFault{name: "frozen-30s", dur: 30 * time.Second,
				apply: func(t *testing.T, r *grayRun) { r.redis.signal(syscall.SIGSTOP) },
				heal:  func(t *testing.T, r *grayRun) { r.redis.signal(syscall.SIGCONT) }},
			grayFault{name: "idle-timeout5-30s", dur: 30 * time.Second,
				apply: func(t *testing.T, r *grayRun) { r.redisDo(t, "CONFIG", "SET", "timeout", "5") },
				heal:  func(t *testing.T, r *grayRun) { r.redisDo(t, "CONFIG", "SET", "timeout", "0") }},
			grayFault{name: "kill-pubsub", dur: 10 * time.Second,
				apply: func(t *testing.T, r *grayRun) { r.redisDo(t, "CLIENT", "KILL", "TYPE", "pubsub") }},
			grayFault{name: "kill-consumer-10s", dur: 10 * time.Second,
				apply: func(t *testing.T, r *grayRun) { r.killConsumers(t) }},
		)
	}
	if os.Getenv("CELERIAC_GRAY_LONG") == "1" {
		fs = append(fs, grayFault{name: "blackhole-10m", dur: 10 * time.Minute, toxics: blackholeToxics(both...)})
		if kind == "amqp" {
			// A second node of the run's own: slow to start on a busy
			// machine, so not in CI.
			fs = append(fs,
				grayFault{name: "close-connections", dur: 10 * time.Second, ownNode: true,
					apply: func(t *testing.T, r *grayRun) {
						if out, err := r.rabbit.Ctl("close_all_connections", "gray matrix"); err != nil {
							t.Errorf("close_all_connections: %v\n%s", err, out)
						}
					}},
			)
			fs = append(fs, grayFault{name: "frozen-5m", dur: 5 * time.Minute, ownNode: true,
				apply: func(t *testing.T, r *grayRun) { r.rabbit.signal(syscall.SIGSTOP) },
				heal:  func(t *testing.T, r *grayRun) { r.rabbit.signal(syscall.SIGCONT) }})
		}
		if kind == "redis" {
			fs = append(fs, grayFault{name: "frozen-5m", dur: 5 * time.Minute,
				apply: func(t *testing.T, r *grayRun) { r.redis.signal(syscall.SIGSTOP) },
				heal:  func(t *testing.T, r *grayRun) { r.redis.signal(syscall.SIGCONT) }})
		}
	}
	if only := os.Getenv("CELERIAC_GRAY_ONLY"); only != "" {
		var kept []grayFault
		for _, f := range fs {
			if strings.Contains(","+only+",", ","+f.name+",") {
				kept = append(kept, f)
			}
		}
		fs = kept
	}
	return fs
}

// grayNet is the in-process toxiproxy server; it logs every accepted
// connection, which is how a subject's reconnection is seen.
type grayNet struct {
	server  *toxiproxy.ApiServer
	mu      sync.Mutex
	accepts map[string][]time.Time // by proxy name
}

func newGrayNet() *grayNet {
	g := &grayNet{accepts: map[string][]time.Time{}}
	g.server = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.New(g))
	return g
}

// Write receives toxiproxy's JSON log lines.
func (g *grayNet) Write(b []byte) (int, error) {
	var line struct {
		Message string `json:"message"`
		Name    string `json:"name"`
	}
	if json.Unmarshal(b, &line) == nil && line.Message == "Accepted client" {
		g.mu.Lock()
		g.accepts[line.Name] = append(g.accepts[line.Name], time.Now())
		g.mu.Unlock()
	}
	return len(b), nil
}

// firstAccept returns the first connection accepted by proxy name after t.
func (g *grayNet) firstAccept(name string, after time.Time) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, at := range g.accepts[name] {
		if at.After(after) {
			return at, true
		}
	}
	return time.Time{}, false
}

// grayProxy is one subject's proxy.
type grayProxy struct {
	p    *toxiproxy.Proxy
	name string
}

func (g *grayNet) proxy(t *testing.T, name, upstream string) *grayProxy {
	t.Helper()
	p := toxiproxy.NewProxy(g.server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy %s: %v", name, err)
	}
	t.Cleanup(func() {
		// A toxic blocked on a reader that is gone can hold Stop up.
		done := make(chan struct{})
		go func() { p.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})
	return &grayProxy{p: p, name: name}
}

// url is brokerURL with the proxy's address.
func (p *grayProxy) url(t *testing.T, brokerURL string) string {
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.p.Listen
	return u.String()
}

func (p *grayProxy) add(t *testing.T, i int, x grayToxic, gate string) {
	if x.typ == holdToxicType {
		x.attrs = map[string]any{"gate": gate, "sticky": x.attrs["sticky"] == true}
	}
	raw, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("t%d", i), "type": x.typ, "stream": x.stream, "attributes": x.attrs})
	if _, err := p.p.Toxics.AddToxicJson(bytes.NewReader(raw)); err != nil {
		t.Errorf("toxic %s on %s: %v", raw, p.name, err)
	}
}

func (p *grayProxy) remove(t *testing.T, i int) {
	if err := p.p.Toxics.RemoveToxic(context.Background(), fmt.Sprintf("t%d", i)); err != nil {
		t.Errorf("remove toxic %d on %s: %v", i, p.name, err)
	}
}

// grayRun is one fault run: on Redis a server of the run's own (one
// database per subject, so that kombu's unacked hash is each subject's,
// and so that freezing it touches no other run), on RabbitMQ the test
// broker's vhost.
type grayRun struct {
	kind     string
	redis    *ownRedis
	rabbit   *ownRabbit
	amqp     string
	subjects []*graySubject
	stop     chan struct{} // closed at the heal
}

func (r *grayRun) url(i int) string {
	if r.kind == "redis" {
		return r.redis.URL(i + 1)
	}
	return r.amqp
}

// redisDo runs a command on the run's own Redis.
func (r *grayRun) redisDo(t *testing.T, args ...any) {
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.redis.port)})
	defer rdb.Close()
	if err := rdb.Do(context.Background(), args...).Err(); err != nil {
		t.Errorf("redis %v: %v", args, err)
	}
}

// killConsumers kills, every second until the heal, the connections
// blocked in BLMOVE or BRPOP: the consuming connections only.
func (r *grayRun) killConsumers(t *testing.T) {
	go func() {
		rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.redis.port)})
		defer rdb.Close()
		for {
			list, _ := rdb.ClientList(context.Background()).Result()
			for _, line := range strings.Split(list, "\n") {
				var id, cmd string
				for _, f := range strings.Fields(line) {
					k, v, _ := strings.Cut(f, "=")
					switch k {
					case "id":
						id = v
					case "cmd":
						cmd = v
					}
				}
				if cmd == "blmove" || cmd == "brpop" || cmd == "bzmpop" || cmd == "blmpop" {
					rdb.Do(context.Background(), "CLIENT", "KILL", "ID", id)
				}
			}
			select {
			case <-r.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
}

// graySubject is one worker under test.
type graySubject struct {
	name     string // "celeriac", "celery-5.2.6", ...
	version  string // "" for celeriac, else "5.2", "5.5"
	hostname string
	queue    string
	prefix   string
	keys     fltKeys
	broker   string // direct URL (the producer's)
	proxy    *grayProxy
	stop     func()
	alive    func() bool
	log      func() string
	readyz   string // celeriac's /readyz URL

	// measured
	detect, resume, ping time.Duration
	detected, resumed    bool
	pinged               bool
	readyzSeen           map[int]int
	done, lost, dup      int
	runs2x, stuck        int
	resumeWaited         time.Duration
	idleAtEnd            time.Duration // with tasks left: how long nothing ran at the end
}

// attachFlt makes a celeriac fault-suite worker s's worker; mu guards
// subjects started at once.
func (s *graySubject) attachFlt(mu *sync.Mutex, p *fltProc) {
	mu.Lock()
	defer mu.Unlock()
	s.stop, s.alive, s.log = func() { _ = p.Term(30 * time.Second) }, func() bool { return !p.Exited() }, p.Log
}

// attachPy makes a Python Celery worker s's worker.
func (s *graySubject) attachPy(mu *sync.Mutex, w *pyWorker) {
	mu.Lock()
	defer mu.Unlock()
	s.stop = func() { w.Stop(20 * time.Second) }
	s.alive = func() bool {
		select {
		case <-w.done:
			return false
		default:
			return true
		}
	}
	s.log = w.Log
}

func TestGrayFaultsRedis(t *testing.T) {
	t.Parallel()
	pythonBin(t)
	runGrayMatrix(t, "redis")
}

func TestGrayFaultsRabbitMQ(t *testing.T) {
	t.Parallel()
	pythonBin(t)
	amqpURL(t)
	runGrayMatrix(t, "amqp")
}

// grayVersions are the Python Celery versions run next to celeriac: 5.2.6
// (the system's), and 5.5.2 and 5.6.3 as .ci/setup unpacks them.
func grayVersions(t *testing.T) []string {
	vs := []string{"5.2"}
	for _, v := range []string{"5.5", "5.6"} {
		if _, err := os.Stat(filepath.Join(unpackedCeleryPath(v), "celery")); err == nil {
			vs = append(vs, v)
		} else if requireBrokers() {
			t.Fatalf("Celery %s is not unpacked in %s: run .ci/setup", v, unpackedCeleryPath(v))
		}
	}
	return vs
}

// grayParallel is how many fault runs of one broker run at once
// (CELERIAC_GRAY_PARALLEL, default 3): each is three to four workers and
// as many producers, mostly idle.
func grayParallel() int {
	if n, err := strconv.Atoi(os.Getenv("CELERIAC_GRAY_PARALLEL")); err == nil && n > 0 {
		return n
	}
	return 3
}

// graySems bound the fault runs at once per broker, the result-backend
// runs (on RabbitMQ) included.
var graySems sync.Map // kind -> chan struct{}

func graySem(kind string) chan struct{} {
	sem, _ := graySems.LoadOrStore(kind, make(chan struct{}, grayParallel()))
	return sem.(chan struct{})
}

func runGrayMatrix(t *testing.T, kind string) {
	sem := graySem(kind)
	for _, f := range grayFaults(kind) {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			b := &grayRun{kind: kind, stop: make(chan struct{})}
			switch {
			case kind == "redis":
				b.redis = startOwnRedis(t, "", nil)
			case f.ownNode:
				b.rabbit = startOwnRabbit(t, "guest", "guest", nil)
				b.amqp = b.rabbit.URL()
			default:
				b.amqp = amqpURL(t)
			}
			runGrayFault(t, b, f)
		})
	}
}

func runGrayFault(t *testing.T, b *grayRun, f grayFault) {
	n := grayN()
	ctx := context.Background()
	gnet := newGrayNet()
	stamp := time.Now().UnixNano() % 1e9
	effectsURL := redisDBURL(t, fltEffectDB)
	opt, err := goredis.ParseURL(effectsURL)
	if err != nil {
		t.Fatal(err)
	}
	effects := goredis.NewClient(opt)
	defer effects.Close()

	var subjects []*graySubject
	for i, v := range append([]string{""}, grayVersions(t)...) {
		name := "celeriac"
		if v != "" {
			name = "celery-" + pyCeleryVersion(t, v)
		}
		s := &graySubject{name: name, version: v, broker: b.url(i), readyzSeen: map[int]int{}}
		tag := strings.NewReplacer(".", "", "-", "").Replace(name)
		s.queue = fmt.Sprintf("it_gray_%s_%s_%d", b.kind, tag, stamp)
		s.prefix = "it_gray:" + s.queue
		s.keys = fltKeysOf(s.prefix)
		s.hostname = tag + "@" + s.queue
		u, err := url.Parse(s.broker)
		if err != nil {
			t.Fatal(err)
		}
		s.proxy = gnet.proxy(t, s.queue, u.Host)
		subjects = append(subjects, s)
		b.subjects = subjects
		t.Cleanup(func() {
			effects.Del(context.Background(), s.keys.deliveries, s.keys.effects, s.keys.effectCount, s.keys.redelivered)
			grayCleanQueue(b, s)
		})
	}

	// The workers, all at once.
	var wg sync.WaitGroup
	var startMu sync.Mutex
	for _, s := range subjects {
		wg.Go(func() {
			brokerURL := s.proxy.url(t, s.broker)
			if s.version == "" {
				port := freePort(t)
				s.readyz = fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
				cfg := fltWorkerConfig{Broker: brokerURL, Effects: effectsURL, Prefix: s.prefix, Queue: s.queue,
					Name: s.queue, Hostname: s.hostname, Concurrency: 4, VisibilityTimeout: 30,
					Control: true, ReadyAddr: fmt.Sprintf("127.0.0.1:%d", port)}
				s.attachFlt(&startMu, startFltWorker(t, cfg))
				return
			}
			s.attachPy(&startMu, startGrayPyWorker(t, s.version, map[string]string{"IT_BROKER": brokerURL, "IT_QUEUE": s.queue,
				"IT_EFFECTS": effectsURL, "IT_PREFIX": s.prefix}, "-n", s.hostname, "-c", "4", "-P", "prefork", "--without-mingle", "--without-gossip"))
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	stopAll := func() {
		var wg sync.WaitGroup
		for _, s := range subjects {
			wg.Go(s.stop)
		}
		wg.Wait()
	}
	defer stopAll()

	// The producers: n tasks each, spread so that tasks keep coming through
	// the fault and after the heal.
	warm, after := 10*time.Second, 20*time.Second
	rate := float64(n) / (warm + f.dur + after).Seconds()
	var pubs []*publisher
	for _, s := range subjects {
		pubs = append(pubs, startFltPublisher(t, n, map[string]string{"IT_BROKER": s.broker, "IT_QUEUE": s.queue,
			"IT_RATE": strconv.FormatFloat(rate, 'f', 2, 64), "IT_SLEEP_MS": "0"}))
	}
	count := func(s *graySubject) int {
		c, _ := effects.Get(ctx, s.keys.effectCount).Int()
		return c
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, s := range subjects {
		for count(s) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s ran nothing before the fault:\n%s", s.name, tail(s.log(), 40))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(warm / 2)

	// The fault, on every subject at once.
	gateName := fmt.Sprintf("%s-%s-%d", b.kind, f.name, stamp)
	gate := make(chan struct{})
	holdGates.Store(gateName, &holdGate{open: gate, addedAt: time.Now()})
	defer holdGates.Delete(gateName)
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	defer openGate()
	start := time.Now()
	for _, s := range subjects {
		for i, x := range f.toxics {
			s.proxy.add(t, i, x, gateName)
		}
	}
	if f.apply != nil {
		if f.heal != nil {
			// Thawed whatever happens (SIGCONT twice is harmless).
			t.Cleanup(func() { f.heal(t, b) })
		}
		f.apply(t, b)
	}
	applied := time.Since(start)
	for time.Since(start) < f.dur {
		for _, s := range subjects {
			if s.readyz != "" {
				s.readyzSeen[grayProbe(s.readyz)]++
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	atFault := map[*graySubject]int{}
	for _, s := range subjects {
		atFault[s] = count(s)
	}
	healed := time.Now()
	openGate()
	close(b.stop)
	if f.heal != nil {
		f.heal(t, b)
	}
	// Other toxics are removed, every subject's at once; a hold toxic
	// stays, open.
	var healWG sync.WaitGroup
	for _, s := range subjects {
		healWG.Go(func() {
			for i, x := range f.toxics {
				if x.typ != holdToxicType {
					s.proxy.remove(t, i)
				}
			}
		})
	}
	healWG.Wait()
	for _, s := range subjects {
		if at, ok := gnet.firstAccept(s.proxy.name, start); ok {
			s.detect, s.detected = at.Sub(start), true
		}
	}

	// Remote control, asked straight at the broker after the heal.
	var pingWG sync.WaitGroup
	for _, s := range subjects {
		pingWG.Go(func() { s.ping, s.pinged = grayPing(t, s, healed) })
	}

	// Resume: the first effect after the heal (tasks keep coming). A
	// subject that makes none within resumeWait is reported as stuck.
	resumeWait := 2 * time.Minute
	for _, s := range subjects {
		s.resumeWaited = resumeWait
	}
	for {
		waiting := false
		for _, s := range subjects {
			if s.resumed {
				continue
			}
			if count(s) > atFault[s] || count(s) >= n {
				s.resume, s.resumed = time.Since(healed), true
				continue
			}
			waiting = true
		}
		if !waiting || time.Since(healed) > resumeWait {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Everything published, and run by those that resumed.
	for i, p := range pubs {
		if err := p.wait(3 * time.Minute); err != nil {
			t.Errorf("producer of %s: %v", subjects[i].name, err)
		}
	}
	// Drained: every subject that resumed runs what it was sent, or
	// stalls; a subject still running tasks slowly is told apart from one
	// that stopped (idle: no effect for the last 30 s of the window).
	drainBy := time.Now().Add(2 * time.Minute)
	lastCount, lastChange := map[*graySubject]int{}, map[*graySubject]time.Time{}
	for {
		waiting := false
		for _, s := range subjects {
			if c := count(s); c != lastCount[s] || lastChange[s].IsZero() {
				lastCount[s], lastChange[s] = c, time.Now()
			}
			if s.resumed && lastCount[s] < n {
				waiting = true
			}
		}
		if !waiting || time.Now().After(drainBy) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, s := range subjects {
		if lastCount[s] < n {
			s.idleAtEnd = time.Since(lastChange[s])
		}
	}
	pingWG.Wait()
	alive := map[*graySubject]bool{}
	for _, s := range subjects {
		alive[s] = s.alive()
	}
	// Stopped before counting what is left: on RabbitMQ what a connection
	// held unacknowledged is ready again once it closes.
	stopAll()

	for _, s := range subjects {
		s.done = count(s)
		deliveries, _ := effects.HGetAll(ctx, s.keys.deliveries).Result()
		for _, v := range deliveries {
			if d, _ := strconv.Atoi(v); d > 1 {
				s.runs2x++
			}
		}
		members, _ := effects.SCard(ctx, s.keys.effects).Result()
		s.dup = s.done - int(members)
		s.stuck = grayLeft(t, b, s)
		s.lost = max(0, n-s.done-s.stuck)
	}
	line := fmt.Sprintf("GRAY %s %s", b.kind, f.name)
	if applied > time.Second {
		// rabbitmqctl takes seconds: detect counts from its start.
		line += fmt.Sprintf(" (applied in %.1fs)", applied.Seconds())
	}
	for i, s := range subjects {
		sep := " "
		if i > 0 {
			sep = " | "
		}
		line += sep + s.summary(n)
	}
	t.Log(line)
	t.Logf("celeriac's warnings and errors during %s: %s", f.name, grayLogSummary(subjects[0].log()))
	for _, s := range subjects {
		if !alive[s] {
			t.Errorf("%s exited during the run:\n%s", s.name, tail(s.log(), 40))
		}
	}
	// celeriac's own bar: every task run, none lost, back after the heal.
	c := subjects[0]
	if !c.resumed || c.done != n || c.lost != 0 || c.dup != 0 || !c.pinged {
		t.Errorf("celeriac: resumed %t, %d of %d effects, %d lost, %d duplicate effects, remote control back %t\n%s",
			c.resumed, c.done, n, c.lost, c.dup, c.pinged, tail(c.log(), 60))
	}
}

// summary is a subject's part of the GRAY line.
func (s *graySubject) summary(n int) string {
	var b strings.Builder
	b.WriteString(s.name)
	if s.detected {
		fmt.Fprintf(&b, " detect=%.1fs", s.detect.Seconds())
	} else {
		b.WriteString(" detect=-")
	}
	if s.resumed {
		fmt.Fprintf(&b, " resume=%.1fs", s.resume.Seconds())
	} else {
		fmt.Fprintf(&b, " resume=NEVER(waited %s)", s.resumeWaited)
	}
	fmt.Fprintf(&b, " lost=%d dup=%d runs2x=%d", s.lost, s.dup, s.runs2x)
	if s.done < n {
		fmt.Fprintf(&b, " done=%d/%d stuck=%d", s.done, n, s.stuck)
		if s.idleAtEnd >= 30*time.Second {
			fmt.Fprintf(&b, " STALLED(idle %s)", s.idleAtEnd.Round(time.Second))
		}
	}
	if s.pinged {
		fmt.Fprintf(&b, " ping=%.1fs", s.ping.Seconds())
	} else {
		b.WriteString(" ping=NONE")
	}
	if s.readyz != "" {
		var codes []string
		for _, c := range []int{200, 503, 0} {
			if k := s.readyzSeen[c]; k > 0 {
				codes = append(codes, fmt.Sprintf("%d×%d", c, k))
			}
		}
		b.WriteString(" readyz=" + strings.Join(codes, ","))
	}
	return b.String()
}

// grayLogSummary counts celeriac's warn and error log lines by message.
func grayLogSummary(log string) string {
	counts := map[string]int{}
	var order []string
	for _, line := range strings.Split(log, "\n") {
		var l struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &l) != nil || (l.Level != "warn" && l.Level != "error") {
			continue
		}
		if counts[l.Msg] == 0 {
			order = append(order, l.Msg)
		}
		counts[l.Msg]++
	}
	if len(order) == 0 {
		return "none"
	}
	var parts []string
	for _, m := range order {
		parts = append(parts, fmt.Sprintf("%q×%d", m, counts[m]))
	}
	return strings.Join(parts, ", ")
}

// grayProbe GETs a /readyz URL: its status, 0 when it does not answer.
func grayProbe(u string) int {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// grayPing asks s's worker for a remote-control ping, straight at the
// broker, until it answers (up to 2 minutes after the heal).
func grayPing(t *testing.T, s *graySubject, healed time.Time) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pythonBin(t), "testdata/py/it_gray_ping.py", s.hostname)
	cmd.Env = grayPyEnv("5.2", map[string]string{"IT_BROKER": s.broker})
	out, _ := cmd.Output()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "PONG") {
			return time.Since(healed), true
		}
	}
	return 0, false
}

// grayLeft counts what s's queue still holds at the broker (ready and
// unacknowledged).
func grayLeft(t *testing.T, b *grayRun, s *graySubject) int {
	ctx := context.Background()
	if b.kind == "redis" {
		opt, err := goredis.ParseURL(s.broker)
		if err != nil {
			return 0
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		n := 0
		for _, suffix := range []string{"", "\x06\x163", "\x06\x166", "\x06\x169"} {
			k, _ := rdb.LLen(ctx, s.queue+suffix).Result()
			n += int(k)
		}
		u, _ := rdb.HLen(ctx, "unacked").Result()
		return n + int(u)
	}
	conn, err := amqp091.Dial(s.broker)
	if err != nil {
		return 0
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0
	}
	q, err := ch.QueueDeclarePassive(s.queue, true, false, false, false, nil)
	if err != nil {
		return 0
	}
	// Unacknowledged messages of a connection that is still open are not
	// counted by a passive declare; the subjects are stopped after this.
	return q.Messages
}

func grayCleanQueue(b *grayRun, s *graySubject) {
	if b.kind == "redis" {
		return // the server is the test's own
	}
	conn, err := amqp091.Dial(s.broker)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(s.queue, false, false, false)
	_ = ch.ExchangeDelete(s.queue, false, false)
}

// grayPyEnv is pyEnv for a given Celery version, so that several versions
// run in one test.
func grayPyEnv(version string, extra map[string]string) []string {
	dir, _ := filepath.Abs("testdata/py")
	path := dir
	switch version {
	case "5.5":
		py55, _ := filepath.Abs("testdata/py55")
		path += string(os.PathListSeparator) + py55 + string(os.PathListSeparator) + celery55Path()
	case "5.6":
		path += string(os.PathListSeparator) + unpackedCeleryPath(version)
	}
	env := append(os.Environ(), "PYTHONPATH="+path, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", "CELERIAC_CELERY="+version)
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

var pyVersions sync.Map // "5.2" -> "5.2.6"

// pyCeleryVersion is the full version of Celery version v.
func pyCeleryVersion(t *testing.T, v string) string {
	if s, ok := pyVersions.Load(v); ok {
		return s.(string)
	}
	cmd := exec.Command(pythonBin(t), "-c", "import celery; print(celery.__version__)")
	cmd.Env = grayPyEnv(v, nil)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("celery %s: %v", v, err)
	}
	s := strings.TrimSpace(string(out))
	pyVersions.Store(v, s)
	return s
}

// startGrayPyWorker starts a Celery worker of version on it_gray_app.
func startGrayPyWorker(t *testing.T, version string, env map[string]string, args ...string) *pyWorker {
	t.Helper()
	argv := append([]string{"-m", "celery", "-A", "it_gray_app", "worker", "--loglevel=INFO"}, args...)
	cmd := exec.Command(pythonBin(t), argv...)
	cmd.Env = grayPyEnv(version, env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w := &pyWorker{cmd: cmd, done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start python worker: %v", err)
	}
	pw.Close()
	ready := make(chan struct{})
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		once := sync.Once{}
		for sc.Scan() {
			w.mu.Lock()
			w.log.WriteString(sc.Text() + "\n")
			w.mu.Unlock()
			if strings.Contains(sc.Text(), " ready.") {
				once.Do(func() { close(ready) })
			}
		}
		_ = cmd.Wait()
		pr.Close()
	}()
	t.Cleanup(func() {
		w.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("celery %s worker log:\n%s", version, tail(w.Log(), 80))
		}
	})
	select {
	case <-ready:
	case <-w.done:
		t.Fatalf("celery %s worker exited before ready:\n%s", version, w.Log())
	case <-time.After(3 * time.Minute):
		// Generous: the gray matrix runs beside CI's race-enabled suites
		// on two cores, where a prefork worker's start takes minutes.
		t.Fatalf("celery %s worker not ready after 3m:\n%s", version, w.Log())
	}
	return w
}
