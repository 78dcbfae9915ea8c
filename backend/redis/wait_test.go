package redis

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

func storeState(t testing.TB, b *Backend, id string, st protocol.State, result any) {
	t.Helper()
	meta := &protocol.ResultMeta{TaskID: id, Status: st, Result: result, Children: []any{}}
	if st.Ready() {
		meta.DateDone = time.Now().UTC()
	}
	if err := b.Store(context.Background(), backend.StoreRequest{Meta: meta}); err != nil {
		t.Fatal(err)
	}
}

// waitResult is what a Wait started by startWait returned.
type waitResult struct {
	m   *protocol.ResultMeta
	err error
}

// startWait runs Wait in a goroutine of its own; the channel gets its
// outcome.
func startWait(ctx context.Context, b *Backend, id string) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		m, err := b.Wait(ctx, id)
		ch <- waitResult{m, err}
	}()
	return ch
}

// namedBackend is newTest with a backend whose connections carry a client
// name of their own (CLIENT LIST shows it), on host (host:port) when it is
// not empty.
func namedBackend(t testing.TB, host string, cfg Config) (b *Backend, raw *goredis.Client, name string) {
	t.Helper()
	u, err := url.Parse(transporttest.RedisURL(t, testDB))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		u.Host = host
	}
	name = "celeriac-wait-" + strings.ToLower(rand.Text()[:10])
	q := u.Query()
	q.Set("client_name", name)
	u.RawQuery = q.Encode()
	cfg.URL = u.String()
	b, raw = newTest(t, cfg)
	return b, raw, name
}

// pubsubClients returns the fields of the pub/sub connections named name
// (CLIENT LIST TYPE pubsub).
func pubsubClients(t testing.TB, raw *goredis.Client, name string) []map[string]string {
	t.Helper()
	out, err := raw.Do(context.Background(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	var clients []map[string]string
	for line := range strings.Lines(out) {
		fields := map[string]string{}
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			fields[k] = v
		}
		if fields["name"] == name {
			clients = append(clients, fields)
		}
	}
	return clients
}

// eventually checks cond every few milliseconds until it holds, and fails
// the test when it still does not after 20 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// untilSubscribers waits until each channel has n subscribers (PUBSUB
// NUMSUB).
func untilSubscribers(t testing.TB, raw *goredis.Client, n int64, channels ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d subscribers on every channel", n), func() bool {
		got, err := raw.PubSubNumSub(context.Background(), channels...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range channels {
			if got[c] != n {
				return false
			}
		}
		return true
	})
}

// waiting returns how many Waits are registered on the task's channel.
func waiting(b *Backend, id string) int {
	b.waitMu.Lock()
	m := b.mux
	b.waitMu.Unlock()
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.topics[b.TaskKey(id)]; t != nil {
		return len(t.waiters)
	}
	return 0
}

// untilCovered waits until the key of each task has been read for every
// Wait on it: from then on, only a PUBLISH (or a read after a reconnect)
// can wake them.
func untilCovered(t testing.TB, b *Backend, ids ...string) {
	t.Helper()
	eventually(t, "read for every Wait", func() bool {
		b.mux.mu.Lock()
		defer b.mux.mu.Unlock()
		for _, id := range ids {
			tp := b.mux.topics[b.TaskKey(id)]
			if tp == nil {
				return false
			}
			for _, w := range tp.waiters {
				if !w.covered {
					return false
				}
			}
		}
		return true
	})
}

// untilWaiting waits until n Waits are registered on the task's channel.
func untilWaiting(t testing.TB, b *Backend, id string, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d Waits on %s", n, id), func() bool { return waiting(b, id) == n })
}

// encoded is the document Store would write.
func encoded(t testing.TB, id string, st protocol.State, result any) []byte {
	t.Helper()
	doc, err := protocol.EncodeResult(&protocol.ResultMeta{
		TaskID: id, Status: st, Result: result, Children: []any{}, DateDone: time.Now().UTC(),
	}, protocol.ContentTypeJSON)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func expectResult(t testing.TB, got waitResult, want any) {
	t.Helper()
	if got.err != nil || got.m == nil || got.m.Status != protocol.StateSuccess || got.m.Result != want {
		t.Fatalf("Wait = %+v, %v; want SUCCESS %v", got.m, got.err, want)
	}
}

// TestWait: Wait returns a result stored before it subscribed, and wakes on
// the PUBLISH of one stored while it waits, skipping states that are not
// ready; a cancelled context ends it.
func TestWait(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	storeState(t, b, "early", protocol.StateSuccess, int64(1))
	if m, err := b.Wait(ctx, "early"); err != nil || m.Result != int64(1) {
		t.Fatalf("Wait(early) = %v, %v", m, err)
	}

	late := startWait(ctx, b, "late")
	untilSubscribers(t, raw, 1, b.TaskKey("late"))
	storeState(t, b, "late", protocol.StateStarted, nil)
	storeState(t, b, "late", protocol.StateRetry, nil)
	select {
	case r := <-late:
		t.Fatalf("Wait returned %+v, %v before the task was ready", r.m, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	storeState(t, b, "late", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"x"}})
	if r := <-late; r.err != nil || r.m.Status != protocol.StateFailure {
		t.Fatalf("Wait(late) = %+v, %v", r.m, r.err)
	}

	short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	if _, err := b.Wait(short, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait(never) = %v, want the context's deadline", err)
	}
	done, stop2 := context.WithCancel(context.Background())
	stop2()
	if _, err := b.Wait(done, "never"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait(never) with a cancelled context = %v", err)
	}
}

// TestWaitSharesOneConnection: 1 000 concurrent Waits use one pub/sub
// connection, each wakes with its own task's result, and every channel is
// unsubscribed once its Wait returned.
func TestWaitSharesOneConnection(t *testing.T) {
	const n = 1000
	b, raw, name := namedBackend(t, "", Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	ids := make([]string, n)
	keys := make([]string, n)
	results := make([]<-chan waitResult, n)
	for i := range n {
		ids[i] = fmt.Sprintf("many-%d", i)
		keys[i] = b.TaskKey(ids[i])
		results[i] = startWait(ctx, b, ids[i])
	}
	untilSubscribers(t, raw, 1, keys...)
	if st := b.client.PoolStats().PubSubStats; st.Created != 1 || st.Active != 1 {
		t.Errorf("pub/sub pool: %d connections created, %d active; want 1 and 1", st.Created, st.Active)
	}
	clients := pubsubClients(t, raw, name)
	if len(clients) != 1 || clients[0]["sub"] != fmt.Sprint(n) {
		t.Fatalf("CLIENT LIST TYPE pubsub: %d connections named %s (%v); want one subscribed to %d channels", len(clients), name, clients, n)
	}

	// Stored from several goroutines, as a pool of workers would.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				storeState(t, b, ids[i], protocol.StateSuccess, int64(i))
			}
		})
	}
	wg.Wait()
	for i, ch := range results {
		expectResult(t, <-ch, int64(i))
	}
	untilSubscribers(t, raw, 0, keys...)
	// The connection stays open for the next Waits, out of pub/sub mode.
	if clients := pubsubClients(t, raw, name); len(clients) != 0 {
		t.Errorf("after the Waits: pub/sub connections %v; want none", clients)
	}
	if st := b.client.PoolStats().PubSubStats; st.Created != 1 || st.Active != 1 {
		t.Errorf("after the Waits: pub/sub pool: %d connections created, %d active; want 1 and 1", st.Created, st.Active)
	}
}

// TestWaitStoredBefore: a result stored before Wait is found, whether the
// Wait subscribes the channel or joins a subscription in place (another
// Wait's, which the store's PUBLISH did not reach: here it was written
// without one).
func TestWaitStoredBefore(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	storeState(t, b, "before", protocol.StateSuccess, "x")
	if m, err := b.Wait(ctx, "before"); err != nil || m.Result != "x" {
		t.Fatalf("Wait(before) = %+v, %v", m, err)
	}

	first := startWait(ctx, b, "joined")
	untilSubscribers(t, raw, 1, b.TaskKey("joined"))
	untilWaiting(t, b, "joined", 1)
	untilCovered(t, b, "joined")
	if err := raw.Set(ctx, b.TaskKey("joined"), encoded(t, "joined", protocol.StateSuccess, "y"), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	expectResult(t, <-startWait(ctx, b, "joined"), "y")
	// The first one gets the second one's read too.
	expectResult(t, <-first, "y")
}

// TestWaitManyOnOneID: every Wait on a task wakes, each with a document of
// its own.
func TestWaitManyOnOneID(t *testing.T) {
	const n = 200
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	results := make([]<-chan waitResult, n)
	for i := range results {
		results[i] = startWait(ctx, b, "same")
	}
	untilWaiting(t, b, "same", n)
	untilSubscribers(t, raw, 1, b.TaskKey("same"))
	storeState(t, b, "same", protocol.StateStarted, nil)
	storeState(t, b, "same", protocol.StateSuccess, int64(7))
	seen := map[*protocol.ResultMeta]bool{}
	for _, ch := range results {
		r := <-ch
		expectResult(t, r, int64(7))
		if seen[r.m] {
			t.Fatal("two Waits returned the same *ResultMeta")
		}
		seen[r.m] = true
	}
}

// TestWaitCancelOne: a Wait whose context ends leaves the other Waits on
// the same task, and the channel's subscription, in place.
func TestWaitCancelOne(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	one, cancelOne := context.WithCancel(ctx)
	defer cancelOne()
	cancelled := startWait(one, b, "c")
	a, c := startWait(ctx, b, "c"), startWait(ctx, b, "c")
	untilWaiting(t, b, "c", 3)
	untilSubscribers(t, raw, 1, b.TaskKey("c"))

	cancelOne()
	if r := <-cancelled; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Wait = %+v, %v", r.m, r.err)
	}
	untilWaiting(t, b, "c", 2)
	if got := raw.PubSubNumSub(ctx, b.TaskKey("c")).Val()[b.TaskKey("c")]; got != 1 {
		t.Fatalf("after one Wait left, %d subscribers; want 1", got)
	}
	storeState(t, b, "c", protocol.StateSuccess, int64(3))
	expectResult(t, <-a, int64(3))
	expectResult(t, <-c, int64(3))
}

// TestWaitUnsubscribes: the channel is unsubscribed when its last Wait
// leaves, woken or cancelled, and subscribed again by the next one.
func TestWaitUnsubscribes(t *testing.T) {
	b, raw, name := namedBackend(t, "", Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := b.TaskKey("u")

	one, cancelOne := context.WithCancel(ctx)
	r := startWait(one, b, "u")
	untilSubscribers(t, raw, 1, key)
	cancelOne()
	<-r
	untilSubscribers(t, raw, 0, key)

	r = startWait(ctx, b, "u")
	untilSubscribers(t, raw, 1, key)
	storeState(t, b, "u", protocol.StateSuccess, int64(1))
	expectResult(t, <-r, int64(1))
	untilSubscribers(t, raw, 0, key)

	b.mux.mu.Lock()
	topics := len(b.mux.topics)
	b.mux.mu.Unlock()
	if topics != 0 {
		t.Errorf("%d channels still tracked", topics)
	}
	if clients := pubsubClients(t, raw, name); len(clients) != 0 {
		t.Errorf("pub/sub connections %v; want none", clients)
	}
}

// dialGate is a go-redis hook that holds dials until it opens.
type dialGate struct {
	open     chan struct{}
	dialing  chan struct{}
	once     sync.Once
	openOnce sync.Once
}

func newDialGate() *dialGate {
	return &dialGate{open: make(chan struct{}), dialing: make(chan struct{})}
}

func (g *dialGate) release() { g.openOnce.Do(func() { close(g.open) }) }

func (g *dialGate) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		g.once.Do(func() { close(g.dialing) })
		select {
		case <-g.open:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return next(ctx, network, addr)
	}
}

func (g *dialGate) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (g *dialGate) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestWaitReconnect: the pub/sub connection is killed (CLIENT KILL of
// that one connection: the server is shared), and while go-redis cannot
// reconnect yet (its dial is held) the results are stored; their PUBLISH
// reaches nobody. Once it has reconnected and subscribed again, every
// Wait reads its key and wakes.
func TestWaitReconnect(t *testing.T) {
	const n = 50
	b, raw, name := namedBackend(t, "", Config{})
	// The worker's side: another backend on the same keys.
	w, _ := newTest(t, Config{GlobalKeyPrefix: b.s.globalPrefix})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ids := make([]string, n)
	keys := make([]string, n)
	results := make([]<-chan waitResult, n)
	for i := range n {
		ids[i] = fmt.Sprintf("gap-%d", i)
		keys[i] = b.TaskKey(ids[i])
		results[i] = startWait(ctx, b, ids[i])
	}
	twin := startWait(ctx, b, ids[0])
	untilSubscribers(t, raw, 1, keys...)
	untilWaiting(t, b, ids[0], 2)
	untilCovered(t, b, ids...)

	gate := newDialGate()
	t.Cleanup(gate.release)
	b.client.AddHook(gate)
	clients := pubsubClients(t, raw, name)
	if len(clients) != 1 {
		t.Fatalf("pub/sub connections %v; want one", clients)
	}
	if err := raw.ClientKillByFilter(ctx, "ID", clients[0]["id"]).Err(); err != nil {
		t.Fatal(err)
	}
	<-gate.dialing
	untilSubscribers(t, raw, 0, keys...)
	for i, id := range ids {
		storeState(t, w, id, protocol.StateSuccess, int64(i))
	}
	for i, ch := range results {
		select {
		case r := <-ch:
			t.Fatalf("Wait %d returned %+v, %v while disconnected", i, r.m, r.err)
		default:
		}
	}
	gate.release()
	for i, ch := range results {
		expectResult(t, <-ch, int64(i))
	}
	expectResult(t, <-twin, int64(0))
	if st := b.client.PoolStats().PubSubStats; st.Created != 2 || st.Active != 1 {
		t.Errorf("pub/sub pool: %d connections created, %d active; want 2 and 1", st.Created, st.Active)
	}
}

// proxy forwards TCP connections to a server; freeze makes the pub/sub
// connections open at that moment swallow everything, both ways, as a
// connection whose peer vanished does.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []*proxyConn
	closed bool
}

type proxyConn struct {
	client, server net.Conn
	pubsub, frozen atomic.Bool
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		p.wg.Go(func() { pc.pipe(s, c, true) })
		p.wg.Go(func() { pc.pipe(c, s, false) })
	}
}

// pipe copies src to dst until either fails, dropping what it reads once
// the connection is frozen.
func (pc *proxyConn) pipe(dst, src net.Conn, fromClient bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient && bytes.Contains(bytes.ToLower(buf[:n]), []byte("subscribe")) {
				pc.pubsub.Store(true)
			}
			if !pc.frozen.Load() {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) freezePubSub() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	frozen := 0
	for _, pc := range p.conns {
		if pc.pubsub.Load() {
			pc.frozen.Store(true)
			frozen++
		}
	}
	return frozen
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for _, pc := range p.conns {
		pc.client.Close()
		pc.server.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// TestWaitUnresponsiveConnection: a pub/sub connection that stops
// answering (no RST, no error: go-redis would not notice) is replaced
// after a PING goes unanswered, and the Wait reads its key on the new one.
func TestWaitUnresponsiveConnection(t *testing.T) {
	u, err := url.Parse(transporttest.RedisURL(t, testDB))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, u.Host)
	b, raw, _ := namedBackend(t, p.addr(), Config{})
	b.waitPing = 50 * time.Millisecond
	w, _ := newTest(t, Config{GlobalKeyPrefix: b.s.globalPrefix})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	r := startWait(ctx, b, "h")
	untilSubscribers(t, raw, 1, b.TaskKey("h"))
	untilCovered(t, b, "h")
	if n := p.freezePubSub(); n != 1 {
		t.Fatalf("froze %d pub/sub connections; want 1", n)
	}
	// The waiter still waits: the frozen connection must be given up on and
	// replaced (the periodic read alone would find a stored result, so the
	// result is stored only after the replacement).
	for st := b.client.PoolStats().PubSubStats; st.Created != 2; st = b.client.PoolStats().PubSubStats {
		if ctx.Err() != nil {
			t.Fatalf("pub/sub pool: %d connections created; want 2", st.Created)
		}
		time.Sleep(10 * time.Millisecond)
	}
	storeState(t, w, "h", protocol.StateSuccess, int64(5))
	expectResult(t, <-r, int64(5))
}

// TestWaitWriterWithoutPublish: a result stored without a PUBLISH, as
// gocelery and celery-rs store them, wakes its waiter at the next periodic
// read instead of never.
func TestWaitWriterWithoutPublish(t *testing.T) {
	b, raw := newTest(t, Config{})
	b.waitPing = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := startWait(ctx, b, "nopub")
	untilSubscribers(t, raw, 1, b.TaskKey("nopub"))
	untilCovered(t, b, "nopub")
	if err := raw.Set(ctx, b.TaskKey("nopub"), encoded(t, "nopub", protocol.StateSuccess, "z"), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	expectResult(t, <-r, "z")
}

// TestWaitClose: Close ends every Wait with ErrClosed, and later Waits
// return it at once.
func TestWaitClose(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	results := make([]<-chan waitResult, 10)
	keys := make([]string, len(results))
	for i := range results {
		id := fmt.Sprintf("closing-%d", i%5)
		keys[i] = b.TaskKey(id)
		results[i] = startWait(ctx, b, id)
	}
	untilSubscribers(t, raw, 1, keys...)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range results {
		if r := <-ch; !errors.Is(r.err, backend.ErrClosed) {
			t.Fatalf("Wait after Close = %+v, %v; want ErrClosed", r.m, r.err)
		}
	}
	if _, err := b.Wait(ctx, "later"); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Wait on a closed backend = %v; want ErrClosed", err)
	}
	if st := b.client.PoolStats().PubSubStats; st.Active != 0 {
		t.Errorf("%d pub/sub connections open after Close", st.Active)
	}
	// A backend closed before any Wait.
	b2, _ := newTest(t, Config{})
	b2.Close()
	if _, err := b2.Wait(ctx, "x"); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Wait on a backend closed before = %v; want ErrClosed", err)
	}
}

// TestWaitDecodeError: a document Wait cannot decode, published or
// stored, is an error.
func TestWaitDecodeError(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := startWait(ctx, b, "bad")
	untilSubscribers(t, raw, 1, b.TaskKey("bad"))
	if err := raw.Publish(ctx, b.TaskKey("bad"), "{not json").Err(); err != nil {
		t.Fatal(err)
	}
	if got := <-r; got.err == nil || !strings.Contains(got.err.Error(), "decode result of bad") {
		t.Fatalf("Wait after a bad PUBLISH = %+v, %v; want a decode error", got.m, got.err)
	}

	if err := raw.Set(ctx, b.TaskKey("bad2"), "{not json", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, "bad2"); err == nil || !strings.Contains(err.Error(), "decode result of bad2") {
		t.Fatalf("Wait on a bad stored result = %v; want a decode error", err)
	}
}

// TestWaitUnreachable: with no server to subscribe on, Wait fails instead
// of waiting for its context.
func TestWaitUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, err := New(Config{URL: "redis://" + addr + "/0?dial_timeout=1s"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = b.Wait(ctx, "x")
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "subscribe") {
		t.Fatalf("Wait without a server = %v; want a subscribe error", err)
	}
}

// BenchmarkWaitWake measures how long after a store (its PUBLISH) a
// waiting Wait returns: the wake-up latency of a Go caller's .get().
func BenchmarkWaitWake(b *testing.B) {
	be, _ := newTest(b, Config{})
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		id := "wake-" + protocol.Repr(i)
		ready := make(chan struct{})
		woke := make(chan time.Time, 1)
		go func() {
			sub := be.client.Subscribe(ctx, be.TaskKey(id)) // a second subscriber: says when Wait's is in place
			defer sub.Close()
			_, _ = sub.Receive(ctx)
			close(ready)
			_, _ = be.Wait(ctx, id)
			woke <- time.Now()
		}()
		<-ready
		time.Sleep(time.Millisecond)
		start := time.Now()
		storeState(b, be, id, protocol.StateSuccess, int64(i))
		total += (<-woke).Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
}

// BenchmarkWaitConcurrent runs Waits 1 000 at a time, as a service with
// that many callers blocked in AsyncResult.Get: each round starts 1 000
// Waits on tasks of their own, then stores their results from 8
// goroutines, and ends when every Wait has returned.
func BenchmarkWaitConcurrent(b *testing.B) {
	const waiters = 1000
	be, _ := newTest(b, Config{})
	ctx := context.Background()
	b.ReportAllocs()
	n := 0
	for done := 0; done < b.N; done += waiters {
		k := min(waiters, b.N-done)
		ids := make([]string, k)
		var wg sync.WaitGroup
		errs := make(chan error, k)
		for i := range ids {
			n++
			ids[i] = "conc-" + protocol.Repr(n)
			wg.Go(func() {
				if _, err := be.Wait(ctx, ids[i]); err != nil {
					errs <- err
				}
			})
		}
		var stores sync.WaitGroup
		for w := range 8 {
			stores.Go(func() {
				for i := w; i < k; i += 8 {
					storeState(b, be, ids[i], protocol.StateSuccess, int64(i))
				}
			})
		}
		stores.Wait()
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "waits/s")
}
