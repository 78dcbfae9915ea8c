package memory

import (
	"fmt"
	"maps"
	"math/big"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/internal/headers"
)

// importMessage returns the broker's own copy of m with every header and
// extra property value converted by protocol.ToValueStrict, as the real
// adapters leave them: Go ints become int64, float32 becomes the float64
// with the same shortest digits (0.1, as the Redis envelope's JSON and the
// AMQP adapter carry it), typed slices and maps become []any and
// map[string]any. A value no broker carries (a channel, a func, a cycle) is
// an error, and so is a struct or a map without string keys: the AMQP
// adapter refuses those, and the Redis one sends whatever encoding/json
// makes of them. Typed slices and maps ([]int, map[string]int) are taken
// as the Redis adapter takes them, although the AMQP adapter accepts only
// []string and map[string]string. A NaN or an infinite float in a header
// is refused, as every adapter refuses it (see headers.CheckFinite).
func importMessage(m *protocol.Message) (stored, error) {
	var s stored
	s.msg = *m
	var err error
	if s.msg.Headers, s.nestedHeaders, err = importMap(m.Headers, "header"); err != nil {
		return stored{}, err
	}
	// Checked on the converted values, which are of protocol's types.
	if err := headers.CheckFinite(s.msg.Headers); err != nil {
		return stored{}, fmt.Errorf("memory: %w", err)
	}
	if s.msg.Properties.Extra, s.nestedExtra, err = importMap(m.Properties.Extra, "property"); err != nil {
		return stored{}, err
	}
	s.msg.Body = cloneBytes(m.Body)
	return s, nil
}

// stored is a message as the broker keeps it: immutable once stored, with
// the keys whose values are mutable containers listed, so that a consumer's
// copy is a fast map clone plus a deep copy of just those values.
type stored struct {
	msg           protocol.Message
	nestedHeaders []string
	nestedExtra   []string
}

// importMap copies m with protocol.ToValueStrict and lists the keys holding
// containers. Values that already have a protocol type, the usual case,
// make the copy a plain map clone.
func importMap(m map[string]any, what string) (map[string]any, []string, error) {
	if m == nil {
		return nil, nil, nil
	}
	var nested []string
	convert := false
	for k, v := range m {
		switch v.(type) {
		case nil, bool, string, int64, float64, time.Time,
			protocol.Date, protocol.TimeOfDay, protocol.Decimal, protocol.UUID:
		case []any, map[string]any, []byte, *big.Int:
			nested = append(nested, k)
		default:
			convert = true
		}
	}
	out := maps.Clone(m)
	if convert {
		nested = nested[:0]
		for k, v := range m {
			nv, err := protocol.ToValueStrict(v)
			if err != nil {
				return nil, nil, fmt.Errorf("memory: %s %q: %w", what, k, err)
			}
			out[k] = nv
			switch nv.(type) {
			case []any, map[string]any, []byte, *big.Int:
				nested = append(nested, k)
			}
		}
		return out, nested, nil
	}
	for _, k := range nested {
		nv, err := protocol.ToValueStrict(m[k])
		if err != nil {
			return nil, nil, fmt.Errorf("memory: %s %q: %w", what, k, err)
		}
		out[k] = nv
	}
	return out, nested, nil
}

// exportMessage returns a deep copy of the broker's message for a consumer,
// so that nothing the consumer does to it reaches the broker or other
// consumers.
func exportMessage(s *stored) protocol.Message {
	out := s.msg
	out.Headers = exportMap(s.msg.Headers, s.nestedHeaders)
	out.Properties.Extra = exportMap(s.msg.Properties.Extra, s.nestedExtra)
	out.Body = cloneBytes(s.msg.Body)
	return out
}

func exportMap(m map[string]any, nested []string) map[string]any {
	if m == nil {
		return nil
	}
	out := maps.Clone(m)
	for _, k := range nested {
		out[k] = cloneValue(m[k])
	}
	return out
}

func cloneMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = cloneValue(e)
		}
		return out
	case map[string]any:
		return cloneMap(x)
	case []byte:
		return cloneBytes(x)
	case *big.Int:
		return new(big.Int).Set(x)
	}
	return v
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
