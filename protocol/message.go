package protocol

import "time"

// Content types and compression types as kombu names them on the wire.
const (
	ContentTypeJSON    = "application/json"
	ContentTypeMsgpack = "application/x-msgpack"
	ContentTypeYAML    = "application/x-yaml"
	// ContentTypePickle is never decoded: unpickling runs arbitrary code.
	ContentTypePickle = "application/x-python-serialize"
	ContentTypeData   = "application/data"
	ContentTypeText   = "text/plain"

	// CompressionZlib is what kombu calls "gzip"/"zlib": a zlib stream
	// (RFC 1950), not the gzip file format, despite the MIME type.
	CompressionZlib  = "application/x-gzip"
	CompressionBzip2 = "application/x-bz2"
)

// Message is one kombu message as a transport moves it: properties, headers
// and a serialized (possibly compressed) body. On AMQP the parts map onto
// basic properties, application headers and the body; on Redis they are the
// fields of the JSON envelope (see [Envelope]).
type Message struct {
	ContentType     string
	ContentEncoding string
	// Headers are the application headers. Values use the package's value
	// types (see the package documentation).
	Headers    map[string]any
	Properties Properties
	Body       []byte
}

// Properties are the AMQP-style message properties Celery sets.
type Properties struct {
	CorrelationID string
	ReplyTo       string
	// DeliveryMode is 2 (persistent) for tasks and 1 (transient) for events,
	// replies and results; 0 means unset.
	DeliveryMode uint8
	// Priority as sent. On RabbitMQ higher is more important; on Redis kombu
	// maps 0..9 to bands where lower is more important.
	Priority int
	// Expiration is the RabbitMQ per-message TTL in milliseconds, as a string.
	Expiration string
	// Extra keeps properties this package does not model (Celery 5.2 leaks
	// options such as "origin" into them) so that re-publishing is lossless.
	Extra map[string]any
}

// TaskMessage is a decoded task message, normalised to protocol v2 semantics
// whichever protocol version carried it.
type TaskMessage struct {
	// Protocol is the version the message arrived in (1 or 2). Encoders always
	// write protocol 2.
	Protocol int

	ID     string // headers.id (v1: body.id)
	Name   string // headers.task: the registered task name
	Lang   string
	Shadow string

	ETA     time.Time // zero: none. Naive wire values are read as UTC.
	Expires time.Time // zero: none.

	Group      string
	GroupIndex *int
	Retries    int

	// TimeLimit and SoftTimeLimit come from the timelimit header, which is
	// [hard, soft]; zero means no limit (null on the wire).
	TimeLimit     time.Duration
	SoftTimeLimit time.Duration

	RootID     string
	ParentID   string
	ArgsRepr   string
	KwargsRepr string
	Origin     string
	// IgnoreResult is nil when the header is absent or null: the task default
	// applies.
	IgnoreResult        *bool
	ReplacedTaskNesting int
	StampedHeaders      []string
	Stamps              map[string]any

	// Headers keeps every header not modelled above: custom headers given to
	// apply_async(headers=...), x-death after dead-lettering, redelivered,
	// stamp values. Encoders write them back at top level.
	Headers map[string]any

	Args   []any
	Kwargs map[string]any
	Embed  Embed

	// From the message properties.
	CorrelationID string
	ReplyTo       string
	Priority      int
	DeliveryMode  uint8
	Expiration    string

	ContentType     string
	ContentEncoding string
	// Compression is the compression MIME type the body arrived with, if any.
	Compression string
}

// Embed is the third element of a protocol v2 body.
type Embed struct {
	Callbacks []Signature // link
	Errbacks  []Signature // link_error
	// Chain holds the remaining chain steps REVERSED: the next step is the
	// last element.
	Chain []Signature
	Chord *Signature
}

// Signature is a serialized celery.canvas.Signature.
type Signature struct {
	Task    string
	Args    []any
	Kwargs  map[string]any
	Options map[string]any
	// SubtaskType is "" (null) for a plain task, or "group", "chain", "chord",
	// "chunks", "xmap", "xstarmap".
	SubtaskType string
	// Immutable signatures (.si()) do not receive the parent's result.
	Immutable bool
	// Extra keeps keys this package does not model (for example chord_size)
	// so that re-publishing is lossless.
	Extra map[string]any
}

// DecodeOptions bound what a decoder accepts. The zero value applies the
// defaults documented on each field.
type DecodeOptions struct {
	// Accept lists the content types that may be deserialized. Empty means
	// JSON and msgpack. Pickle is refused even when listed.
	Accept []string
	// MaxBodySize bounds the body after decompression, in bytes. Zero means
	// 64 MiB.
	MaxBodySize int
	// MaxDepth bounds the nesting of arrays and objects. Zero means 256.
	MaxDepth int
}

// EncodeOptions choose how a task message is serialized.
type EncodeOptions struct {
	// ContentType is the serializer. Empty means JSON.
	ContentType string
	// Compression is a compression MIME type ([CompressionZlib]) or empty.
	Compression string
}
