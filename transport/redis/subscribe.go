package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Subscribe receives what is published to a fanout exchange, as kombu's
// Redis transport does: PSUBSCRIBE on "<prefix>/{db}.<exchange>", or
// "<prefix>/{db}.<exchange>/<binding key with # as *>" when b.BindingKey is
// set (fanout_patterns). Topic broadcasts (celeryev) are fanout on Redis.
// When b.Queue is set its binding is added to _kombu.binding.<exchange>
// (kombu's queue_bind for pidbox and event queues) and removed again at
// Close. Subscribe returns once the subscription is active.
func (t *Transport) Subscribe(ctx context.Context, b transport.Broadcast) (transport.Subscription, error) {
	if b.Exchange == "" {
		return nil, errors.New("redis: subscribe needs an exchange")
	}
	if t.isClosed() {
		return nil, transport.ErrClosed
	}
	pattern := t.keys.subscribePattern(b.Exchange, b.BindingKey)
	ps := t.rdb.PSubscribe(ctx)
	if err := ps.PSubscribe(ctx, pattern); err != nil {
		ps.Close()
		return nil, fmt.Errorf("redis: psubscribe %q: %w", pattern, err)
	}
	// Wait for the confirmation so that a publish after Subscribe is seen.
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		ps.Close()
		return nil, fmt.Errorf("redis: psubscribe %q: %w", pattern, err)
	}
	s := &subscription{
		t:     t,
		ps:    ps,
		b:     b,
		out:   make(chan *transport.Delivery),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		limit: logLimiter{every: 5 * time.Second},
	}
	if b.Queue != "" {
		s.bindKey = t.keys.binding(b.Exchange)
		s.member = t.keys.bindingMember(b.BindingKey, "", b.Queue)
		if err := t.rdb.SAdd(ctx, s.bindKey, s.member).Err(); err != nil {
			ps.Close()
			return nil, fmt.Errorf("redis: bind %q: %w", b.Queue, err)
		}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		ps.Close()
		return nil, transport.ErrClosed
	}
	t.subs[s] = struct{}{}
	t.wg.Go(s.run)
	t.mu.Unlock()
	return s, nil
}

type subscription struct {
	t       *Transport
	ps      *goredis.PubSub
	b       transport.Broadcast
	out     chan *transport.Delivery
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	bindKey string
	member  string
	limit   logLimiter
}

// Deliveries implements transport.Subscription.
func (s *subscription) Deliveries() <-chan *transport.Delivery { return s.out }

// Close implements transport.Subscription.
func (s *subscription) Close() error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		err = s.ps.Close()
		<-s.done
		s.t.mu.Lock()
		delete(s.t.subs, s)
		s.t.mu.Unlock()
		if s.member != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if rerr := s.t.rdb.SRem(ctx, s.bindKey, s.member).Err(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	})
	return err
}

func (s *subscription) run() {
	defer close(s.done)
	defer close(s.out)
	attempt := 0
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		msg, err := s.ps.ReceiveTimeout(context.Background(), time.Second)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			select {
			case <-s.stop:
				return
			default:
			}
			s.t.logError(&s.limit, "redis: subscription receive failed; reconnecting", err,
				zap.String("exchange", s.b.Exchange))
			if !sleep(s.stop, s.t.backoff(attempt)) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		m, ok := msg.(*goredis.Message)
		if !ok {
			continue
		}
		env, err := protocol.DecodeEnvelope([]byte(m.Payload), s.t.cfg.Decode)
		if err != nil {
			// A broadcast has no queue to dead-letter to; it is logged.
			s.t.logError(&s.limit, "redis: undecodable broadcast message dropped", err,
				zap.String("channel", m.Channel), zap.Int("size", len(m.Payload)))
			continue
		}
		d := &transport.Delivery{
			Message:     env.Message,
			Queue:       s.b.Queue,
			Exchange:    env.DeliveryInfo.Exchange,
			RoutingKey:  env.DeliveryInfo.RoutingKey,
			Redelivered: env.DeliveryInfo.Redelivered,
			Tag:         env.DeliveryTag,
			ReceivedAt:  time.Now(),
		}
		select {
		case s.out <- d:
		case <-s.stop:
			return
		}
	}
}
