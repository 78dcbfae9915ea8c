package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Shared by the fault runs on the highly available topologies: the effect
// counter sampled over time (for throughput by phase), the worker logs
// read for reconnections, and the final effect and delivery counts.

// haRun is one fault run's state: its effects live on the shared Redis
// (db 2, the fault suite's, under a prefix of its own), which no fault
// touches.
type haRun struct {
	t       *testing.T
	n       int
	queue   string
	prefix  string
	keys    fltKeys
	effects *goredis.Client
	fr      *fltRun // waitEffects and diagnose

	mu      sync.Mutex
	samples []haSample
	stop    chan struct{}
	done    chan struct{}
}

type haSample struct {
	at time.Time
	n  int
}

func newHARun(t *testing.T, kind string, n int) *haRun {
	stamp := time.Now().UnixNano() % 1e9
	r := &haRun{t: t, n: n, queue: fmt.Sprintf("it_ha_%s_%d", kind, stamp), prefix: fmt.Sprintf("it_ha:%s:%d", kind, stamp),
		stop: make(chan struct{}), done: make(chan struct{})}
	r.keys = fltKeysOf(r.prefix)
	opt, err := goredis.ParseURL(redisDBURL(t, fltEffectDB))
	if err != nil {
		t.Fatal(err)
	}
	r.effects = goredis.NewClient(opt)
	r.fr = &fltRun{t: t, kind: kind, effects: r.effects, keys: r.keys}
	t.Cleanup(func() {
		r.effects.Del(context.Background(), r.keys.deliveries, r.keys.effects, r.keys.effectCount, r.keys.redelivered)
		r.effects.Close()
	})
	return r
}

// sample records the effect count every 100 ms until finish.
func (r *haRun) sample() {
	go func() {
		defer close(r.done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			n := r.fr.effectCount()
			r.mu.Lock()
			r.samples = append(r.samples, haSample{time.Now(), n})
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			case <-tk.C:
			}
		}
	}()
	r.t.Cleanup(r.finish)
}

func (r *haRun) finish() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// rate is the effects per second between two moments, from the samples
// nearest before each.
func (r *haRun) rate(from, to time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := func(t time.Time) (haSample, bool) {
		var last haSample
		ok := false
		for _, s := range r.samples {
			if s.at.After(t) {
				break
			}
			last, ok = s, true
		}
		return last, ok
	}
	a, ok1 := at(from)
	b, ok2 := at(to)
	if !ok1 || !ok2 || !b.at.After(a.at) {
		return 0
	}
	return float64(b.n-a.n) / b.at.Sub(a.at).Seconds()
}

// longestPause is the longest time the effect count stood still between
// from and to: how long consuming stopped after a fault.
func (r *haRun) longestPause(from, to time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var longest time.Duration
	var since time.Time
	last := -1
	for _, s := range r.samples {
		if s.at.Before(from) {
			last, since = s.n, s.at
			continue
		}
		if s.at.After(to) {
			break
		}
		if s.n != last {
			if last >= 0 && s.at.Sub(since) > longest {
				longest = s.at.Sub(since)
			}
			last, since = s.n, s.at
		}
	}
	return longest
}

// waitCount waits until n effects happened and returns when.
func (r *haRun) waitCount(n int, timeout time.Duration, running ...*fltProc) time.Time {
	r.t.Helper()
	r.fr.waitEffects(n, timeout, running...)
	return time.Now()
}

// counts reads the final effect and delivery counts.
func (r *haRun) counts() (lost, dupEffects, redeliveries, flagged int) {
	ctx := context.Background()
	deliveries, err := r.effects.HGetAll(ctx, r.keys.deliveries).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	members, err := r.effects.SCard(ctx, r.keys.effects).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	total := 0
	for i := range r.n {
		d, _ := strconv.Atoi(deliveries["k"+strconv.Itoa(i)])
		if d < 1 {
			lost++
		}
		total += d
	}
	flagged, _ = r.effects.Get(ctx, r.keys.redelivered).Int()
	// The effect counter moves only with a new member of the effects set:
	// a difference is an effect that happened twice.
	dupEffects = r.fr.effectCount() - int(members)
	return lost, dupEffects, total - (r.n - lost), flagged
}

// logEntry is one JSON line of a fault-suite worker's log.
type logEntry struct {
	TS         float64 `json:"ts"`
	Msg        string  `json:"msg"`
	URL        string  `json:"url"`
	To         string  `json:"to"`
	Connection string  `json:"connection"`
}

func (e logEntry) time() time.Time {
	return time.Unix(0, int64(e.TS*1e9))
}

func logEntries(log string) []logEntry {
	var out []logEntry
	for _, line := range strings.Split(log, "\n") {
		var e logEntry
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg != "" {
			out = append(out, e)
		}
	}
	return out
}

// amqpNodePort returns the port of the node a worker's consumer connection
// last connected to, from its log (0 if none).
func amqpNodePort(log string) int {
	port := 0
	for _, e := range logEntries(log) {
		if !strings.HasSuffix(e.Connection, " consumer") {
			continue
		}
		switch e.Msg {
		case "amqp connected", "amqp reconnected", "amqp failed over to another broker node":
			if u, err := url.Parse(e.URL); err == nil {
				port, _ = strconv.Atoi(u.Port())
			}
		}
	}
	return port
}

// resumedAfter returns when the worker's log first has a message starting
// with msg after t.
func resumedAfter(log, msg string, t time.Time) (time.Time, bool) {
	for _, e := range logEntries(log) {
		if strings.HasPrefix(e.Msg, msg) && e.time().After(t) {
			return e.time(), true
		}
	}
	return time.Time{}, false
}

var countLine = regexp.MustCompile(`retries=(\d+)`)

// publisherRetries reads the Python publisher's retry count from its DONE
// line.
func publisherRetries(p *publisher) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := countLine.FindStringSubmatch(p.out.String())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
