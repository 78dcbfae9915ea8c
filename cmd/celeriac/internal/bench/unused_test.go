package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/transport/transporttest"
)

// The benchmark's Redis databases (docs/testing.md): 8 and 4.
const testBrokerDB, testResultDB = 8, 4

func redisBase(t *testing.T) string {
	u, err := url.Parse(transporttest.RedisURL(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = ""
	return u.String()
}

// TestRunRefusesAUsersRedisData: a key of the user's in either database
// the run would use makes Run refuse before it creates (or empties)
// anything, and the key is still there, unchanged, afterwards.
func TestRunRefusesAUsersRedisData(t *testing.T) {
	base := redisBase(t)
	for _, db := range []int{testResultDB, testBrokerDB} {
		opt, err := goredis.ParseURL(withDB(base, db))
		if err != nil {
			t.Fatal(err)
		}
		rdb := goredis.NewClient(opt)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		key := "users-own-key-" + randHex()
		if err := rdb.Set(ctx, key, "keep me", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = Run(ctx, Options{RedisURL: base, RedisBrokerDB: testBrokerDB, RedisResultDB: testResultDB,
			Brokers: []string{"redis"}, Python: "/nonexistent/python"})
		if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "Redis database "+strconv.Itoa(db)) {
			t.Errorf("db %d holds a key: Run = %v, want ErrInUse naming the database", db, err)
		}
		if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "keep me" {
			t.Errorf("db %d: the user's key after the refused run: %q, %v", db, v, err)
		}
		rdb.Del(ctx, key)
		rdb.Close()
		cancel()
	}
}

func randHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestCheckUnused: empty databases and a missing or empty queue are
// accepted; a queue with a message is refused and keeps its message; the
// same database twice is refused.
func TestCheckUnused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := Options{RedisURL: redisBase(t), RedisBrokerDB: testBrokerDB, RedisResultDB: testResultDB,
		AMQPURL: transporttest.AMQPURL(t), Brokers: []string{"redis", "amqp"}, Queue: "bench_test_" + randHex()}
	if err := checkUnused(ctx, o); err != nil {
		t.Fatalf("empty databases, no queue: %v", err)
	}
	same := o
	same.RedisResultDB = same.RedisBrokerDB
	if err := checkUnused(ctx, same); err == nil {
		t.Error("the same database for broker and results was accepted")
	}

	conn, err := amqp.Dial(o.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(o.Queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(o.Queue, false, false, false)
	if err := checkUnused(ctx, o); err != nil {
		t.Errorf("an empty queue: %v", err)
	}
	if err := ch.PublishWithContext(ctx, "", o.Queue, true, false, amqp.Publishing{Body: []byte("the user's")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(o.Queue, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the published message is not in the queue: %+v", q)
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = checkUnused(ctx, o)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), o.Queue) {
		t.Errorf("a queue with a message: %v, want ErrInUse naming it", err)
	}
	if q, err := ch.QueueDeclarePassive(o.Queue, false, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Errorf("the user's message after the check: %+v, %v", q, err)
	}
}
