package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Config configures a Backend. The zero value matches Celery's defaults.
type Config struct {
	// Serializer encodes the replies: protocol.ContentTypeJSON (the default
	// when empty) or protocol.ContentTypeMsgpack; "json" and "msgpack" are
	// accepted too (Celery's result_serializer). The content type travels
	// with the message, so the client can decode either.
	Serializer string
	// Persistent sends replies with delivery mode 2 instead of 1 (Celery's
	// result_persistent).
	Persistent bool
}

// Backend sends task states to the client's reply queue. It is safe for
// concurrent use.
type Backend struct {
	pub          transport.Publisher
	contentType  string
	encoding     string
	deliveryMode uint8

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
}

var _ backend.Backend = (*Backend)(nil)

// New returns a backend that publishes through pub. The backend does not own
// pub: Close does not close it.
func New(pub transport.Publisher, cfg Config) (*Backend, error) {
	if pub == nil {
		return nil, errors.New("rpc backend: nil Publisher")
	}
	b := &Backend{pub: pub, deliveryMode: 1}
	if cfg.Persistent {
		b.deliveryMode = 2
	}
	switch strings.ToLower(cfg.Serializer) {
	case "", "json", protocol.ContentTypeJSON:
		b.contentType, b.encoding = protocol.ContentTypeJSON, "utf-8"
	case "msgpack", protocol.ContentTypeMsgpack:
		b.contentType, b.encoding = protocol.ContentTypeMsgpack, "binary"
	default:
		return nil, fmt.Errorf("rpc backend: unsupported result serializer %q (json or msgpack)", cfg.Serializer)
	}
	return b, nil
}

// Store publishes the state to r.ReplyTo with correlation id
// r.CorrelationID (the task id when empty). Without ReplyTo it sends nothing
// and returns nil, as Celery does. It returns once the publisher returns
// (for a transport, after the broker confirmed the message), ErrClosed after
// Close, and the publisher's error wrapped.
func (b *Backend) Store(ctx context.Context, r backend.StoreRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := r.Meta
	switch {
	case m == nil:
		return errors.New("rpc backend: Store: nil meta")
	case m.TaskID == "":
		return errors.New("rpc backend: Store: empty task id")
	case m.Status == "":
		return fmt.Errorf("rpc backend: Store %s: empty status", m.TaskID)
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return backend.ErrClosed
	}
	b.inflight.Add(1)
	b.mu.RUnlock()
	defer b.inflight.Done()

	if r.ReplyTo == "" {
		return nil
	}
	p, err := b.publishing(r)
	if err != nil {
		return err
	}
	if err := b.pub.Publish(ctx, p); err != nil {
		return fmt.Errorf("rpc backend: reply for %s to %s: %w", m.TaskID, r.ReplyTo, err)
	}
	return nil
}

// publishing builds the reply message for r.
func (b *Backend) publishing(r backend.StoreRequest) (*transport.Publishing, error) {
	m := r.Meta
	var tb any
	if m.Traceback != "" {
		tb = m.Traceback
	}
	children := m.Children
	if children == nil {
		children = []any{}
	}
	// Celery 5.2's RPC body: the meta without date_done, group or extended
	// fields (backends/rpc.py _to_result).
	body, err := protocol.Marshal(b.contentType, map[string]any{
		"task_id":   m.TaskID,
		"status":    string(m.Status),
		"result":    exceptionValue(m.Result),
		"traceback": tb,
		"children":  children,
	})
	if err != nil {
		return nil, fmt.Errorf("rpc backend: encode result of %s: %w", m.TaskID, err)
	}
	corr := r.CorrelationID
	if corr == "" {
		corr = m.TaskID
	}
	return &transport.Publishing{
		Exchange:   "",
		RoutingKey: r.ReplyTo,
		Message: protocol.Message{
			ContentType:     b.contentType,
			ContentEncoding: b.encoding,
			Headers:         map[string]any{},
			Properties:      protocol.Properties{CorrelationID: corr, DeliveryMode: b.deliveryMode},
			Body:            body,
		},
	}, nil
}

// Get is not supported: replies are messages consumed by the client. The
// error matches errors.ErrUnsupported (or ErrClosed after Close).
func (b *Backend) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, backend.ErrClosed
	}
	return nil, fmt.Errorf("rpc backend: Get %s: results are messages consumed by the client: %w", taskID, errors.ErrUnsupported)
}

// Close waits for Store calls in progress; later calls, including Close,
// return ErrClosed. It does not close the Publisher.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	b.closed = true
	b.mu.Unlock()
	b.inflight.Wait()
	return nil
}

// exceptionValue converts a *protocol.ExceptionInfo into the dict Celery
// sends; other values pass through.
func exceptionValue(v any) any {
	if e, ok := v.(*protocol.ExceptionInfo); ok && e != nil {
		return e.Value()
	}
	return v
}
