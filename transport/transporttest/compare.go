package transporttest

import (
	"bytes"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// equalValue compares two protocol values strictly by type and value, except
// that a nil slice or map equals an empty one: no wire format tells them
// apart.
func equalValue(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		return equalMap(x, y, nil)
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case *big.Int:
		y, ok := b.(*big.Int)
		return ok && x.Cmp(y) == 0
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	}
	return reflect.DeepEqual(a, b)
}

// equalMap compares maps with equalValue, ignoring the keys ignore accepts.
func equalMap(a, b map[string]any, ignore func(string) bool) bool {
	return len(diffMap("", a, b, ignore)) == 0
}

func diffMap(what string, want, got map[string]any, ignore func(string) bool) []string {
	var out []string
	keys := make([]string, 0, len(want)+len(got))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if ignore != nil && ignore(k) {
			continue
		}
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !gok:
			out = append(out, fmt.Sprintf("%s%q missing (want %#v)", what, k, w))
		case !wok:
			out = append(out, fmt.Sprintf("%s%q unexpected: %#v", what, k, g))
		case !equalValue(w, g):
			out = append(out, fmt.Sprintf("%s%q: want %#v (%T), got %#v (%T)", what, k, w, w, g, g))
		}
	}
	return out
}

// redeliveryKey reports the header keys a broker may add when it redelivers
// or dead-letters a message: kombu's Redis "redelivered" and RabbitMQ's
// x-death family.
func redeliveryKey(k string) bool {
	return k == "redelivered" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// diffMessage lists the differences between the message published (want)
// and the one delivered (got). Header keys ignore accepts are skipped;
// Properties.Extra is compared only when extra is set, and then only the
// keys want has.
func diffMessage(want, got protocol.Message, ignore func(string) bool, extra bool) string {
	var out []string
	if want.ContentType != got.ContentType {
		out = append(out, fmt.Sprintf("ContentType: want %q, got %q", want.ContentType, got.ContentType))
	}
	if want.ContentEncoding != got.ContentEncoding {
		out = append(out, fmt.Sprintf("ContentEncoding: want %q, got %q", want.ContentEncoding, got.ContentEncoding))
	}
	out = append(out, diffMap("header ", want.Headers, got.Headers, ignore)...)
	wp, gp := want.Properties, got.Properties
	if wp.CorrelationID != gp.CorrelationID {
		out = append(out, fmt.Sprintf("CorrelationID: want %q, got %q", wp.CorrelationID, gp.CorrelationID))
	}
	if wp.ReplyTo != gp.ReplyTo {
		out = append(out, fmt.Sprintf("ReplyTo: want %q, got %q", wp.ReplyTo, gp.ReplyTo))
	}
	if wp.DeliveryMode != gp.DeliveryMode {
		out = append(out, fmt.Sprintf("DeliveryMode: want %d, got %d", wp.DeliveryMode, gp.DeliveryMode))
	}
	if wp.Priority != gp.Priority {
		out = append(out, fmt.Sprintf("Priority: want %d, got %d", wp.Priority, gp.Priority))
	}
	if wp.Expiration != gp.Expiration {
		out = append(out, fmt.Sprintf("Expiration: want %q, got %q", wp.Expiration, gp.Expiration))
	}
	if extra {
		for k, w := range wp.Extra {
			if g, ok := gp.Extra[k]; !ok || !equalValue(w, g) {
				out = append(out, fmt.Sprintf("Properties.Extra[%q]: want %#v, got %#v (present: %v)", k, w, g, ok))
			}
		}
	}
	if !bytes.Equal(want.Body, got.Body) {
		out = append(out, fmt.Sprintf("Body: want %d bytes %q, got %d bytes %q", len(want.Body), clip(want.Body), len(got.Body), clip(got.Body)))
	}
	return strings.Join(out, "\n")
}

func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
