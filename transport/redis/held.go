package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// held is a delivery this process holds: popped, recorded in unacked and
// not yet settled. It is the delivery's Acknowledger.
type held struct {
	t          *Transport
	c          *consumer
	seq        uint64
	queue      string
	tag        string
	exchange   string
	routingKey string
	raw        []byte
	settled    atomic.Bool
}

var _ transport.AsyncAcknowledger = (*held)(nil)

func (t *Transport) hold(c *consumer, m *popped) *held {
	h := &held{t: t, c: c, queue: m.queue, tag: m.tag, exchange: m.exchange, routingKey: m.routingKey, raw: m.raw}
	t.mu.Lock()
	t.heldSeq++
	h.seq = t.heldSeq
	t.held[h] = struct{}{}
	t.mu.Unlock()
	return h
}

// settle marks the delivery settled; only the first caller gets true. It
// frees the prefetch slot and stops the visibility renewal.
func (h *held) settle() bool {
	if !h.settled.CompareAndSwap(false, true) {
		return false
	}
	h.t.mu.Lock()
	delete(h.t.held, h)
	h.t.mu.Unlock()
	if h.c != nil {
		h.c.release(h.queue)
	}
	return true
}

// Ack implements transport.Acknowledger: ZREM + HDEL, batched with the
// other acks in flight into one MULTI/EXEC round trip. If ctx ends first
// the ack stays queued and is still applied.
func (h *held) Ack(ctx context.Context, d *transport.Delivery) error {
	if h.t.isClosed() {
		return transport.ErrClosed
	}
	if !h.settle() {
		return transport.ErrAlreadyAcknowledged
	}
	return h.t.acker.ack(ctx, h.tag)
}

// AckAsync implements transport.AsyncAcknowledger: the ack joins the next
// group-committed MULTI/EXEC, written by a goroutine of the acker's, and
// wait waits for it.
func (h *held) AckAsync(ctx context.Context, d *transport.Delivery) (func(context.Context) error, error) {
	if h.t.isClosed() {
		return nil, transport.ErrClosed
	}
	if !h.settle() {
		return nil, transport.ErrAlreadyAcknowledged
	}
	b, err := h.t.acker.ackAsync(h.tag)
	if err != nil {
		return nil, err
	}
	return b.wait, nil
}

// Reject implements transport.Acknowledger. With requeue the message goes
// back to the end of its queue (LPUSH) with the redelivered flags, as
// kombu's reject(requeue=True); without, it is dropped like an ack (kombu
// has no dead-lettering on Redis; use DeadLetter to keep it).
func (h *held) Reject(ctx context.Context, d *transport.Delivery, requeue bool) error {
	if h.t.isClosed() {
		return transport.ErrClosed
	}
	if !h.settle() {
		return transport.ErrAlreadyAcknowledged
	}
	if !requeue {
		h.t.log.Info("redis: message rejected without requeue: dropped",
			zap.String("queue", h.queue), zap.String("delivery_tag", h.tag))
		return h.t.acker.ack(ctx, h.tag)
	}
	return h.t.retry(ctx, func() error {
		n, err := h.t.restore(ctx, h.tag, h.raw, h.exchange, h.routingKey, h.queue, true, "")
		if err == nil && n == 0 {
			return transport.ErrStaleDelivery
		}
		return err
	})
}

// DeadLetter implements transport.Acknowledger: the message leaves unacked
// and is appended to its queue's dead-letter list, atomically. It returns
// transport.ErrStaleDelivery when the message was no longer unacked
// (restored by a sweep after its visibility timeout).
func (h *held) DeadLetter(ctx context.Context, d *transport.Delivery, r transport.DeadLetterReason) error {
	if h.t.isClosed() {
		return transport.ErrClosed
	}
	if !h.settle() {
		return transport.ErrAlreadyAcknowledged
	}
	return h.t.deadLetter(ctx, h, r)
}

// retry runs f until it succeeds, fails with a non-retryable error or ctx
// ends.
func (t *Transport) retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !isRetryable(err) {
			return err
		}
		if attempt >= 20 {
			return err
		}
		tm := time.NewTimer(t.backoff(attempt))
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		}
	}
}
