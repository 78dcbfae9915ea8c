package worker

import (
	"context"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Task is what a handler receives: the decoded task message and where it came
// from. Handlers must not modify it.
type Task struct {
	ID   string
	Name string

	// Args and Kwargs hold the decoded arguments (see package protocol for the
	// value types); bind them into Go values with [Task.Bind] and
	// [Task.BindKwargs].
	Args   []any
	Kwargs map[string]any

	// Retries is how many times the task was retried before (0 on the first
	// run).
	Retries int
	ETA     time.Time
	Expires time.Time

	RootID     string
	ParentID   string
	GroupID    string
	GroupIndex *int

	// Headers holds custom headers (apply_async(headers=...)) and broker
	// headers such as x-death.
	Headers map[string]any

	DeliveryInfo DeliveryInfo
	// Hostname is the worker's node name (celery@host).
	Hostname string

	// Message is the whole decoded message, for what the fields above leave
	// out (embed, time limits, reply_to, stamps, ...).
	Message *protocol.TaskMessage
}

// DeliveryInfo says how the message reached the worker (Celery's
// request.delivery_info).
type DeliveryInfo struct {
	Queue       string
	Exchange    string
	RoutingKey  string
	Priority    int
	Redelivered bool
}

// Bind binds the positional arguments into the values dst point to, in order:
//
//	var a, b int
//	if err := t.Bind(&a, &b); err != nil { return nil, retry.Skip(err) }
//
// A binding error is never retried and reaches Python as a TypeError.
func (t *Task) Bind(dst ...any) error {
	if err := protocol.BindArgs(t.Args, dst...); err != nil {
		return &bindError{err: err}
	}
	return nil
}

// BindKwargs binds the keyword arguments into the struct or map dst points
// to; keywords no field takes are ignored, missing ones leave their field
// as it is unless tagged required. Errors name the keyword as
// "kwargs.<name>".
func (t *Task) BindKwargs(dst any) error {
	if err := protocol.BindKwargs(t.Kwargs, dst); err != nil {
		return &bindError{err: err}
	}
	return nil
}

// BindKwargsStrict binds the keyword arguments as Python calls a function:
// see protocol.BindKwargsStrict. FuncKwargs binds this way.
func (t *Task) BindKwargsStrict(dst any) error {
	if err := protocol.BindKwargsStrict(t.Kwargs, dst); err != nil {
		return &bindError{err: err}
	}
	return nil
}

type taskKey struct{}

// TaskFromContext returns the task a handler's ctx belongs to, or nil.
func TaskFromContext(ctx context.Context) *Task {
	t, _ := ctx.Value(taskKey{}).(*Task)
	return t
}

func newTask(m *protocol.TaskMessage, d DeliveryInfo, hostname string) *Task {
	return &Task{
		ID:           m.ID,
		Name:         m.Name,
		Args:         m.Args,
		Kwargs:       m.Kwargs,
		Retries:      m.Retries,
		ETA:          m.ETA,
		Expires:      m.Expires,
		RootID:       m.RootID,
		ParentID:     m.ParentID,
		GroupID:      m.Group,
		GroupIndex:   m.GroupIndex,
		Headers:      m.Headers,
		DeliveryInfo: d,
		Hostname:     hostname,
		Message:      m,
	}
}
