package client

import (
	"time"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
)

// SendOption sets one of apply_async's keyword arguments, for Send or for
// a Signature.
type SendOption func(*publish.Options)

// TaskID sets the task id (default: a new UUID).
func TaskID(id string) SendOption { return func(o *publish.Options) { o.TaskID = id } }

// Countdown delays the task by d from when it is sent.
func Countdown(d time.Duration) SendOption {
	return func(o *publish.Options) { o.Countdown, o.HasCountdown = d, true }
}

// ETA schedules the task at t.
func ETA(t time.Time) SendOption { return func(o *publish.Options) { o.ETA = t } }

// Expires sets the time after which the task is not run (revoked with
// TaskRevokedError when it arrives later).
func Expires(t time.Time) SendOption { return func(o *publish.Options) { o.Expires = t } }

// Queue routes the task to a queue (through the default exchange, as
// Celery does).
func Queue(name string) SendOption { return func(o *publish.Options) { o.Queue = name } }

// Exchange routes the task through a named exchange with a routing key
// (default: the exchange's name) and, when kind is not empty, states the
// exchange's type (transport.Topic, Fanout or Direct) as a Celery producer
// knows it from task_queues. A missing exchange is declared direct,
// Celery's default; an existing one is used as it is. With native delayed
// delivery on (Celery 5.5, quorum queues) a countdown task goes through the
// delay levels only to a topic or fanout exchange, so say so.
func Exchange(exchange, routingKey, kind string) SendOption {
	return func(o *publish.Options) { o.Exchange, o.RoutingKey, o.ExchangeType = exchange, routingKey, kind }
}

// Priority sets the message priority.
func Priority(p int) SendOption { return func(o *publish.Options) { o.Priority = p } }

// Link adds success callbacks (link): each is applied with the task's
// return value prepended to its arguments, unless it is immutable.
func Link(s ...Signature) SendOption {
	return func(o *publish.Options) { o.Link = append(o.Link, s...) }
}

// LinkError adds error callbacks (link_error): each is sent with the
// failed task's id prepended to its arguments.
func LinkError(s ...Signature) SendOption {
	return func(o *publish.Options) { o.LinkError = append(o.LinkError, s...) }
}

// Headers adds custom headers.
func Headers(h map[string]any) SendOption {
	return func(o *publish.Options) {
		if o.Headers == nil {
			o.Headers = map[string]any{}
		}
		for k, v := range h {
			o.Headers[k] = v
		}
	}
}

// TimeLimit sets the hard and soft time limits carried by the message
// (zero: the worker's).
func TimeLimit(hard, soft time.Duration) SendOption {
	return func(o *publish.Options) { o.TimeLimit, o.SoftTimeLimit = hard, soft }
}

// ReplyTo sets the reply_to property (the RPC backend's reply queue).
func ReplyTo(q string) SendOption { return func(o *publish.Options) { o.ReplyTo = q } }

// Serializer overrides the body content type for this task.
func Serializer(contentType string) SendOption {
	return func(o *publish.Options) { o.Serializer = contentType }
}

// Compression compresses the body ([protocol.CompressionZlib]).
func Compression(mime string) SendOption { return func(o *publish.Options) { o.Compression = mime } }

// IgnoreResult asks the worker to store no result (the ignore_result
// header).
func IgnoreResult(v bool) SendOption { return func(o *publish.Options) { o.IgnoreResult = &v } }

// Shadow sets the display name used in logs and events.
func Shadow(name string) SendOption { return func(o *publish.Options) { o.Shadow = name } }

// Parent sets parent_id and root_id, as when a task sends another task.
func Parent(parentID, rootID string) SendOption {
	return func(o *publish.Options) { o.ParentID, o.RootID = parentID, rootID }
}

// Signature is a task call to be sent later: a callback, a chain step, a
// group or chord member, or a whole canvas. It is Celery's signature as it
// travels in messages, so Python and Go apply it alike.
type Signature = protocol.Signature

// NewSignature returns the signature of task name with its arguments and
// send options, like Python's signature(name, args, kwargs, **options).
// Set Immutable (Python's .si()) so that a parent's result is not
// prepended to args.
func NewSignature(name string, args []any, kwargs map[string]any, opts ...SendOption) Signature {
	var o publish.Options
	for _, opt := range opts {
		opt(&o)
	}
	s := Signature{Task: name, Args: args, Kwargs: kwargs, Options: map[string]any{}}
	if s.Args == nil {
		s.Args = []any{}
	}
	if s.Kwargs == nil {
		s.Kwargs = map[string]any{}
	}
	o.ToSignature(s.Options)
	return s
}
