package beat

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// redisDB is this package's Redis database; tests use keys of their own
// (a random prefix) and delete them.
const redisDB = 13

func testRedis(t *testing.T) (*goredis.Client, string, string) {
	t.Helper()
	url := transporttest.RedisURL(t, redisDB)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	prefix := "beattest-" + protocol.NewID() + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, prefix+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
		rdb.Close()
	})
	return rdb, url, prefix
}

// TestRedisStoreLeaseAndFencing: one replica leads; a replica whose lease
// was taken over commits nothing, and neither does a commit from a stale
// view of an entry's state.
func TestRedisStoreLeaseAndFencing(t *testing.T) {
	rdb, url, prefix := testRedis(t)
	ctx := context.Background()
	tr, err := redistransport.Dial(ctx, redistransport.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	queue := prefix + "q"
	a := NewRedisStore(rdb, RedisStoreConfig{KeyPrefix: prefix, ReplicaID: "a", PrepareLPush: tr.PrepareLPush})
	b := NewRedisStore(rdb, RedisStoreConfig{KeyPrefix: prefix, ReplicaID: "b", PrepareLPush: tr.PrepareLPush})
	if lead, err := a.Lead(ctx); !lead || err != nil {
		t.Fatalf("a.Lead = %v, %v; want the free lease", lead, err)
	}
	if lead, err := b.Lead(ctx); lead || err != nil {
		t.Fatalf("b.Lead = %v, %v while a holds the lease", lead, err)
	}
	entries, _ := ParseSchedule([]byte(`{"e": {"task": "t", "schedule": 1, "options": {"queue": "`+queue+`"}}}`), Settings{})
	e := entries[0]
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st, err := a.Load(ctx, entries, t0)
	if err != nil || !st["e"].LastRunAt.Equal(t0) {
		t.Fatalf("Load = %v, %v", st, err)
	}
	s := New(Config{Entries: entries, Publisher: tr, Store: a})
	commit := func(store *RedisStore, at time.Time) error {
		s.store = store
		return s.send(ctx, e, State{LastRunAt: at, TotalRunCount: 1})
	}
	if err := commit(a, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.LLen(ctx, queue).Result(); n != 1 {
		t.Fatalf("queue holds %d messages after one commit, want 1 (pushed by the commit script)", n)
	}
	// a's lease expires (a paused); b takes over and reads a's run.
	rdb.Del(ctx, prefix+":lock")
	if lead, _ := b.Lead(ctx); !lead {
		t.Fatal("b did not take the free lease")
	}
	st, _ = b.Load(ctx, entries, t0.Add(time.Hour))
	if got := st["e"]; !got.LastRunAt.Equal(t0.Add(time.Second)) || got.TotalRunCount != 1 {
		t.Fatalf("b reads %+v, want a's run", got)
	}
	if err := commit(a, t0.Add(2*time.Second)); !errors.Is(err, ErrLostLease) {
		t.Fatalf("a's commit after losing the lease: %v, want ErrLostLease", err)
	}
	if lead, _ := a.Lead(ctx); lead {
		t.Fatal("a leads again while b holds the lease")
	}
	if n, _ := rdb.LLen(ctx, queue).Result(); n != 1 {
		t.Fatalf("queue holds %d messages, want 1: a fenced-off commit must not publish", n)
	}
	// b's view goes stale when the meta changes under it.
	rdb.HSet(ctx, prefix+"e", "meta", encodeMeta(State{LastRunAt: t0.Add(5 * time.Second), TotalRunCount: 7}))
	if err := commit(b, t0.Add(3*time.Second)); !errors.Is(err, ErrLostLease) {
		t.Fatalf("commit from a stale state: %v, want ErrLostLease", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lead, _ := a.Lead(ctx); !lead {
		t.Fatal("a cannot take the lease b released")
	}
	// The fencing number grows with every new holder.
	if tok := a.Token(); tok[:2] != "3:" {
		t.Errorf("a's token %q, want fencing number 3", tok)
	}
}

// TestRedisStoreWithAMQPBroker: with RabbitMQ as the broker the lease
// and the state are in Redis (redbeat_redis_url) and a run is recorded,
// then published; a fenced-off replica neither records nor publishes.
func TestRedisStoreWithAMQPBroker(t *testing.T) {
	rdb, _, prefix := testRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{URL: transporttest.AMQPURL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	queue := "beattest_amqp_" + protocol.NewID()[:8]
	c, err := tr.Consume(ctx, []transport.Queue{{Name: queue, Arguments: map[string]any{"x-expires": int64(60000)}}}, transport.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	entries, _ := ParseSchedule([]byte(`{"e": {"task": "t", "schedule": 1, "args": [7], "options": {"queue": "`+queue+`"}}}`), Settings{})
	a := NewRedisStore(rdb, RedisStoreConfig{KeyPrefix: prefix, ReplicaID: "a"})
	if lead, err := a.Lead(ctx); !lead || err != nil {
		t.Fatalf("Lead = %v, %v", lead, err)
	}
	if _, err := a.Load(ctx, entries, time.Now()); err != nil {
		t.Fatal(err)
	}
	pub := &countingPublisher{Publisher: tr}
	s := New(Config{Entries: entries, Publisher: pub, Store: a})
	id, err := s.SendNow(ctx, entries[0], State{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-c.Deliveries():
		m, err := protocol.DecodeTask(&d.Message, protocol.DecodeOptions{})
		if err != nil || m.ID != id || len(m.Args) != 1 {
			t.Fatalf("received %+v, %v; want the run %s", m, err, id)
		}
		_ = d.Ack(ctx)
	case <-ctx.Done():
		t.Fatal("the run did not reach the RabbitMQ queue")
	}
	// Fenced off: another replica took the lease.
	rdb.Del(ctx, prefix+":lock")
	b := NewRedisStore(rdb, RedisStoreConfig{KeyPrefix: prefix, ReplicaID: "b"})
	if lead, _ := b.Lead(ctx); !lead {
		t.Fatal("b did not take the free lease")
	}
	if _, err := s.SendNow(ctx, entries[0], State{}); !errors.Is(err, ErrLostLease) {
		t.Fatalf("SendNow after losing the lease: %v, want ErrLostLease", err)
	}
	st, _ := b.Load(ctx, entries, time.Now())
	if st["e"].TotalRunCount != 1 {
		t.Errorf("state %+v, want the one run", st["e"])
	}
	if n := pub.n.Load(); n != 1 {
		t.Errorf("%d publishes, want 1: a fenced-off replica must not publish", n)
	}
}

type countingPublisher struct {
	transport.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(ctx context.Context, m *transport.Publishing) error {
	p.n.Add(1)
	return p.Publisher.Publish(ctx, m)
}
