package protocol

// This file declares the package API before its implementation lands, so
// that transports, backends and the worker can be written against it in
// parallel. Each function moves to its own file when implemented.

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

// ChildTuple is the children entry for one task id: [[id, null], null].
func ChildTuple(id string) any { return []any{[]any{id, nil}, nil} }
