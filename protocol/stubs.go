package protocol

// This file declares the package API before its implementation lands, so
// that transports, backends and the worker can be written against it in
// parallel. Each function moves to its own file when implemented.

import (
	"errors"
	"time"
)

var errNotImplemented = errors.New("protocol: not implemented yet")

// Value types beyond JSON's, from kombu's typed JSON envelopes
// ({"__type__": ..., "__value__": ...}) and msgpack.
type (
	// Date is a calendar date (Python datetime.date).
	Date struct {
		Year  int
		Month time.Month
		Day   int
	}
	// TimeOfDay is a wall-clock time without a date (Python datetime.time).
	TimeOfDay struct {
		Hour, Minute, Second, Nanosecond int
	}
	// Decimal is a decimal number kept as its exact text (Python Decimal).
	Decimal string
	// UUID is a 16-byte UUID (Python uuid.UUID).
	UUID [16]byte
)

// DeliveryInfo is the kombu Redis envelope's properties.delivery_info.
type DeliveryInfo struct {
	Exchange    string
	RoutingKey  string
	Redelivered bool
}

// Envelope is one item of a kombu Redis list (or a message published on a
// kombu fanout channel): the message plus the transport fields kombu adds.
type Envelope struct {
	Message Message
	// BodyEncoding is "base64" (kombu's default) or "" for a raw body.
	BodyEncoding string
	// DeliveryTag is a UUID4 string chosen by the publisher and kept on
	// redelivery.
	DeliveryTag  string
	DeliveryInfo DeliveryInfo
}

// ParseTime parses an ISO 8601 time as Celery writes it; naive values are UTC.
func ParseTime(s string) (time.Time, error) { return time.Time{}, errNotImplemented }

// FormatTime formats t as Python's datetime.isoformat() does.
func FormatTime(t time.Time) string { return "" }

// Marshal serializes v with the serializer for contentType.
func Marshal(contentType string, v any) ([]byte, error) { return nil, errNotImplemented }

// Unmarshal deserializes data with the serializer for contentType.
func Unmarshal(contentType string, data []byte, opts DecodeOptions) (any, error) {
	return nil, errNotImplemented
}

// Compress compresses data with the compression named by its MIME type.
func Compress(mime string, data []byte) ([]byte, error) { return nil, errNotImplemented }

// Decompress decompresses data; the output may not exceed maxSize bytes.
func Decompress(mime string, data []byte, maxSize int) ([]byte, error) {
	return nil, errNotImplemented
}

// ChildTuple is the children entry for one task id: [[id, null], null].
func ChildTuple(id string) any { return []any{[]any{id, nil}, nil} }

// Bind converts a decoded value into the Go value dst points to.
func Bind(src any, dst any) error { return errNotImplemented }

// BindArgs binds positional arguments into the values dst point to, in order.
func BindArgs(args []any, dst ...any) error { return errNotImplemented }

// Repr renders v as Python's repr() would (for argsrepr, kwargsrepr and
// events).
func Repr(v any) string { return "" }
