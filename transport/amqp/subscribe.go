package amqp

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// Subscribe receives the messages published to a broadcast exchange as
// Celery's consumers do: the exchange is declared with kombu's flags
// (celery.pidbox fanout and transient, celeryev topic and durable: durable
// unless the name ends in ".pidbox"; only under DeclareAll), then a
// transient auto-delete queue (b.Queue, or "<exchange>.<uuid4>" like
// celeryev.<uuid4>) with b.QueueArguments (x-message-ttl, x-expires) is
// declared, bound with b.BindingKey, and consumed without acknowledgements.
// The subscription survives connection losses (messages published while it
// was away are lost, as broadcasts are). Cancelling ctx aborts the setup only.
func (t *Transport) Subscribe(ctx context.Context, b transport.Broadcast) (transport.Subscription, error) {
	if b.Exchange == "" {
		return nil, errors.New("amqp: broadcast without an exchange")
	}
	if b.ExchangeType == "" {
		b.ExchangeType = transport.Fanout
	}
	if b.Queue == "" {
		id, err := uuid4()
		if err != nil {
			return nil, err
		}
		b.Queue = b.Exchange + "." + id
	}
	args, err := toTable(b.QueueArguments)
	if err != nil {
		return nil, fmt.Errorf("amqp: broadcast queue arguments: %w", err)
	}
	s := &subscription{
		t:    t,
		id:   t.seq.Add(1),
		b:    b,
		args: args,
		out:  make(chan *transport.Delivery),
		done: make(chan struct{}),
	}
	s.log = t.s.log.With(zap.String("exchange", b.Exchange), zap.String("queue", b.Queue))
	life, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	var prev *session
	for {
		if t.isClosed() {
			cancel()
			return nil, transport.ErrClosed
		}
		sess, err := t.con.next(ctx, prev)
		if err != nil {
			cancel()
			return nil, err
		}
		sc, err := s.establish(sess, life.Done())
		if err == nil {
			if err := t.startSubscription(s, func() { s.run(life, sc) }); err != nil {
				cancel()
				sc.close()
				return nil, err
			}
			return s, nil
		}
		if !isConnectionError(err, sess) {
			cancel()
			return nil, err
		}
		prev = sess
	}
}

func (t *Transport) startSubscription(s *subscription, run func()) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return transport.ErrClosed
	}
	t.subs[s] = struct{}{}
	t.wg.Go(run)
	return nil
}

// subscription implements transport.Subscription.
type subscription struct {
	t    *Transport
	id   uint64
	log  *zap.Logger
	b    transport.Broadcast
	args amqp091.Table
	out  chan *transport.Delivery

	cancel context.CancelFunc
	done   chan struct{} // closed when the loop has exited and out is closed
	once   sync.Once
}

var _ transport.Subscription = (*subscription)(nil)

// subChannel is one channel of a subscription.
type subChannel struct {
	sess   *session
	ch     *amqp091.Channel
	closed chan *amqp091.Error
	fw     sync.WaitGroup
}

func (sc *subChannel) close() {
	if !sc.ch.IsClosed() {
		_ = sc.ch.Close()
	}
	sc.fw.Wait()
}

func (s *subscription) establish(sess *session, stopping <-chan struct{}) (*subChannel, error) {
	b := s.b
	tp := &topo{sess: sess}
	defer tp.close()
	if s.t.s.Declare == DeclareAll {
		err := tp.do(func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(b.Exchange, b.ExchangeType, exchangeDurable(b.Exchange), false, false, false, nil)
		})
		if mm := asMismatch(err, "exchange", b.Exchange); mm != nil && !s.t.s.StrictTopology {
			s.log.Warn("amqp exchange exists with other properties; using it as it is", zap.Error(mm))
		} else if mm != nil {
			return nil, mm
		} else if err != nil {
			return nil, fmt.Errorf("amqp: declare exchange %q: %w", b.Exchange, err)
		}
	}
	err := tp.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare(b.Queue, false, true, false, false, s.args)
		return err
	})
	if mm := asMismatch(err, "queue", b.Queue); mm != nil && !s.t.s.StrictTopology {
		s.log.Warn("amqp queue exists with other arguments; consuming it as it is", zap.Error(mm))
	} else if mm != nil {
		return nil, mm
	} else if err != nil {
		return nil, fmt.Errorf("amqp: declare queue %q: %w", b.Queue, err)
	}
	err = tp.do(func(ch *amqp091.Channel) error {
		return ch.QueueBind(b.Queue, b.BindingKey, b.Exchange, false, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("amqp: bind %q to %q: %w", b.Queue, b.Exchange, err)
	}
	ch, err := sess.conn.Channel()
	if err != nil {
		return nil, err
	}
	sc := &subChannel{sess: sess, ch: ch, closed: ch.NotifyClose(make(chan *amqp091.Error, 1))}
	tag := "celeriac.s" + strconv.FormatUint(s.id, 10) + "." + strconv.FormatUint(s.t.seq.Add(1), 10)
	in, err := ch.Consume(b.Queue, tag, true, false, false, false, nil)
	if err != nil {
		sc.close()
		return nil, fmt.Errorf("amqp: consume %q: %w", b.Queue, err)
	}
	sc.fw.Go(func() { s.forward(in, stopping) })
	return sc, nil
}

// forward converts and hands out broadcast messages. They need no
// acknowledgement; those arriving while the subscription closes are dropped.
func (s *subscription) forward(in <-chan amqp091.Delivery, stopping <-chan struct{}) {
	for d := range in {
		m, err := messageFromDelivery(&d)
		if err != nil {
			s.log.Error("amqp broadcast message with unreadable headers; dropped", zap.Error(err))
			continue
		}
		del := &transport.Delivery{
			Message:     m,
			Queue:       s.b.Queue,
			Exchange:    d.Exchange,
			RoutingKey:  d.RoutingKey,
			Redelivered: d.Redelivered,
			Tag:         strconv.FormatUint(d.DeliveryTag, 10),
			ReceivedAt:  time.Now(),
		}
		select {
		case s.out <- del:
		case <-stopping:
		}
	}
}

func (s *subscription) run(ctx context.Context, sc *subChannel) {
	defer close(s.done)
	defer close(s.out)
	for attempt := 0; ; {
		select {
		case <-ctx.Done():
			sc.close()
			return
		case <-sc.closed:
		case <-sc.sess.lost:
		}
		sc.close()
		sess := sc.sess
		for {
			if sess.isLost() {
				next, err := s.t.con.next(ctx, sess)
				if err != nil {
					return
				}
				sess = next
			}
			next, err := s.establish(sess, ctx.Done())
			if err == nil {
				sc = next
				attempt = 0
				break
			}
			if ctx.Err() != nil {
				return
			}
			d := s.t.s.pause(attempt)
			attempt++
			s.log.Warn("amqp subscription could not resume; retrying", zap.Duration("retry_in", d), zap.Error(err))
			tm := time.NewTimer(d)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return
			}
		}
	}
}

// shutdown tells the loop to stop.
func (s *subscription) shutdown() { s.cancel() }

// Deliveries implements transport.Subscription.
func (s *subscription) Deliveries() <-chan *transport.Delivery { return s.out }

// Close implements transport.Subscription: it stops consuming (the broker
// deletes the auto-delete queue) and closes Deliveries.
func (s *subscription) Close() error {
	s.once.Do(func() {
		s.shutdown()
		<-s.done
		s.t.unregister(nil, s)
	})
	return nil
}

// uuid4 returns a random UUID in its canonical text form.
func uuid4() (string, error) {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		return "", fmt.Errorf("amqp: random uuid: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[c>>4], hex[c&0x0f])
	}
	return string(out), nil
}
