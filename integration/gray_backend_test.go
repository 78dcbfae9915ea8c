package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// The gray-failure matrix's last row (issue 27): the result backend fails
// gray while tasks finish. The broker (RabbitMQ) is healthy and reached
// directly; each subject's Redis result backend is reached through a proxy
// of its own, which holds every byte both ways for the fault's duration
// (blackhole), or for good for the connections of the moment (dead-flow: a
// NAT gateway dropped its flows; new connections work after the heal).
// The same on PostgreSQL (db+postgresql). Per subject, on a GRAYRB line:
//
//	resume   seconds from the heal until its next result landed
//	results  SUCCESS results in the backend at the end, of n tasks
//	lostres  tasks that ran (their effect is there) whose result never
//	         landed: what a client's AsyncResult.get() waits for forever
//	lost     tasks neither run nor still at the broker
//
// celeriac's bar: every result lands, no task lost. A result write is
// tried again until it lands, within the worker's result budget
// (worker.Config.ResultTimeout, 5 minutes by default); the task's slot
// stays busy meanwhile, so a worker whose backend is away stops taking
// tasks instead of finishing them into the void.

func TestGrayResultBackendRedis(t *testing.T) {
	t.Parallel()
	pythonBin(t)
	amqpURL(t)
	runGrayBackendMatrix(t, "redis")
}

// TestGrayResultBackendPostgres: the same on db+postgresql (Celery's
// SQLAlchemy backend, celeriac's backend/sql), on a PostgreSQL of the
// test's own; from the workers' side a held link is a frozen server.
func TestGrayResultBackendPostgres(t *testing.T) {
	t.Parallel()
	pythonBin(t)
	amqpURL(t)
	runGrayBackendMatrix(t, "postgres")
}

func runGrayBackendMatrix(t *testing.T, kind string) {
	// In CI the dead flow, which tells the workers apart; the blackhole,
	// which every one rides out, with CELERIAC_GRAY_LONG=1.
	faults := []grayFault{
		{name: "dead-flow-90s", dur: 90 * time.Second, toxics: []grayToxic{
			{holdToxicType, "upstream", map[string]any{"sticky": true}},
			{holdToxicType, "downstream", map[string]any{"sticky": true}},
		}},
	}
	if os.Getenv("CELERIAC_GRAY_LONG") == "1" {
		faults = append(faults, grayFault{name: "blackhole-30s", dur: 30 * time.Second, toxics: blackholeToxics("upstream", "downstream")})
	}
	if only := os.Getenv("CELERIAC_GRAY_ONLY"); only != "" {
		var kept []grayFault
		for _, f := range faults {
			if strings.Contains(","+only+",", ","+f.name+",") {
				kept = append(kept, f)
			}
		}
		faults = kept
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			sem := graySem("amqp") // the broker is RabbitMQ
			sem <- struct{}{}
			defer func() { <-sem }()
			runGrayBackendFault(t, kind, f)
		})
	}
}

// grayBackendN is the number of tasks per subject and run: fewer than the
// broker matrix's, since every one writes a result.
func grayBackendN() int {
	if s := os.Getenv("CELERIAC_GRAYRB_N"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return 600
}

type grayRBSubject struct {
	*graySubject
	backend string // direct URL of its result database
	results func() int
	atFault int
	resUp   bool
	resAt   time.Duration
	res     int
}

func runGrayBackendFault(t *testing.T, kind string, f grayFault) {
	n := grayBackendN()
	ctx := context.Background()
	gnet := newGrayNet()
	stamp := time.Now().UnixNano() % 1e9
	// The results' server, of the run's own: one database per subject.
	var resultsURL func(i int) string
	switch kind {
	case "redis":
		rdb := startOwnRedis(t, "", nil)
		resultsURL = func(i int) string { return rdb.URL(i + 1) }
	case "postgres":
		pg := startPrivatePG(t)
		resultsURL = func(i int) string {
			db := fmt.Sprintf("grayrb%d", i)
			pgQueryURL(t, pg.url(), "CREATE DATABASE "+db)
			return "db+postgresql://postgres@127.0.0.1:" + pg.port + "/" + db
		}
	}
	b := &grayRun{kind: "amqp", amqp: amqpURL(t), stop: make(chan struct{})}
	effectsURL := redisDBURL(t, fltEffectDB)
	opt, err := goredis.ParseURL(effectsURL)
	if err != nil {
		t.Fatal(err)
	}
	effects := goredis.NewClient(opt)
	defer effects.Close()

	var subjects []*grayRBSubject
	for i, v := range append([]string{""}, grayVersions(t)...) {
		name := "celeriac"
		if v != "" {
			name = "celery-" + pyCeleryVersion(t, v)
		}
		s := &grayRBSubject{graySubject: &graySubject{name: name, version: v, broker: b.amqp}}
		tag := strings.NewReplacer(".", "", "-", "").Replace(name)
		s.queue = fmt.Sprintf("it_grayrb_%s_%d", tag, stamp)
		s.prefix = "it_grayrb:" + s.queue
		s.keys = fltKeysOf(s.prefix)
		s.hostname = tag + "@" + s.queue
		s.backend = resultsURL(i)
		u, err := url.Parse(s.backend)
		if err != nil {
			t.Fatal(err)
		}
		s.proxy = gnet.proxy(t, s.queue, u.Host)
		if kind == "redis" {
			s.results = grayRedisResults(s.backend)
		} else {
			s.results = graySQLResults(s.backend)
		}
		subjects = append(subjects, s)
		t.Cleanup(func() {
			effects.Del(context.Background(), s.keys.deliveries, s.keys.effects, s.keys.effectCount, s.keys.redelivered)
			grayCleanQueue(b, s.graySubject)
		})
	}

	var wg sync.WaitGroup
	var startMu sync.Mutex
	for _, s := range subjects {
		wg.Go(func() {
			backendURL := s.proxy.url(t, s.backend)
			if s.version == "" {
				cfg := fltWorkerConfig{Broker: s.broker, Backend: backendURL, Effects: effectsURL, Prefix: s.prefix,
					Queue: s.queue, Name: s.queue, Hostname: s.hostname, Concurrency: 4}
				s.attachFlt(&startMu, startFltWorker(t, cfg))
				return
			}
			s.attachPy(&startMu, startGrayPyWorker(t, s.version, map[string]string{"IT_BROKER": s.broker, "IT_QUEUE": s.queue,
				"IT_EFFECTS": effectsURL, "IT_PREFIX": s.prefix, "IT_BACKEND": backendURL},
				"-n", s.hostname, "-c", "4", "-P", "prefork", "--without-mingle", "--without-gossip", "--without-heartbeat"))
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

	warm, after := 10*time.Second, 20*time.Second
	rate := float64(n) / (warm + f.dur + after).Seconds()
	var pubs []*publisher
	for _, s := range subjects {
		pubs = append(pubs, startFltPublisher(t, n, map[string]string{"IT_BROKER": s.broker, "IT_QUEUE": s.queue,
			"IT_RATE": strconv.FormatFloat(rate, 'f', 2, 64), "IT_SLEEP_MS": "0", "IT_RESULTS": "1"}))
	}
	count := func(s *grayRBSubject) int {
		c, _ := effects.Get(ctx, s.keys.effectCount).Int()
		return c
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, s := range subjects {
		for s.results() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s stored no result before the fault:\n%s", s.name, tail(s.log(), 40))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(warm / 2)

	gateName := fmt.Sprintf("rb-%s-%d", f.name, stamp)
	gate := make(chan struct{})
	holdGates.Store(gateName, &holdGate{open: gate, addedAt: time.Now()})
	defer holdGates.Delete(gateName)
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	defer openGate()
	for _, s := range subjects {
		for i, x := range f.toxics {
			s.proxy.add(t, i, x, gateName)
		}
	}
	time.Sleep(f.dur)
	for _, s := range subjects {
		s.atFault = s.results()
	}
	healed := time.Now()
	openGate()

	// Resume: the first result after the heal; then everything published
	// and, for each subject, every result or a stall.
	resumeBy := healed.Add(3 * time.Minute)
	for {
		waiting := false
		for _, s := range subjects {
			if !s.resUp {
				if r := s.results(); r > s.atFault || r >= n {
					s.resUp, s.resAt = true, time.Since(healed)
				} else {
					waiting = true
				}
			}
		}
		if !waiting || time.Now().After(resumeBy) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i, p := range pubs {
		if err := p.wait(3 * time.Minute); err != nil {
			t.Errorf("producer of %s: %v", subjects[i].name, err)
		}
	}
	drainBy := time.Now().Add(2 * time.Minute)
	lastRes, lastChange := map[*grayRBSubject]int{}, map[*grayRBSubject]time.Time{}
	for {
		waiting := false
		for _, s := range subjects {
			r := s.results()
			if r != lastRes[s] || lastChange[s].IsZero() {
				lastRes[s], lastChange[s] = r, time.Now()
			}
			// A subject that stored nothing for 45 s is not waited for.
			if r < n && time.Since(lastChange[s]) < 45*time.Second {
				waiting = true
			}
		}
		if !waiting || time.Now().After(drainBy) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	alive := map[*grayRBSubject]bool{}
	for _, s := range subjects {
		alive[s] = s.alive()
	}
	stopAll()

	line := "GRAYRB " + kind + " " + f.name
	for i, s := range subjects {
		s.done = count(s)
		members, _ := effects.SCard(ctx, s.keys.effects).Result()
		s.dup = s.done - int(members)
		s.stuck = grayLeft(t, b, s.graySubject)
		s.lost = max(0, n-int(members)-s.stuck)
		s.res = s.results()
		sep := " "
		if i > 0 {
			sep = " | "
		}
		line += sep + s.name
		if s.resUp {
			line += fmt.Sprintf(" resume=%.1fs", s.resAt.Seconds())
		} else {
			line += " resume=NEVER(waited 3m)"
		}
		line += fmt.Sprintf(" results=%d/%d lostres=%d lost=%d dup=%d", s.res, n, max(0, int(members)-s.res), s.lost, s.dup)
		if s.stuck > 0 {
			line += fmt.Sprintf(" stuck=%d", s.stuck)
		}
	}
	t.Log(line)
	t.Logf("celeriac's warnings and errors during %s: %s", f.name, grayLogSummary(subjects[0].log()))
	for _, s := range subjects {
		if !alive[s] {
			t.Errorf("%s exited during the run:\n%s", s.name, tail(s.log(), 40))
		}
	}
	c := subjects[0]
	if c.res != n || c.lost != 0 || c.dup != 0 {
		t.Errorf("celeriac: %d of %d results, %d tasks lost, %d duplicate effects\n%s", c.res, n, c.lost, c.dup, tail(c.log(), 60))
	}
}

// grayRedisResults counts the SUCCESS results in a Redis result database,
// read directly (not through the subject's proxy).
func grayRedisResults(u string) func() int {
	return func() int {
		opt, err := goredis.ParseURL(u)
		if err != nil {
			return 0
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n := 0
		iter := rdb.Scan(ctx, 0, "celery-task-meta-*", 1000).Iterator()
		var keys []string
		flush := func() {
			if len(keys) == 0 {
				return
			}
			vals, _ := rdb.MGet(ctx, keys...).Result()
			for _, v := range vals {
				s, _ := v.(string)
				var m struct{ Status string }
				if json.Unmarshal([]byte(s), &m) == nil && m.Status == "SUCCESS" {
					n++
				}
			}
			keys = keys[:0]
		}
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 500 {
				flush()
			}
		}
		flush()
		return n
	}
}

// graySQLResults counts the SUCCESS rows of a db+postgresql result
// database, read directly; 0 while the table does not exist.
func graySQLResults(u string) func() int {
	dsn := "postgres" + u[strings.Index(u, "://"):]
	return func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return 0
		}
		defer conn.Close(ctx)
		var n int
		if conn.QueryRow(ctx, "SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'").Scan(&n) != nil {
			return 0
		}
		return n
	}
}
