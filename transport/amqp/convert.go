package amqp

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/internal/headers"
)

// Conversions between amqp091's field-table values and the protocol package's
// value types. Both directions are pure and fuzzed.
//
// Reading (broker → celeriac): every integer type becomes int64, float32
// becomes float64, tables become map[string]any, arrays []any, decimals
// protocol.Decimal (exact text), timestamps time.Time in UTC, void nil, byte
// arrays []byte. A long string ('S') that is not valid UTF-8 becomes []byte:
// py-amqp writes Python bytes as 'S' and reads an 'S' that does not decode
// as UTF-8 back as bytes, so that is the value a Python worker would see.
//
// Writing (celeriac → broker) emits only the field types py-amqp reads back
// as the same value: integers as 'I' (int32) when they fit, otherwise 'l'
// (int64); float64 'd', and float32 'd' too, as the float64 with its shortest
// digits (float32(0.1) is written as 0.1, not 0.10000000149011612, as
// protocol.ToValue widens it and the Redis envelope's JSON carries it; a
// float32 read from the broker, 'f', is widened exactly, as py-amqp reads
// it); bool 't'; string 'S'; []byte 'x', or 'S' when it is
// not valid UTF-8 (py-amqp reads both as bytes, and 'S' is what such a value
// arrived as, so a header read and re-published keeps its bytes and its
// tag); decimals 'D';
// times 'T' (whole seconds, as AMQP timestamps are); maps 'F'; slices 'A';
// nil 'V'. amqp091's narrower integer types are never written because py-amqp
// reads 'b', 'B' and 's' differently from the AMQP errata. Known remaining
// difference: py-amqp reads 'l' as unsigned, so a negative integer below
// -2^31 reaches Python as a large positive number (py-amqp itself writes such
// values with its own tag 'L', which other AMQP clients cannot read).
// Integers beyond int64 (*big.Int) have no AMQP field type and are refused
// with an error, as are the protocol types with no AMQP counterpart (Date,
// TimeOfDay, UUID): a header must not silently change type on the way out.
// NaN and the infinities are refused too: RabbitMQ cannot parse them and
// closes the connection (see headers.CheckFinite). Every refusal wraps
// protocol.ErrUnencodable: sending the same message again cannot help, and
// the worker's settle steps do not try.

// maxValueDepth bounds the nesting of converted values; amqp091 itself
// refuses tables nested deeper than 32 levels.
const maxValueDepth = 64

// errValueDepth is returned for values nested deeper than maxValueDepth,
// errEncodeDepth when such a value is to be sent.
var (
	errValueDepth  = errors.New("amqp: header value nested too deeply")
	errEncodeDepth = fmt.Errorf("%w: header value nested too deeply", protocol.ErrUnencodable)
)

// fromTable converts an amqp091 header table to protocol values.
func fromTable(t amqp091.Table) (map[string]any, error) {
	if t == nil {
		return nil, nil
	}
	return fromTableDepth(t, 0)
}

// fromDeliveryTable converts the header table of a received delivery in
// place: it is the delivery's own (amqp091 reads a new one for every
// message), and most of its values are already what protocol holds, so
// neither a second map nor a second box for each of them is needed.
func fromDeliveryTable(t amqp091.Table) (map[string]any, error) {
	if t == nil {
		return nil, nil
	}
	for k, v := range t {
		switch v := v.(type) {
		case nil, bool, float64, int64, []byte:
			continue
		case string:
			if utf8.ValidString(v) {
				continue
			}
		}
		cv, err := fromField(v, 0)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		t[k] = cv
	}
	return t, nil
}

func fromTableDepth(t amqp091.Table, depth int) (map[string]any, error) {
	if depth > maxValueDepth {
		return nil, errValueDepth
	}
	m := make(map[string]any, len(t))
	for k, v := range t {
		cv, err := fromField(v, depth)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		m[k] = cv
	}
	return m, nil
}

func fromField(v any, depth int) (any, error) {
	// Values kept as they are return v itself: boxing the switch's copy
	// again would allocate.
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		if !utf8.ValidString(x) {
			return []byte(x), nil
		}
		return v, nil
	case bool, float64, int64, []byte:
		return v, nil
	case int32:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case time.Time:
		return x.UTC(), nil
	case amqp091.Decimal:
		return decimalText(x), nil
	case amqp091.Table:
		return fromTableDepth(x, depth+1)
	case map[string]any:
		return fromTableDepth(amqp091.Table(x), depth+1)
	case []any:
		if depth+1 > maxValueDepth {
			return nil, errValueDepth
		}
		out := make([]any, len(x))
		for i, e := range x {
			ce, err := fromField(e, depth+1)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = ce
		}
		return out, nil
	}
	return nil, fmt.Errorf("amqp: unsupported field value type %T", v)
}

// decimalText renders an AMQP decimal (value × 10^-scale) exactly, as
// Python's str(Decimal) does for the values py-amqp produces.
func decimalText(d amqp091.Decimal) protocol.Decimal {
	neg := d.Value < 0
	mag := strconv.FormatInt(int64(d.Value), 10)
	if neg {
		mag = mag[1:]
	}
	scale := int(d.Scale)
	if scale > 0 {
		if len(mag) <= scale {
			mag = strings.Repeat("0", scale-len(mag)+1) + mag
		}
		mag = mag[:len(mag)-scale] + "." + mag[len(mag)-scale:]
	}
	if neg {
		mag = "-" + mag
	}
	return protocol.Decimal(mag)
}

// decimalField parses decimal text into an AMQP decimal. AMQP decimals hold
// an int32 and a scale up to 255; other values are refused.
func decimalField(s protocol.Decimal) (amqp091.Decimal, error) {
	text := string(s)
	bad := func() (amqp091.Decimal, error) {
		return amqp091.Decimal{}, fmt.Errorf("%w: decimal %q does not fit an AMQP decimal (int32 × 10^-scale)", protocol.ErrUnencodable, text)
	}
	t := text
	neg := false
	if t != "" && (t[0] == '-' || t[0] == '+') {
		neg = t[0] == '-'
		t = t[1:]
	}
	exp := 0
	if i := strings.IndexAny(t, "eE"); i >= 0 {
		e, err := strconv.Atoi(t[i+1:])
		if err != nil || e > 1000 || e < -1000 {
			return bad()
		}
		exp = e
		t = t[:i]
	}
	intPart, frac, _ := strings.Cut(t, ".")
	digits := intPart + frac
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return bad()
	}
	scale := len(frac) - exp
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		digits = "0"
	}
	if len(digits) > 10 {
		return bad()
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return bad()
	}
	for ; scale < 0; scale++ {
		v *= 10
		if v > math.MaxInt32 {
			return bad()
		}
	}
	if neg {
		v = -v
	}
	if v > math.MaxInt32 || v < math.MinInt32 || scale > math.MaxUint8 {
		return bad()
	}
	return amqp091.Decimal{Scale: uint8(scale), Value: int32(v)}, nil
}

// toTable converts protocol header values to an amqp091 table.
func toTable(m map[string]any) (amqp091.Table, error) {
	if m == nil {
		return nil, nil
	}
	return toTableDepth(m, 0)
}

func toTableDepth(m map[string]any, depth int) (amqp091.Table, error) {
	if depth > maxValueDepth {
		return nil, errEncodeDepth
	}
	t := make(amqp091.Table, len(m))
	for k, v := range m {
		if len(k) > 255 {
			return nil, fmt.Errorf("%w: header name longer than 255 bytes (%d bytes, starting %.40q)", protocol.ErrUnencodable, len(k), k)
		}
		fv, err := toField(v, depth)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		t[k] = fv
	}
	return t, nil
}

func toField(v any, depth int) (any, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case []byte:
		if !utf8.Valid(v) {
			return string(v), nil
		}
		return v, nil
	case bool, string:
		return v, nil
	case float64:
		if err := headers.Float(v); err != nil {
			return nil, err
		}
		return v, nil
	case float32:
		f, _ := protocol.ToValue(v) // a float64, never an error
		if err := headers.Float(f.(float64)); err != nil {
			return nil, err
		}
		return f, nil
	case int:
		return intField(int64(v)), nil
	case int8:
		return int32(v), nil
	case int16:
		return int32(v), nil
	case int32:
		return v, nil
	case int64:
		return intField(v), nil
	case uint8:
		return int32(v), nil
	case uint16:
		return int32(v), nil
	case uint32:
		return intField(int64(v)), nil
	case uint:
		if uint64(v) > math.MaxInt64 {
			return nil, fmt.Errorf("%w: integer %d does not fit int64", protocol.ErrUnencodable, v)
		}
		return intField(int64(v)), nil
	case uint64:
		if v > math.MaxInt64 {
			return nil, fmt.Errorf("%w: integer %d does not fit int64", protocol.ErrUnencodable, v)
		}
		return intField(int64(v)), nil
	case *big.Int:
		if v == nil {
			return nil, nil
		}
		if !v.IsInt64() {
			return nil, fmt.Errorf("%w: integer %s does not fit int64 (AMQP has no wider integer)", protocol.ErrUnencodable, v)
		}
		return intField(v.Int64()), nil
	case time.Time:
		return v.UTC().Truncate(time.Second), nil
	case protocol.Decimal:
		return decimalField(v)
	case amqp091.Decimal:
		return v, nil
	case map[string]any:
		return toTableDepth(v, depth+1)
	case amqp091.Table:
		return toTableDepth(v, depth+1)
	case map[string]string:
		t := make(amqp091.Table, len(v))
		for k, s := range v {
			t[k] = s
		}
		return t, nil
	case []string:
		a := make([]any, len(v))
		for i, s := range v {
			a[i] = s
		}
		return a, nil
	case []any:
		if depth+1 > maxValueDepth {
			return nil, errEncodeDepth
		}
		a := make([]any, len(v))
		for i, e := range v {
			fe, err := toField(e, depth+1)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			a[i] = fe
		}
		return a, nil
	}
	return nil, fmt.Errorf("%w: header value of type %T has no AMQP field type", protocol.ErrUnencodable, v)
}

// intField picks the narrowest integer type py-amqp reads back unchanged.
func intField(v int64) any {
	if v >= math.MinInt32 && v <= math.MaxInt32 {
		return int32(v)
	}
	return v
}

// AMQP basic properties that protocol.Properties keeps in Extra, under
// kombu's names.
const (
	propMessageID = "message_id"
	propTimestamp = "timestamp"
	propType      = "type"
	propUserID    = "user_id"
	propAppID     = "app_id"
)

// messageFromDelivery converts what the broker delivered into a
// protocol.Message. The body is not copied: amqp091 allocates it per
// delivery.
func messageFromDelivery(d *amqp091.Delivery) (protocol.Message, error) {
	h, err := fromDeliveryTable(d.Headers)
	if err != nil {
		return protocol.Message{}, err
	}
	m := protocol.Message{
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		Headers:         h,
		Body:            d.Body,
		Properties: protocol.Properties{
			CorrelationID: d.CorrelationId,
			ReplyTo:       d.ReplyTo,
			DeliveryMode:  d.DeliveryMode,
			Priority:      int(d.Priority),
			Expiration:    d.Expiration,
		},
	}
	extra := func(k string, v any) {
		if m.Properties.Extra == nil {
			m.Properties.Extra = make(map[string]any, 2)
		}
		m.Properties.Extra[k] = v
	}
	if d.MessageId != "" {
		extra(propMessageID, d.MessageId)
	}
	if !d.Timestamp.IsZero() {
		extra(propTimestamp, d.Timestamp.UTC())
	}
	if d.Type != "" {
		extra(propType, d.Type)
	}
	if d.UserId != "" {
		extra(propUserID, d.UserId)
	}
	if d.AppId != "" {
		extra(propAppID, d.AppId)
	}
	return m, nil
}

// publishingFromMessage converts a protocol.Message into an amqp091
// Publishing. Extra properties other than message_id, timestamp, type,
// user_id and app_id have no AMQP property to go to and are not sent (on
// AMQP Celery never sets others; Celery 5.2 leaks option names into the
// Redis envelope's properties only).
func publishingFromMessage(m *protocol.Message) (amqp091.Publishing, error) {
	h, err := toTable(m.Headers)
	if err != nil {
		return amqp091.Publishing{}, fmt.Errorf("amqp: %w", err)
	}
	p := m.Properties
	if p.Priority < 0 || p.Priority > math.MaxUint8 {
		return amqp091.Publishing{}, fmt.Errorf("amqp: %w: priority %d outside 0..255", protocol.ErrUnencodable, p.Priority)
	}
	pub := amqp091.Publishing{
		Headers:         h,
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		DeliveryMode:    p.DeliveryMode,
		Priority:        uint8(p.Priority),
		CorrelationId:   p.CorrelationID,
		ReplyTo:         p.ReplyTo,
		Expiration:      p.Expiration,
		Body:            m.Body,
	}
	for k, v := range p.Extra {
		var dst *string
		switch k {
		case propMessageID:
			dst = &pub.MessageId
		case propType:
			dst = &pub.Type
		case propUserID:
			dst = &pub.UserId
		case propAppID:
			dst = &pub.AppId
		case propTimestamp:
			ts, err := timestampProperty(v)
			if err != nil {
				return amqp091.Publishing{}, err
			}
			pub.Timestamp = ts
			continue
		default:
			continue
		}
		s, ok := v.(string)
		if !ok {
			return amqp091.Publishing{}, fmt.Errorf("amqp: %w: property %s must be a string, not %T", protocol.ErrUnencodable, k, v)
		}
		*dst = s
	}
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if len(s) > 255 {
			return amqp091.Publishing{}, fmt.Errorf("amqp: %w: property value longer than 255 bytes (%d bytes, starting %.40q)", protocol.ErrUnencodable, len(s), s)
		}
	}
	return pub, nil
}

func timestampProperty(v any) (time.Time, error) {
	switch v := v.(type) {
	case time.Time:
		return v, nil
	case int64:
		return time.Unix(v, 0), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e15 {
			return time.Time{}, fmt.Errorf("amqp: %w: timestamp property %v out of range", protocol.ErrUnencodable, v)
		}
		return time.Unix(int64(v), 0), nil
	}
	return time.Time{}, fmt.Errorf("amqp: %w: timestamp property must be a time or Unix seconds, not %T", protocol.ErrUnencodable, v)
}
