package redis

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func TestHealthCheckDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cases := []struct {
		name   string
		every  time.Duration
		last   time.Time
		pinged time.Time
		now    time.Time
		want   string
	}{
		{"disabled", -1, t0, time.Time{}, t0.Add(time.Hour), ""},
		{"recent traffic", 10 * time.Second, t0, time.Time{}, t0.Add(9 * time.Second), ""},
		{"silent for a period: ping", 10 * time.Second, t0, time.Time{}, t0.Add(10 * time.Second), "ping"},
		{"ping in flight", 10 * time.Second, t0, t0.Add(10 * time.Second), t0.Add(19 * time.Second), ""},
		{"ping unanswered for a period: replace", 10 * time.Second, t0, t0.Add(10 * time.Second), t0.Add(20 * time.Second), "replace"},
	}
	for _, c := range cases {
		h := healthCheck{every: c.every, last: c.last, pinged: c.pinged}
		if got := h.due(c.now); got != c.want {
			t.Errorf("%s: due = %q, want %q", c.name, got, c.want)
		}
	}
}

// blackhole is a TCP proxy whose current connections can be made to
// swallow everything in both directions without closing, as a dead network
// path does; connections accepted later work normally.
type blackhole struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	cut    chan struct{}
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackhole{ln: ln, target: target, cut: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *blackhole) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		cut := p.cut
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer dst.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if err != nil {
					return
				}
				select {
				case <-cut:
					continue // swallowed: the peer hears nothing
				default:
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
		}
		p.wg.Go(func() { pipe(b, c) })
		p.wg.Go(func() { pipe(c, b) })
	}
}

// blackholeNow cuts every current connection.
func (p *blackhole) blackholeNow() {
	p.mu.Lock()
	close(p.cut)
	p.cut = make(chan struct{})
	p.mu.Unlock()
}

// A subscription whose connection is blackholed (no FIN, no RST) hears
// nothing, as an idle one does: the PING health check tells them apart and
// the subscription comes back on a new connection.
func TestSubscriptionSurvivesBlackhole(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	p := newBlackhole(t, u.Host)
	u.Host = p.ln.Addr().String()
	cfg := e.config()
	cfg.URL = u.String()
	cfg.HealthCheckInterval = 300 * time.Millisecond
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 100*time.Millisecond
	tr := e.dial(cfg)
	ctx := context.Background()
	sub, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: "rt_bh"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	p.blackholeNow()
	// The publisher goes around the proxy: only the subscription is cut.
	direct := e.config()
	pub := e.dial(direct)
	msg := protocol.Message{ContentType: "application/json", Body: []byte(`{}`)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := pub.Publish(ctx, &transport.Publishing{Exchange: "rt_bh", ExchangeType: transport.Fanout, Message: msg}); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-sub.Deliveries():
			if d.Exchange != "rt_bh" {
				t.Fatalf("broadcast %+v", d)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the blackholed subscription never came back")
		}
	}
}

// A sweep's SET NX that got no answer may reach Redis later, once a held
// link heals, and hold the unacked_mutex for UnackedMutexExpire with
// nobody to release it. The next sweeps release it (compare-and-delete by
// its token) and restore again; a foreign worker's mutex is left alone.
func TestSweepReleasesAStrayMutex(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.VisibilityTimeout = time.Minute
	tr := e.dial(cfg)
	ctx := context.Background()
	tag := newTag()
	e.raw.HSet(ctx, e.key("unacked"), tag, "["+pyEnvelope(tag, "rt_q", 0, 1)+`, "", "rt_q"]`)
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: scoreFloat(time.Now().Add(-2 * time.Minute)), Member: tag})

	tr.addStray("lost-token")                                                    // its SET NX timed out...
	e.raw.Set(ctx, e.key("unacked_mutex"), "lost-token", cfg.UnackedMutexExpire) // ...and landed later
	if n, err := tr.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("Sweep under its own stray mutex = %d, %v; want 1 restored", n, err)
	}
	if e.raw.Exists(ctx, e.key("unacked_mutex")).Val() != 0 {
		t.Fatal("mutex left held after the sweep")
	}
	e.raw.Set(ctx, e.key("unacked_mutex"), "other", time.Minute)
	if n, err := tr.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep under a foreign mutex = %d, %v", n, err)
	}
	if e.raw.Get(ctx, e.key("unacked_mutex")).Val() != "other" {
		t.Fatal("foreign mutex touched")
	}
}
