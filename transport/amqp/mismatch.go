package amqp

import (
	"errors"
	"fmt"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// MismatchError reports that a queue or exchange exists on the broker with
// other properties than those celeriac declared. RabbitMQ answers such a
// declaration with 406 PRECONDITION_FAILED and names the first property that
// differs, for example:
//
//	inequivalent arg 'x-max-priority' for queue 'celery' in vhost '/':
//	received none but current is the value '10' of type 'signedint'
//
// errors.Is(err, transport.ErrTopologyMismatch) is true, and errors.As still
// reaches the broker's *amqp091.Error.
type MismatchError struct {
	// Kind is "queue" or "exchange".
	Kind string
	// Name of the queue or exchange, and its virtual host.
	Name  string
	Vhost string
	// Argument is the property that differs: a queue argument such as
	// "x-max-priority", "x-dead-letter-exchange" or "x-queue-type", or
	// "durable", "auto_delete", "type" ...
	Argument string
	// Declared is the value celeriac sent and Current the value the broker
	// has, as the broker prints them; "" with DeclaredSet/CurrentSet false
	// means the argument is absent on that side.
	Declared, Current         string
	DeclaredSet, CurrentSet   bool
	DeclaredType, CurrentType string // AMQP type names ("signedint", "longstr") when given
	// Err is the broker's error.
	Err *amqp091.Error
}

func (e *MismatchError) Error() string {
	side := func(v, typ string, set bool) string {
		if !set {
			return "absent"
		}
		if typ != "" {
			return fmt.Sprintf("%q (%s)", v, typ)
		}
		return fmt.Sprintf("%q", v)
	}
	if e.Argument == "" {
		return fmt.Sprintf("amqp: %s %q exists with other properties: %s", e.Kind, e.Name, e.Err.Reason)
	}
	return fmt.Sprintf("amqp: %s %q in vhost %q exists with %s = %s, but celeriac declared %s",
		e.Kind, e.Name, e.Vhost, e.Argument,
		side(e.Current, e.CurrentType, e.CurrentSet), side(e.Declared, e.DeclaredType, e.DeclaredSet))
}

// Is makes errors.Is(err, transport.ErrTopologyMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == transport.ErrTopologyMismatch }

// Unwrap returns the broker's error.
func (e *MismatchError) Unwrap() error { return e.Err }

// Quorum reports whether the broker says the existing queue is a quorum
// queue (which does not support global QoS).
func (e *MismatchError) Quorum() bool {
	return e.Kind == "queue" && e.Argument == "x-queue-type" && e.CurrentSet && e.Current == "quorum"
}

// asMismatch converts a 406 PRECONDITION_FAILED about inequivalent arguments
// into a *MismatchError; other errors come back nil.
func asMismatch(err error, kind, name string) *MismatchError {
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != amqp091.PreconditionFailed {
		return nil
	}
	if !strings.Contains(ae.Reason, "inequivalent arg") {
		return nil
	}
	m := parseMismatch(ae.Reason)
	m.Err = ae
	if m.Kind == "" {
		m.Kind = kind
	}
	if m.Name == "" {
		m.Name = name
	}
	return m
}

// parseMismatch parses RabbitMQ's text for an inequivalent declaration:
//
//	PRECONDITION_FAILED - inequivalent arg 'ARG' for KIND 'NAME' in vhost 'VHOST': received X but current is Y
//
// where X and Y are "none", "'V'" or "the value 'V' of type 'T'". Parts it
// cannot find stay empty; it never fails.
func parseMismatch(reason string) *MismatchError {
	m := &MismatchError{}
	const argMark = "inequivalent arg '"
	i := strings.Index(reason, argMark)
	if i < 0 {
		return m
	}
	rest := reason[i+len(argMark):]
	arg, rest, ok := strings.Cut(rest, "' for ")
	if !ok {
		return m
	}
	m.Argument = arg
	kind, rest, ok := strings.Cut(rest, " '")
	if !ok {
		return m
	}
	m.Kind = kind
	// The name may itself contain quotes; the vhost marker ends it.
	name, rest, ok := cutLast(rest, "' in vhost '")
	if !ok {
		return m
	}
	m.Name = name
	vhost, rest, ok := cutLast(rest, "': received ")
	if !ok {
		return m
	}
	m.Vhost = vhost
	declared, current, ok := cutLast(rest, " but current is ")
	if !ok {
		return m
	}
	m.Declared, m.DeclaredType, m.DeclaredSet = parseMismatchValue(declared)
	m.Current, m.CurrentType, m.CurrentSet = parseMismatchValue(current)
	return m
}

// cutLast is strings.Cut at the last occurrence of sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// parseMismatchValue parses "none", "'V'" or "the value 'V' of type 'T'".
func parseMismatchValue(s string) (value, typ string, set bool) {
	s = strings.TrimSpace(s)
	switch {
	case s == "none":
		return "", "", false
	case strings.HasPrefix(s, "the value '"):
		body := strings.TrimPrefix(s, "the value '")
		if v, t, ok := cutLast(body, "' of type '"); ok {
			return v, strings.TrimSuffix(t, "'"), true
		}
		return strings.TrimSuffix(body, "'"), "", true
	case len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'':
		return s[1 : len(s)-1], "", true
	}
	return s, "", true
}
