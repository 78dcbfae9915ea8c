package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/internal/redact"
)

// ioBroker is the broker bench io runs on: Redis (the database
// IOOptions.RedisDB) or RabbitMQ (the queue bench_io of IOOptions.AMQPURL).
type ioBroker interface {
	// Name is "Redis" or "RabbitMQ", as the report says it.
	Name() string
	// Version is the server's name and version for the report.
	Version(ctx context.Context) string
	// Idle reports that the queue is empty and, where the broker says so,
	// nothing is unacknowledged.
	Idle(ctx context.Context) bool
	// CPU is the broker's CPU time so far, or -1.
	CPU(ctx context.Context) time.Duration
	// Empty removes what a run left (between workers).
	Empty(ctx context.Context) error
	// Close removes what the benchmark made and closes the connection.
	Close(ctx context.Context)
}

// redisIOBroker is the database IOOptions.RedisDB, which held no key at
// the start.
type redisIOBroker struct{ rdb *goredis.Client }

func (b redisIOBroker) Name() string { return "Redis" }

func (b redisIOBroker) Version(ctx context.Context) string {
	if info, err := b.rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				return "Redis " + v
			}
		}
	}
	return ""
}

func (b redisIOBroker) Idle(ctx context.Context) bool {
	q, _ := b.rdb.LLen(ctx, ioQueue).Result()
	u, _ := b.rdb.HLen(ctx, "unacked").Result()
	return q == 0 && u == 0
}

func (b redisIOBroker) CPU(ctx context.Context) time.Duration { return redisCPU(ctx, b.rdb) }

func (b redisIOBroker) Empty(ctx context.Context) error { return b.rdb.FlushDB(ctx).Err() }

func (b redisIOBroker) Close(ctx context.Context) { _ = b.rdb.FlushDB(ctx).Err() }

// amqpIOBroker is the queue bench_io (and its exchange, as Celery declares
// them) on a RabbitMQ of this machine, whose CPU is its beam.smp
// process's. The queue held no message at the start; it is deleted at the
// end.
type amqpIOBroker struct {
	url  string
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newAMQPIOBroker(url string) (*amqpIOBroker, error) {
	b := &amqpIOBroker{url: url}
	if err := b.dial(); err != nil {
		return nil, err
	}
	// A passive declare closes the channel when the queue is missing.
	q, err := b.ch.QueueDeclarePassive(ioQueue, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
	case err != nil:
		b.conn.Close()
		return nil, fmt.Errorf("rabbitmq: %w", err)
	case q.Messages > 0:
		b.conn.Close()
		return nil, fmt.Errorf("rabbitmq queue %s on %s holds %d messages: the benchmark empties it, so it takes an empty one", ioQueue, redact.URL(url), q.Messages)
	}
	return b, nil
}

func (b *amqpIOBroker) dial() error {
	if b.conn == nil || b.conn.IsClosed() {
		conn, err := amqp.Dial(b.url)
		if err != nil {
			return fmt.Errorf("rabbitmq: %w", err)
		}
		b.conn = conn
	}
	ch, err := b.conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: %w", err)
	}
	b.ch = ch
	return nil
}

// channel is the admin channel, reopened after an error closed it.
func (b *amqpIOBroker) channel() (*amqp.Channel, error) {
	if b.ch == nil || b.ch.IsClosed() {
		if err := b.dial(); err != nil {
			return nil, err
		}
	}
	return b.ch, nil
}

func (b *amqpIOBroker) Name() string { return "RabbitMQ" }

func (b *amqpIOBroker) Version(context.Context) string {
	if v, ok := b.conn.Properties["version"].(string); ok {
		return "RabbitMQ " + v
	}
	return ""
}

// Idle reports an empty queue: AMQP does not count unacknowledged
// messages, and the workers ack early, before the task's GET.
func (b *amqpIOBroker) Idle(context.Context) bool {
	ch, err := b.channel()
	if err != nil {
		return false
	}
	q, err := ch.QueueDeclarePassive(ioQueue, true, false, false, false, nil)
	return err == nil && q.Messages == 0
}

func (b *amqpIOBroker) CPU(context.Context) time.Duration {
	if d, ok := processCPU("beam.smp"); ok {
		return d
	}
	return -1
}

func (b *amqpIOBroker) Empty(context.Context) error {
	ch, err := b.channel()
	if err != nil {
		return err
	}
	_, err = ch.QueuePurge(ioQueue, false)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return nil
	}
	return err
}

func (b *amqpIOBroker) Close(context.Context) {
	if ch, err := b.channel(); err == nil {
		_, _ = ch.QueueDelete(ioQueue, false, false, false)
		_ = ch.ExchangeDelete(ioQueue, false, false)
	}
	_ = b.conn.Close()
}
