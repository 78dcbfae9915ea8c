package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// TaskName is the Celery name Python calls: charge.delay(order_id, amount).
const TaskName = "payments.charge"

// Payments holds the charge task's dependencies.
type Payments struct {
	Gateway *Client
	Log     *zap.Logger
}

// ChargeOptions configure the task's registration.
type ChargeOptions struct {
	// Store keeps idempotency claims; a Redis result backend for a fleet.
	Store backend.IdempotencyStore
	// Lease is how long a claim lives without renewal (renewed every third
	// of it while the charge runs): a redelivery of a killed worker's task
	// waits about this long before it charges again.
	Lease time.Duration
	// MaxRetries bounds the retries of transient failures.
	MaxRetries int
}

// Register adds payments.charge to mux: idempotent per order, acks_late,
// transient failures retried with exponential backoff and jitter, permanent
// ones failed at once; a task that fails for good is dead-lettered (the
// worker's default).
func (p *Payments) Register(mux *worker.Mux, o ChargeOptions) {
	mux.Handle(TaskName, p.handler(o), worker.AcksLate(true), worker.Retry(chargePolicy(o.MaxRetries)))
}

// handler is Charge made idempotent per order.
func (p *Payments) handler(o ChargeOptions) worker.Handler {
	return worker.Idempotent(worker.IdempotencyOptions{
		Store:  o.Store,
		Key:    OrderKey,
		Lease:  o.Lease,
		Keep:   7 * 24 * time.Hour,
		Logger: p.Log,
	})(worker.HandlerFunc(p.Charge))
}

// chargePolicy retries transient gateway failures as Celery's
// autoretry_for=(TransientError,), retry_backoff=True,
// retry_backoff_max=30, retry_jitter=True would.
func chargePolicy(maxRetries int) retry.Policy {
	return retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.OnType[*TransientError]()},
		MaxRetries:   retry.Limited(maxRetries),
		Backoff:      1, // 1, 2, 4, 8… s
		BackoffMax:   30 * time.Second,
		// Jitter is on by default (retry_jitter=True), so that orders that
		// failed together do not retry together.
	}
}

// chargeArgs are the task's arguments: charge(order_id, amount,
// currency="eur"), positional or keyword.
type chargeArgs struct {
	OrderID  string `celery:"order_id,required"`
	Amount   int64  `celery:"amount,required"`
	Currency string `celery:"currency"`
}

func bindCharge(t *worker.Task) (chargeArgs, error) {
	var a chargeArgs
	switch len(t.Args) {
	case 0:
		if err := t.BindKwargs(&a); err != nil {
			return a, err
		}
	case 2:
		if err := t.Bind(&a.OrderID, &a.Amount); err != nil {
			return a, err
		}
		if c, ok := t.Kwargs["currency"]; ok {
			s, ok := c.(string)
			if !ok {
				return a, fmt.Errorf("payments.charge: currency is %T, want a string", c)
			}
			a.Currency = s
		}
	case 3:
		if err := t.Bind(&a.OrderID, &a.Amount, &a.Currency); err != nil {
			return a, err
		}
	default:
		return a, fmt.Errorf("payments.charge takes (order_id, amount, currency='eur'), got %d positional arguments", len(t.Args))
	}
	if a.Currency == "" {
		a.Currency = "eur"
	}
	if a.OrderID == "" {
		return a, errors.New("payments.charge: empty order_id")
	}
	return a, nil
}

// OrderKey is the idempotency key of a charge: one charge per order,
// whichever message, retry or redelivery carries it.
func OrderKey(t *worker.Task) (string, error) {
	a, err := bindCharge(t)
	if err != nil {
		return "", err
	}
	return "order-" + a.OrderID, nil
}

// Charge is the task: it charges the order through the gateway, passing
// the task's idempotency key as the Idempotency-Key header so that the
// gateway makes one charge per order even when this runs twice (a worker
// killed after the gateway charged, before the result was recorded).
func (p *Payments) Charge(ctx context.Context, t *worker.Task) (any, error) {
	a, err := bindCharge(t)
	if err != nil {
		return nil, retry.Skip(err)
	}
	key := worker.IdempotencyKey(ctx)
	if key == "" {
		// Registered without Idempotent: never charge without a key.
		return nil, retry.Skip(errors.New("payments.charge: no idempotency key"))
	}
	ch, replayed, err := p.Gateway.Charge(ctx, key, ChargeRequest(a))
	var perm *PermanentError
	switch {
	case errors.As(err, &perm):
		// A 4xx fails the same way every time: no retry. Python sees a
		// ValueError with the gateway's message.
		return nil, retry.Skip(worker.AsException(fmt.Errorf("charge %s: %w", a.OrderID, err), "ValueError"))
	case err != nil:
		// Retried by the policy (AutoRetryFor *TransientError); once
		// retries run out Python sees a ConnectionError.
		p.Log.Warn("charge failed, will retry", zap.String("order_id", a.OrderID),
			zap.Int("retries", t.Retries), zap.Error(err))
		return nil, worker.AsException(fmt.Errorf("charge %s: %w", a.OrderID, err), "ConnectionError")
	}
	p.Log.Info("charged", zap.String("order_id", a.OrderID), zap.String("charge_id", ch.ID),
		zap.Bool("replayed", replayed), zap.String("task_id", t.ID))
	return map[string]any{
		"charge_id": ch.ID,
		"order_id":  ch.OrderID,
		"amount":    ch.Amount,
		"currency":  ch.Currency,
		"created":   ch.Created,
	}, nil
}
