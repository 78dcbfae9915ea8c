// Package protocol is the Celery wire format: task messages (protocol v2 and
// v1), their serializers and compression, the kombu Redis envelope, and the
// result-backend documents that Python's AsyncResult reads.
//
// The package is pure: bytes in, values out. It does no I/O, starts no
// goroutines, does no logging, never reads the clock or a random source and
// holds no mutable globals; callers pass times and ids in. Every decoder is
// fuzzed and must reject bad input with an error, never a panic.
//
// # Values
//
// Decoded arguments, keyword arguments, header values and results use one
// small set of Go types, so that every layer above (transports, the worker,
// handlers) sees the same thing whichever serializer or broker carried the
// message:
//
//	nil, bool, int64, *big.Int (integers outside int64), float64, string,
//	[]byte, []any, map[string]any, time.Time, Date, TimeOfDay, Decimal, UUID
//
// Encoders accept those types and, for results, any value encoding/json can
// marshal.
//
// # Where it sits
//
// protocol is a leaf: it imports only the standard library and msgpack.
// transport, backend and worker build on it.
package protocol
