package bench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/internal/redact"
)

// CeilingOptions configure the bare consume loop.
type CeilingOptions struct {
	// BrokerURL is redis://host:port/db or amqp://user:pass@host:port/vhost.
	BrokerURL string
	Queue     string
	// ResultURL, when set, is a Redis URL the loop writes a Celery result
	// document to for every message (SETEX + PUBLISH, as Celery's Redis
	// backend), so that Python's AsyncResult.get() returns.
	ResultURL string
	// Batch is how many messages one Redis pop takes and the AMQP prefetch
	// (default 256).
	Batch int
	// Batched sends the least commands the broker work allows: on Redis one
	// ZADD/HSET/ZREM/HDEL per batch instead of kombu's transaction per
	// message, on AMQP one ack (multiple) per batch of deliveries already
	// received instead of one per message.
	Batched bool
}

// RunCeiling runs the raw ceiling until ctx ends: a consume-and-ack loop
// with the same client libraries as celeriac and only the broker work a
// correct worker must do. Per message it reads the envelope (kombu's JSON
// envelope and base64 body on Redis, properties and headers on AMQP) and the
// task id, writes the result when results are on, and acknowledges. On Redis
// it keeps kombu's unacked bookkeeping exactly (ZADD unacked_index + HSET
// unacked on receipt, ZREM + HDEL on ack, each in MULTI/EXEC), pipelined per
// batch of RPOP key count. It is not a worker: it runs no task and does not
// know the protocol beyond the task id.
func RunCeiling(ctx context.Context, o CeilingOptions) error {
	if o.Batch <= 0 {
		o.Batch = 256
	}
	var results *goredis.Client
	if o.ResultURL != "" {
		opt, err := goredis.ParseURL(o.ResultURL)
		if err != nil {
			return fmt.Errorf("ceiling: result URL: %w", redact.Error(err))
		}
		results = goredis.NewClient(opt)
		defer results.Close()
	}
	switch {
	case strings.HasPrefix(o.BrokerURL, "redis://"):
		return ceilingRedis(ctx, o, results)
	case strings.HasPrefix(o.BrokerURL, "amqp://"):
		return ceilingAMQP(ctx, o, results)
	}
	return fmt.Errorf("ceiling: broker URL %s is neither redis:// nor amqp://", redact.URL(o.BrokerURL))
}

// kombuEnvelope is the part of kombu's Redis message the loop reads.
type kombuEnvelope struct {
	Body    string `json:"body"`
	Headers struct {
		ID   string `json:"id"`
		Task string `json:"task"`
	} `json:"headers"`
	Properties struct {
		DeliveryTag  string `json:"delivery_tag"`
		DeliveryInfo struct {
			Exchange   string `json:"exchange"`
			RoutingKey string `json:"routing_key"`
		} `json:"delivery_info"`
	} `json:"properties"`
}

const (
	unackedKey      = "unacked"
	unackedIndexKey = "unacked_index"
	resultExpires   = 24 * time.Hour // Celery's result_expires default
)

func ceilingRedis(ctx context.Context, o CeilingOptions, results *goredis.Client) error {
	opt, err := goredis.ParseURL(o.BrokerURL)
	if err != nil {
		return fmt.Errorf("ceiling: broker URL: %w", redact.Error(err))
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	var envs []kombuEnvelope
	var raws []string
	for ctx.Err() == nil {
		raws, err = rdb.RPopCount(ctx, o.Queue, o.Batch).Result()
		if errors.Is(err, goredis.Nil) {
			var kv []string
			kv, err = rdb.BRPop(ctx, time.Second, o.Queue).Result()
			if errors.Is(err, goredis.Nil) {
				continue
			}
			if err == nil {
				raws = kv[1:]
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ceiling: pop: %w", err)
		}
		envs = envs[:0]
		for _, raw := range raws {
			var e kombuEnvelope
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				return fmt.Errorf("ceiling: envelope: %w", err)
			}
			if _, err := base64.StdEncoding.DecodeString(e.Body); err != nil {
				return fmt.Errorf("ceiling: body: %w", err)
			}
			envs = append(envs, e)
		}
		if err := bookkeep(ctx, rdb, results, o.Batched, envs, raws); err != nil {
			return err
		}
	}
	return nil
}

// bookkeep records a popped batch in kombu's unacked hash and index,
// writes the results and acknowledges (removes the records).
//
// Per message (the default) it sends kombu's own commands: QoS.append's
// MULTI ZADD HSET EXEC on receipt and QoS.ack's MULTI ZREM HDEL EXEC, one
// transaction per message as kombu does, all pipelined per batch (and
// Celery's SETEX + PUBLISH per result). Batched, it sends one ZADD and one
// HSET for the whole batch (then one ZREM and one HDEL), leaving the same
// keys, members and values: the least a client can ask of Redis.
func bookkeep(ctx context.Context, rdb, results *goredis.Client, batched bool, envs []kombuEnvelope, raws []string) error {
	now := float64(time.Now().UnixNano()) / 1e9
	tags := make([]string, len(envs))
	values := make([]string, len(envs))
	for i, e := range envs {
		tags[i] = e.Properties.DeliveryTag
		values[i] = unackedValue(raws[i], e.Properties.DeliveryInfo.Exchange, e.Properties.DeliveryInfo.RoutingKey)
	}
	var err error
	if batched {
		zs := make([]goredis.Z, len(envs))
		fields := make([]any, 0, 2*len(envs))
		for i := range envs {
			zs[i] = goredis.Z{Score: now, Member: tags[i]}
			fields = append(fields, tags[i], values[i])
		}
		_, err = rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.ZAdd(ctx, unackedIndexKey, zs...)
			p.HSet(ctx, unackedKey, fields...)
			return nil
		})
	} else {
		_, err = rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i := range envs {
				p.Do(ctx, "MULTI")
				p.Do(ctx, "ZADD", unackedIndexKey, now, tags[i])
				p.Do(ctx, "HSET", unackedKey, tags[i], values[i])
				p.Do(ctx, "EXEC")
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("ceiling: unacked: %w", err)
	}
	if results != nil {
		if err := writeResults(ctx, results, batched, envs, func(e kombuEnvelope) string { return e.Headers.ID }); err != nil {
			return err
		}
	}
	if batched {
		_, err = rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.ZRem(ctx, unackedIndexKey, anys(tags)...)
			p.HDel(ctx, unackedKey, tags...)
			return nil
		})
	} else {
		_, err = rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, tag := range tags {
				p.Do(ctx, "MULTI")
				p.Do(ctx, "HDEL", unackedKey, tag)
				p.Do(ctx, "ZREM", unackedIndexKey, tag)
				p.Do(ctx, "EXEC")
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("ceiling: ack: %w", err)
	}
	return nil
}

func anys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// unackedValue is kombu's unacked hash value: [payload, exchange, routing_key].
func unackedValue(raw, exchange, routingKey string) string {
	var b strings.Builder
	b.Grow(len(raw) + len(exchange) + len(routingKey) + 10)
	b.WriteByte('[')
	b.WriteString(raw)
	b.WriteString(", ")
	b.WriteString(strconv.Quote(exchange))
	b.WriteString(", ")
	b.WriteString(strconv.Quote(routingKey))
	b.WriteByte(']')
	return b.String()
}

// writeResults stores a SUCCESS document for each message and publishes it
// on the key's channel, as Celery's Redis backend does (without its GET).
func writeResults[T any](ctx context.Context, rdb *goredis.Client, batched bool, msgs []T, id func(T) string) error {
	date := time.Now().UTC().Format("2006-01-02T15:04:05.000000")
	_, err := rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		if batched {
			p.Do(ctx, "MULTI")
		}
		for _, m := range msgs {
			tid := id(m)
			key := "celery-task-meta-" + tid
			doc := `{"status": "SUCCESS", "result": null, "traceback": null, "children": [], "date_done": "` + date + `", "task_id": ` + strconv.Quote(tid) + `}`
			if !batched {
				p.Do(ctx, "MULTI") // Celery's backend: a transaction per result
			}
			p.Do(ctx, "SETEX", key, int(resultExpires.Seconds()), doc)
			p.Do(ctx, "PUBLISH", key, doc)
			if !batched {
				p.Do(ctx, "EXEC")
			}
		}
		if batched {
			p.Do(ctx, "EXEC")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ceiling: result: %w", err)
	}
	return nil
}

func ceilingAMQP(ctx context.Context, o CeilingOptions, results *goredis.Client) error {
	conn, err := amqp.Dial(o.BrokerURL)
	if err != nil {
		return fmt.Errorf("ceiling: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("ceiling: channel: %w", err)
	}
	// Celery's topology, so that the loop can start on an empty broker.
	if err := ch.ExchangeDeclare(o.Queue, "direct", true, false, false, false, nil); err != nil {
		return fmt.Errorf("ceiling: declare: %w", err)
	}
	if _, err := ch.QueueDeclare(o.Queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("ceiling: declare: %w", err)
	}
	if err := ch.QueueBind(o.Queue, o.Queue, o.Queue, false, nil); err != nil {
		return fmt.Errorf("ceiling: declare: %w", err)
	}
	if err := ch.Qos(o.Batch, 0, false); err != nil {
		return fmt.Errorf("ceiling: qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, o.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("ceiling: consume: %w", err)
	}
	var batch []amqp.Delivery
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case d, ok = <-deliveries:
		}
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return errors.New("ceiling: deliveries closed")
		}
		batch = append(batch[:0], d)
		if results != nil || o.Batched {
			// Take what has arrived already, so that the result writes (and,
			// batched, the acks) of a burst share one round trip.
		more:
			for len(batch) < o.Batch {
				select {
				case d, ok = <-deliveries:
					if !ok {
						break more
					}
					batch = append(batch, d)
				default:
					break more
				}
			}
		}
		for i := range batch {
			if _, ok := batch[i].Headers["id"].(string); !ok {
				return fmt.Errorf("ceiling: message %d has no id header", batch[i].DeliveryTag)
			}
		}
		if results != nil {
			if err := writeResults(ctx, results, o.Batched, batch, func(d amqp.Delivery) string { return d.Headers["id"].(string) }); err != nil {
				return err
			}
		}
		if o.Batched {
			if err := batch[len(batch)-1].Ack(true); err != nil {
				return fmt.Errorf("ceiling: ack: %w", err)
			}
			continue
		}
		for i := range batch {
			if err := batch[i].Ack(false); err != nil {
				return fmt.Errorf("ceiling: ack: %w", err)
			}
		}
	}
}
