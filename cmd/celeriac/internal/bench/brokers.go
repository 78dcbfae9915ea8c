package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	redistransport "github.com/celeriac/celeriac/transport/redis"
	"github.com/celeriac/celeriac/worker/connect"

	"github.com/celeriac/celeriac/internal/redact"
)

// message is one preloaded message exactly as the broker held it.
type message struct {
	raw []byte // Redis: the kombu envelope (the list item)
	// AMQP: body and properties.
	body       []byte
	props      amqp.Publishing
	routingKey string
}

// kit is what the harness needs of a broker: a clean queue, the messages a
// Python producer published there (taken out so that every repetition can
// put back the very same bytes), and the queue's state while a worker
// drains it.
type kit interface {
	Name() string
	URL() string
	Reset(ctx context.Context) error
	Capture(ctx context.Context, n int) ([]message, error)
	Restore(ctx context.Context, msgs []message) error
	// State returns the messages ready in the queue and, where the broker
	// says so cheaply (Redis), those delivered and not acknowledged; -1
	// when unknown (AMQP).
	State(ctx context.Context) (ready, unacked int, err error)
	// Unacked asks the broker itself how many messages of the queue are
	// unacknowledged (rabbitmqctl on AMQP); ok is false when it cannot.
	Unacked(ctx context.Context) (n int, ok bool)
	// ServerCPU is the broker server's CPU time so far (user+system), when
	// it can be read: Redis says in INFO, RabbitMQ is read from /proc when
	// it runs on this machine.
	ServerCPU(ctx context.Context) (time.Duration, bool)
	Close() error
}

// redisServerCPU reads used_cpu_user + used_cpu_sys from INFO cpu.
func redisServerCPU(ctx context.Context, rdb *goredis.Client) (time.Duration, bool) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			total += f
			found++
		}
	}
	return time.Duration(total * float64(time.Second)), found == 2
}

// processCPU sums the CPU time of this machine's processes named comm
// (RabbitMQ's Erlang VM is beam.smp).
func processCPU(comm string) (time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var total time.Duration
	found := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(b)) != comm {
			continue
		}
		if cpu, _, ok := readStat(pid); ok {
			total += cpu
			found = true
		}
	}
	return total, found
}

func withDB(base string, db int) string {
	return strings.TrimRight(base, "/") + "/" + strconv.Itoa(db)
}

// redisKit is a kombu Redis broker in the database Options.RedisBrokerDB,
// which was empty when the run started (checkUnused).
type redisKit struct {
	url   string
	queue string
	rdb   *goredis.Client
}

func newRedisKit(base string, db int, queue string) (*redisKit, error) {
	url := withDB(base, db)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	k := &redisKit{url: url, queue: queue, rdb: goredis.NewClient(opt)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := k.rdb.Ping(ctx).Err(); err != nil {
		k.rdb.Close()
		return nil, fmt.Errorf("redis broker %s: %w", redact.URL(url), err)
	}
	return k, nil
}

func (k *redisKit) Name() string { return "Redis" }
func (k *redisKit) URL() string  { return k.url }

// Close empties the database, which held nothing when the run started, so
// that everything the run created there (kombu's bindings included) goes.
func (k *redisKit) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = k.rdb.FlushDB(ctx).Err()
	return k.rdb.Close()
}

func (k *redisKit) Reset(ctx context.Context) error {
	// kombu's keys: the queue and its priority bands, the unacked
	// bookkeeping; celeriac's dead-letter list. This database is the
	// benchmark's own for the run: it was empty when the run started.
	keys := []string{k.queue, "unacked", "unacked_index", "unacked_mutex", "celeriac.dead." + k.queue}
	for p := 1; p <= 9; p++ {
		keys = append(keys, k.queue+"\x06\x16"+strconv.Itoa(p))
	}
	return k.rdb.Del(ctx, keys...).Err()
}

func (k *redisKit) Capture(ctx context.Context, n int) ([]message, error) {
	items, err := k.rdb.LRange(ctx, k.queue, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	if len(items) != n {
		return nil, fmt.Errorf("queue %s holds %d messages, want %d", k.queue, len(items), n)
	}
	msgs := make([]message, len(items))
	for i, it := range items {
		msgs[i].raw = []byte(it)
	}
	return msgs, k.rdb.Del(ctx, k.queue).Err()
}

func (k *redisKit) Restore(ctx context.Context, msgs []message) error {
	// LRANGE read the list left to right; RPUSH in that order rebuilds it.
	for i := 0; i < len(msgs); i += 1000 {
		chunk := msgs[i:min(i+1000, len(msgs))]
		vals := make([]any, len(chunk))
		for j, m := range chunk {
			vals[j] = m.raw
		}
		if err := k.rdb.RPush(ctx, k.queue, vals...).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (k *redisKit) State(ctx context.Context) (int, int, error) {
	var ready, unacked *goredis.IntCmd
	_, err := k.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		ready = p.LLen(ctx, k.queue)
		unacked = p.HLen(ctx, "unacked")
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	// A staged worker's messages in flight are in neither (see
	// transport/redis.Config.StagedPop): count them as taken, not done.
	staged, err := redistransport.StagedLen(ctx, k.rdb, "")
	if err != nil {
		return 0, 0, err
	}
	return int(ready.Val()), int(unacked.Val() + staged), nil
}

func (k *redisKit) ServerCPU(ctx context.Context) (time.Duration, bool) {
	return redisServerCPU(ctx, k.rdb)
}

func (k *redisKit) Unacked(ctx context.Context) (int, bool) {
	n, err := k.rdb.HLen(ctx, "unacked").Result()
	return int(n), err == nil
}

// amqpKit is a RabbitMQ broker.
type amqpKit struct {
	url   string
	queue string
	conn  *amqp.Connection
	ch    *amqp.Channel
}

func newAMQPKit(url, queue string) (*amqpKit, error) {
	k := &amqpKit{url: url, queue: queue}
	if err := k.dial(); err != nil {
		return nil, fmt.Errorf("rabbitmq %s: %w", connect.Redact(url), err)
	}
	return k, nil
}

func (k *amqpKit) dial() error {
	if k.conn != nil {
		k.conn.Close()
	}
	conn, err := amqp.Dial(k.url)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return err
	}
	k.conn, k.ch = conn, ch
	return nil
}

// channel returns a working channel: a failed passive declare closes it.
func (k *amqpKit) channel() (*amqp.Channel, error) {
	if k.ch == nil || k.ch.IsClosed() || k.conn.IsClosed() {
		if err := k.dial(); err != nil {
			return nil, err
		}
	}
	return k.ch, nil
}

func (k *amqpKit) Name() string { return "RabbitMQ" }
func (k *amqpKit) URL() string  { return k.url }
func (k *amqpKit) Close() error {
	if k.conn == nil {
		return nil
	}
	return k.conn.Close()
}

func (k *amqpKit) Reset(ctx context.Context) error {
	ch, err := k.channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDelete(k.queue, false, false, false); err != nil {
		return err
	}
	return nil
}

// declare declares the queue as Celery does (durable, bound to a direct
// exchange of its name), so that workers of either kind find it as they
// would declare it.
func (k *amqpKit) declare() error {
	ch, err := k.channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(k.queue, "direct", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(k.queue, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(k.queue, k.queue, k.queue, false, nil)
}

func (k *amqpKit) Capture(ctx context.Context, n int) ([]message, error) {
	ch, err := k.channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(0, 0, false); err != nil { // unlimited: nothing is acked until all are in
		return nil, err
	}
	ds, err := ch.Consume(k.queue, "bench-capture", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	msgs := make([]message, 0, n)
	var last uint64
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for len(msgs) < n {
		select {
		case d, ok := <-ds:
			if !ok {
				return nil, errors.New("capture: consumer closed")
			}
			last = d.DeliveryTag
			msgs = append(msgs, message{body: d.Body, routingKey: d.RoutingKey, props: amqp.Publishing{
				Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
				DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId,
				ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId,
				Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, AppId: d.AppId,
			}})
		case <-timeout.C:
			return nil, fmt.Errorf("capture: %d of %d messages after 30 s", len(msgs), n)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := ch.Ack(last, true); err != nil {
		return nil, err
	}
	if err := ch.Cancel("bench-capture", false); err != nil {
		return nil, err
	}
	return msgs, nil
}

func (k *amqpKit) Restore(ctx context.Context, msgs []message) error {
	if err := k.declare(); err != nil {
		return err
	}
	// A channel of its own in confirm mode: every message is on disk
	// before the worker starts.
	ch, err := k.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(msgs)))
	for i := range msgs {
		m := &msgs[i]
		p := m.props
		p.Body = m.body
		if err := ch.PublishWithContext(ctx, k.queue, m.routingKey, true, false, p); err != nil {
			return err
		}
	}
	for range msgs {
		select {
		case c := <-confirms:
			if !c.Ack {
				return fmt.Errorf("restore: message %d nacked", c.DeliveryTag)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (k *amqpKit) State(ctx context.Context) (int, int, error) {
	ch, err := k.channel()
	if err != nil {
		return 0, 0, err
	}
	q, err := ch.QueueDeclarePassive(k.queue, true, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	return q.Messages, -1, nil
}

func (k *amqpKit) ServerCPU(ctx context.Context) (time.Duration, bool) {
	return processCPU("beam.smp")
}

// Unacked asks rabbitmqctl (the broker must be this machine's) about the
// URL's vhost: AMQP itself reports only ready messages.
func (k *amqpKit) Unacked(ctx context.Context) (int, bool) {
	vhost := "/"
	if u, err := amqp.ParseURI(k.url); err == nil && u.Vhost != "" {
		vhost = u.Vhost
	}
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages_unacknowledged").Output()
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == k.queue {
			n, err := strconv.Atoi(f[1])
			return n, err == nil
		}
	}
	return 0, false
}
