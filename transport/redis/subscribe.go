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
	hc := healthCheck{every: s.t.cfg.HealthCheckInterval, last: time.Now()}
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
				if msg = s.checkHealth(&hc, time.Now()); msg == nil {
					continue
				}
				err = nil
			}
		}
		if err != nil {
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
			hc.reset(time.Now())
			continue
		}
		attempt = 0
		hc.reset(time.Now())
		m, ok := msg.(*goredis.Message)
		if !ok {
			continue // a PONG, or a (re)subscription confirmation
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

// healthCheck is a subscription's view of its connection: a pub/sub
// connection that receives nothing may be idle or dead, and only the
// answer to a PING tells which (kombu's health_check_interval).
type healthCheck struct {
	every  time.Duration // <= 0: never check
	last   time.Time     // when anything was last received
	pinged time.Time     // when the unanswered PING went out (zero: none)
}

func (h *healthCheck) reset(now time.Time) { h.last, h.pinged = now, time.Time{} }

// due says what to do after a silent second: "ping" when the connection
// has been silent for a period, "replace" when a PING got no answer for
// another, "" otherwise.
func (h *healthCheck) due(now time.Time) string {
	switch {
	case h.every <= 0:
		return ""
	case !h.pinged.IsZero():
		if now.Sub(h.pinged) >= h.every {
			return "replace"
		}
		return ""
	case now.Sub(h.last) >= h.every:
		return "ping"
	}
	return ""
}

// checkHealth runs after each silent second of the subscription. It
// returns what it happened to read, if anything.
func (s *subscription) checkHealth(h *healthCheck, now time.Time) any {
	switch h.due(now) {
	case "ping":
		// A PING that cannot be written has go-redis reconnect at once.
		if err := s.ps.Ping(context.Background()); err != nil {
			h.reset(now)
			return nil
		}
		h.pinged = now
	case "replace":
		s.t.logError(&s.limit, "redis: subscription connection does not answer PING; reconnecting",
			fmt.Errorf("no PONG within %s", h.every), zap.String("exchange", s.b.Exchange))
		// go-redis replaces a pub/sub connection whose read fails other
		// than by ReceiveTimeout's own timeout, and subscribes the new one
		// to the same patterns: an already expired read is such a failure.
		// What was buffered is still read first.
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		msg, err := s.ps.Receive(ctx)
		cancel()
		h.reset(now)
		if err == nil {
			return msg
		}
	}
	return nil
}
