// Package headers holds the rules on message header values that every
// transport adapter applies alike, so that a message one broker cannot
// carry is refused by all of them, before anything is sent.
package headers

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// maxDepth bounds the nesting CheckFinite follows, as protocol's encoders
// bound theirs: a cyclic value is an error, not an endless walk.
const maxDepth = protocol.MaxDepthLimit

var errDepth = fmt.Errorf("%w: header value nested more than %d levels (cyclic?)", protocol.ErrTooDeep, maxDepth)

// CheckFinite returns an error wrapping protocol.ErrUnencodable when a
// value of h is, or holds, a NaN or an infinite float.
//
// RabbitMQ cannot read a NaN or an infinity in a header table: its channel
// process crashes on the frame and the broker closes the whole connection
// (541 INTERNAL_ERROR), failing every publish in flight on it, and the same
// message crashes the next connection too. Python clients cannot send such
// a header over AMQP either. The Redis envelope's JSON could carry one
// (Python's json reads NaN), but a program must not work on one broker and
// fail on another, so every adapter refuses the message.
//
// Values of other Go types are checked as protocol.ToValue converts them
// ([]float64 becomes []any); a value ToValue refuses is left to the
// adapter's encoder, which refuses it too. A value nested deeper than
// protocol.MaxDepthLimit is an error wrapping protocol.ErrTooDeep, as the
// encoders report it.
func CheckFinite(h map[string]any) error {
	for k, v := range h {
		var path []string
		if err := finite(v, 0, &path); err != nil {
			if err == errDepth {
				// A path as deep as the limit says nothing.
				return fmt.Errorf("header %q: %w", k, err)
			}
			slices.Reverse(path)
			return fmt.Errorf("header %q%s: %w", k, strings.Join(path, ""), err)
		}
	}
	return nil
}

// Float returns the error CheckFinite reports for f, or nil when f is
// finite. Adapters that already walk the values (AMQP's table conversion)
// call it on each float instead of walking twice.
func Float(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: %v is not a finite number, and RabbitMQ closes the connection on a NaN or an infinity "+
			"in a header table, so no transport sends one", protocol.ErrUnencodable, f)
	}
	return nil
}

// finite checks v; on error, path holds the indexes and keys from the
// offending value up to v ("[1]", "[\"f\"]"), built on the way back so
// that a deep value costs no nested error strings.
func finite(v any, depth int, path *[]string) error {
	if depth > maxDepth {
		return errDepth
	}
	switch x := v.(type) {
	case nil, bool, string, int64, []byte, time.Time, *big.Int,
		protocol.Date, protocol.TimeOfDay, protocol.Decimal, protocol.UUID,
		int, int8, int16, int32, uint, uint8, uint16, uint32, uint64,
		[]string, map[string]string:
		return nil
	case float64:
		return Float(x)
	case float32:
		return Float(float64(x))
	case []any:
		for i, e := range x {
			if err := finite(e, depth+1, path); err != nil {
				*path = append(*path, "["+strconv.Itoa(i)+"]")
				return err
			}
		}
		return nil
	case map[string]any:
		for k, e := range x {
			if err := finite(e, depth+1, path); err != nil {
				*path = append(*path, "["+strconv.Quote(k)+"]")
				return err
			}
		}
		return nil
	}
	cv, err := protocol.ToValue(v)
	if err != nil {
		return nil
	}
	return finite(cv, depth+1, path)
}
