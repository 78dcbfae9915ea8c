package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/worker/connect"

	"github.com/celeriac/celeriac/internal/redact"
)

// ErrInUse is returned by Run when a database or queue the benchmark would
// empty holds data it did not put there: a tool never deletes what it did
// not create, so the run refuses to start instead.
var ErrInUse = errors.New("bench: refusing to empty data the benchmark did not create")

// checkUnused makes sure that everything the benchmark empties during a
// run is empty before it starts: the two Redis databases, the queue on
// RabbitMQ. (PostgreSQL's tables are checked when they are opened.) It
// only reads.
func checkUnused(ctx context.Context, o Options) error {
	if o.RedisBrokerDB == o.RedisResultDB {
		return fmt.Errorf("bench: the Redis broker and result databases must differ (both %d)", o.RedisBrokerDB)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, db := range []int{o.RedisBrokerDB, o.RedisResultDB} {
		url := withDB(o.RedisURL, db)
		opt, err := goredis.ParseURL(url)
		if err != nil {
			return fmt.Errorf("redis URL: %w", redact.Error(err))
		}
		rdb := goredis.NewClient(opt)
		n, err := rdb.DBSize(ctx).Result()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("redis %s: %w", connect.Redact(url), err)
		}
		if n > 0 {
			return fmt.Errorf("%w: Redis database %d (%s) holds %d keys, and the benchmark empties the databases it uses; name two empty ones (--redis-dbs BROKER,RESULTS)", ErrInUse, db, connect.Redact(url), n)
		}
	}
	for _, b := range o.Brokers {
		if b != "amqp" {
			continue
		}
		conn, err := amqp.Dial(o.AMQPURL)
		if err != nil {
			return fmt.Errorf("rabbitmq %s: %w", connect.Redact(o.AMQPURL), err)
		}
		ch, err := conn.Channel()
		if err != nil {
			conn.Close()
			return err
		}
		q, err := ch.QueueDeclarePassive(o.Queue, true, false, false, false, nil)
		conn.Close()
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		case err != nil:
			return fmt.Errorf("rabbitmq: queue %s: %w", o.Queue, err)
		case q.Messages > 0 || q.Consumers > 0:
			return fmt.Errorf("%w: RabbitMQ queue %s holds %d messages and has %d consumers, and the benchmark deletes its queue; drain it or use another virtual host (--amqp)", ErrInUse, o.Queue, q.Messages, q.Consumers)
		}
	}
	return nil
}
