package protocol

import (
	"errors"
	"fmt"
)

// Sentinel errors. Decoders wrap them; test with errors.Is.
var (
	// ErrUnsupportedContentType: the content type is unknown or not accepted.
	// Pickle is always refused with this error (as a *ContentTypeError).
	ErrUnsupportedContentType = errors.New("protocol: unsupported content type")
	// ErrUnsupportedCompression: the compression header names an unknown type.
	ErrUnsupportedCompression = errors.New("protocol: unsupported compression")
	// ErrNotTaskMessage: neither v2 headers nor a v1 body.
	ErrNotTaskMessage = errors.New("protocol: not a task message")
	// ErrTooLarge: a size bound of DecodeOptions was exceeded.
	ErrTooLarge = errors.New("protocol: message too large")
	// ErrTooDeep: the nesting bound of DecodeOptions was exceeded.
	ErrTooDeep = errors.New("protocol: nesting too deep")
	// ErrUnencodable: a value has no JSON or msgpack form (a channel, a
	// function, a cycle). Encoders wrap it; encoding it again cannot help.
	ErrUnencodable = errors.New("protocol: cannot encode value")
)

// ContentTypeError reports a content type that is refused.
type ContentTypeError struct {
	ContentType string
}

func (e *ContentTypeError) Error() string {
	if e.ContentType == ContentTypePickle {
		return fmt.Sprintf("protocol: refusing to deserialize %q (pickle is never decoded)", e.ContentType)
	}
	return fmt.Sprintf("protocol: unsupported content type %q", e.ContentType)
}

// Unwrap makes errors.Is(err, ErrUnsupportedContentType) true.
func (e *ContentTypeError) Unwrap() error { return ErrUnsupportedContentType }

// DecodeError reports which field of a message could not be decoded.
type DecodeError struct {
	Field string
	Err   error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("protocol: decode %s: %v", e.Field, e.Err) }

// Unwrap returns the cause.
func (e *DecodeError) Unwrap() error { return e.Err }
