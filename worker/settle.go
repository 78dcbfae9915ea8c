package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

type settleAction int

const (
	settleAck settleAction = iota
	settleDeadLetter
	settleRequeue
)

func (a settleAction) String() string {
	switch a {
	case settleAck:
		return "ack"
	case settleDeadLetter:
		return "dead-letter"
	}
	return "requeue"
}

// settle acknowledges, dead-letters or requeues a still-held message. An
// early-acknowledged message is already settled. A settlement the broker
// refuses is tried again within one settle budget; after that the message
// stays unacknowledged and the broker delivers it again.
func (w *Worker) settle(r *run, a settleAction, reason ...transport.DeadLetterReason) {
	if r.acked {
		return
	}
	r.acked = true
	var why transport.DeadLetterReason
	if len(reason) > 0 {
		why = reason[0]
	}
	if err := w.settleDelivery(r.p.d, a, why); err != nil {
		r.logAt(zap.ErrorLevel, "settling the message failed; the broker will deliver it again",
			zap.Stringer("action", a), zap.Error(err))
	}
}

// settleDelivery carries out one settlement within its own budget.
func (w *Worker) settleDelivery(d *transport.Delivery, a settleAction, why transport.DeadLetterReason) error {
	return w.persist(func(ctx context.Context) error {
		switch a {
		case settleAck:
			return d.Ack(ctx)
		case settleRequeue:
			return d.Reject(ctx, true)
		default:
			return d.DeadLetter(ctx, why)
		}
	})
}

// settleTimeout is the budget of one settle step (a result write, one
// publish, an acknowledgement). Each step gets its own, starting when the
// step starts, so neither a long task nor an earlier slow step uses it up.
const settleTimeout = 30 * time.Second

// settleCtx returns the budget of one settle step. It is not cancelled by
// the shutdown's start, only when Run gives up waiting (see Run).
func (w *Worker) settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(w.settleBase, settleTimeout)
}

// persist runs op until it succeeds, its budget (settleTimeout, from now)
// runs out, or it fails in a way another try cannot mend. A broker or
// backend that is briefly down is thus ridden out instead of losing a
// result or leaving a message for redelivery.
func (w *Worker) persist(op func(context.Context) error) error {
	ctx, cancel := w.settleCtx()
	defer cancel()
	return persistWithin(ctx, op)
}

// persistWithin is persist with the budget ctx.
func persistWithin(ctx context.Context, op func(context.Context) error) error {
	backoff := persistFirstBackoff
	for {
		err := op(ctx)
		if err == nil || !retryable(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave up: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		backoff = min(2*backoff, persistMaxBackoff)
	}
}

const (
	persistFirstBackoff = 50 * time.Millisecond
	persistMaxBackoff   = 2 * time.Second
)

// retryable says whether trying a settle step again can help: not when the
// delivery is settled or gone, the transport or backend is closed, the
// value cannot be encoded, or the budget was cancelled.
func retryable(err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, transport.ErrStaleDelivery), errors.Is(err, transport.ErrAlreadyAcknowledged),
		errors.Is(err, transport.ErrClosed), errors.Is(err, transport.ErrTopologyMismatch),
		errors.Is(err, backend.ErrClosed), errors.Is(err, protocol.ErrUnencodable):
		return false
	}
	return true
}
