package protocol

// This file declares the package API before its implementation lands, so
// that transports, backends and the worker can be written against it in
// parallel. Each function moves to its own file when implemented.

import "errors"

var errNotImplemented = errors.New("protocol: not implemented yet")

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

// DecodeTask decodes a task message of protocol v2 or v1 (detected as Celery's
// worker does) into a TaskMessage.
func DecodeTask(m *Message, opts DecodeOptions) (*TaskMessage, error) { return nil, errNotImplemented }

// EncodeTask encodes t as a protocol v2 message.
func EncodeTask(t *TaskMessage, opts EncodeOptions) (*Message, error) { return nil, errNotImplemented }

// EncodeEnvelope encodes e as kombu's Redis JSON envelope.
func EncodeEnvelope(e *Envelope) ([]byte, error) { return nil, errNotImplemented }

// DecodeEnvelope decodes a kombu Redis JSON envelope. The body is
// base64-decoded but not deserialized.
func DecodeEnvelope(data []byte, opts DecodeOptions) (*Envelope, error) {
	return nil, errNotImplemented
}

// EncodeResult serializes m as the celery-task-meta document.
func EncodeResult(m *ResultMeta, contentType string) ([]byte, error) { return nil, errNotImplemented }

// DecodeResult parses a celery-task-meta document.
func DecodeResult(data []byte, contentType string, opts DecodeOptions) (*ResultMeta, error) {
	return nil, errNotImplemented
}

// ChildTuple is the children entry for one task id: [[id, null], null].
func ChildTuple(id string) any { return []any{[]any{id, nil}, nil} }

// DecodeSignature converts a decoded signature dict into a Signature.
func DecodeSignature(v any) (Signature, error) { return Signature{}, errNotImplemented }

// Value returns s as the dict Celery serializes.
func (s Signature) Value() map[string]any { return nil }
