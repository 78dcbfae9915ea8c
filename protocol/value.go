package protocol

import (
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"time"
)

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
	// Python keeps microseconds; finer Nanosecond values are truncated when
	// the value is written.
	TimeOfDay struct {
		Hour, Minute, Second, Nanosecond int
	}
	// Decimal is a decimal number kept as its exact text (Python Decimal).
	Decimal string
	// UUID is a 16-byte UUID (Python uuid.UUID).
	UUID [16]byte
)

// String returns d as Python's date.isoformat() does: YYYY-MM-DD.
func (d Date) String() string {
	return string(d.appendISO(make([]byte, 0, 10)))
}

func (d Date) appendISO(b []byte) []byte {
	b = appendInt(b, d.Year, 4)
	b = append(b, '-')
	b = appendInt(b, int(d.Month), 2)
	b = append(b, '-')
	return appendInt(b, d.Day, 2)
}

// valid reports whether d names a real calendar day in Python's range
// (years 1 to 9999).
func (d Date) valid() bool {
	if d.Year < 1 || d.Year > 9999 || d.Month < 1 || d.Month > 12 || d.Day < 1 {
		return false
	}
	return d.Day <= daysIn(d.Month, d.Year)
}

// ParseDate parses YYYY-MM-DD. Like kombu's typed "date" decoder
// (datetime.fromisoformat(s).date()) it also accepts a full datetime and
// keeps its date part, and it accepts the date part of kombu 5.2's output
// for dates ("2024-01-02T00:00:00").
func ParseDate(s string) (Date, error) {
	if len(s) == 10 {
		d, ok := parseDatePart(s)
		if !ok {
			return Date{}, fmt.Errorf("protocol: invalid date %q", s)
		}
		return d, nil
	}
	t, err := ParseTime(s)
	if err != nil {
		return Date{}, fmt.Errorf("protocol: invalid date %q", s)
	}
	return Date{Year: t.Year(), Month: t.Month(), Day: t.Day()}, nil
}

// parseDatePart parses exactly "YYYY-MM-DD".
func parseDatePart(s string) (Date, bool) {
	if len(s) != 10 || s[4] != '-' || s[7] != '-' {
		return Date{}, false
	}
	y, ok1 := atoiFixed(s[0:4])
	m, ok2 := atoiFixed(s[5:7])
	d, ok3 := atoiFixed(s[8:10])
	date := Date{Year: y, Month: time.Month(m), Day: d}
	if !ok1 || !ok2 || !ok3 || !date.valid() {
		return Date{}, false
	}
	return date, true
}

// String returns t as Python's time.isoformat() does: HH:MM:SS, plus
// .ffffff when the microseconds are not zero.
func (t TimeOfDay) String() string {
	return string(t.appendISO(make([]byte, 0, 15)))
}

func (t TimeOfDay) appendISO(b []byte) []byte {
	b = appendInt(b, t.Hour, 2)
	b = append(b, ':')
	b = appendInt(b, t.Minute, 2)
	b = append(b, ':')
	b = appendInt(b, t.Second, 2)
	if us := t.Nanosecond / 1000; us != 0 {
		b = append(b, '.')
		b = appendInt(b, us, 6)
	}
	return b
}

func (t TimeOfDay) valid() bool {
	return t.Hour >= 0 && t.Hour < 24 && t.Minute >= 0 && t.Minute < 60 &&
		t.Second >= 0 && t.Second < 60 && t.Nanosecond >= 0 && t.Nanosecond < 1e9
}

// ParseTimeOfDay parses what Python's time.fromisoformat accepts in practice:
// HH:MM, HH:MM:SS or HH:MM:SS.f (digits past nanoseconds are dropped). A
// UTC offset is
// rejected: TimeOfDay has no zone, and dropping it silently would change
// the value's meaning.
func ParseTimeOfDay(s string) (TimeOfDay, error) {
	t, rest, ok := parseClock(s)
	if !ok || rest != "" {
		return TimeOfDay{}, fmt.Errorf("protocol: invalid time of day %q", s)
	}
	return t, nil
}

// parseClock parses HH:MM[:SS[(.|,)f+]] at the start of s and returns the
// rest.
func parseClock(s string) (TimeOfDay, string, bool) {
	var t TimeOfDay
	if len(s) < 5 || s[2] != ':' {
		return t, s, false
	}
	var ok1, ok2 bool
	t.Hour, ok1 = atoiFixed(s[0:2])
	t.Minute, ok2 = atoiFixed(s[3:5])
	if !ok1 || !ok2 {
		return t, s, false
	}
	s = s[5:]
	if len(s) >= 3 && s[0] == ':' {
		sec, ok := atoiFixed(s[1:3])
		if !ok {
			return t, s, false
		}
		t.Second = sec
		s = s[3:]
		if len(s) > 0 && (s[0] == '.' || s[0] == ',') {
			n := 1
			for n < len(s) && s[n] >= '0' && s[n] <= '9' {
				n++
			}
			digits := n - 1
			if digits == 0 {
				return t, s, false
			}
			// Digits beyond nanoseconds are dropped, as Python drops
			// those beyond microseconds.
			frac, _ := atoiFixed(s[1:min(n, 10)])
			for i := digits; i < 9; i++ {
				frac *= 10
			}
			t.Nanosecond = frac
			s = s[n:]
		}
	}
	return t, s, t.valid()
}

// String returns d's text.
func (d Decimal) String() string { return string(d) }

// ParseDecimal checks s against the syntax Python's Decimal() accepts
// (sign, digits with an optional point, exponent, Infinity/Inf, NaN and
// sNaN with optional payload digits, case-insensitive names) and returns it
// unchanged. Python also strips surrounding whitespace and accepts
// underscores between digits; kombu never writes either, so they are
// refused here.
func ParseDecimal(s string) (Decimal, error) {
	if !validDecimal(s) {
		return "", fmt.Errorf("protocol: invalid decimal %q", s)
	}
	return Decimal(s), nil
}

func validDecimal(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	if c := s[0] | 0x20; c == 'i' || c == 'n' || c == 's' {
		return validDecimalSpecial(s)
	}
	digits := 0
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
		digits++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isDigit(s[i]) {
			i++
			digits++
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i]|0x20) == 'e' {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == start {
			return false
		}
	}
	return i == len(s)
}

func validDecimalSpecial(s string) bool {
	lower := make([]byte, len(s))
	for i := 0; i < len(s); i++ {
		lower[i] = s[i] | 0x20
	}
	switch l := string(lower); {
	case l == "inf" || l == "infinity":
		return true
	case len(l) >= 3 && l[:3] == "nan":
		return allDigits(s[3:])
	case len(l) >= 4 && l[:4] == "snan":
		return allDigits(s[4:])
	}
	return false
}

// String returns u in the canonical 8-4-4-4-12 lower-case form, as
// Python's str(uuid) does.
// UUID4 makes a version 4 (random) UUID from 16 random bytes, which the
// caller supplies (protocol reads no random source): the form Celery uses for
// task ids and kombu for delivery tags.
func UUID4(random [16]byte) UUID {
	random[6] = random[6]&0x0f | 0x40
	random[8] = random[8]&0x3f | 0x80
	return UUID(random)
}

func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:])
}

// Hex returns u as 32 lower-case hex digits, as Python's uuid.hex does (and
// as kombu's typed "uuid" envelope carries it).
func (u UUID) Hex() string { return hex.EncodeToString(u[:]) }

// ParseUUID parses a UUID the way Python's uuid.UUID(hex) does: it removes
// "urn:" and "uuid:", surrounding braces and all hyphens, then needs exactly
// 32 hex digits (either case).
func ParseUUID(s string) (UUID, error) {
	var u UUID
	h := strings.ReplaceAll(s, "urn:", "")
	h = strings.ReplaceAll(h, "uuid:", "")
	h = strings.Trim(h, "{}")
	var buf [32]byte
	n := 0
	for i := 0; i < len(h); i++ {
		if h[i] == '-' {
			continue
		}
		if n == 32 {
			return u, fmt.Errorf("protocol: invalid UUID %q", s)
		}
		buf[n] = h[i]
		n++
	}
	if n != 32 {
		return u, fmt.Errorf("protocol: invalid UUID %q", s)
	}
	if _, err := hex.Decode(u[:], buf[:]); err != nil {
		return u, fmt.Errorf("protocol: invalid UUID %q", s)
	}
	return u, nil
}

// withVersion sets the RFC 4122 variant and the version bits, as Python's
// uuid.UUID(hex=..., version=v) does.
func (u UUID) withVersion(v int64) (UUID, error) {
	if v < 1 || v > 5 {
		return u, errors.New("protocol: UUID version must be 1 to 5")
	}
	u[8] = u[8]&0x3f | 0x80
	u[6] = u[6]&0x0f | byte(v)<<4
	return u, nil
}

// appendInt appends n in decimal, zero-padded to width digits. Negative
// numbers keep their sign before the padding.
func appendInt(b []byte, n, width int) []byte {
	if n < 0 {
		b = append(b, '-')
		n = -n
	}
	var tmp [20]byte
	s := strconv.AppendInt(tmp[:0], int64(n), 10)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// atoiFixed parses a run of ASCII digits (no sign), at most 9 of them.
func atoiFixed(s string) (int, bool) {
	if s == "" || len(s) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func isLeap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

func daysIn(m time.Month, y int) int {
	switch m {
	case time.February:
		if isLeap(y) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}

// ToValue converts a Go value into the package's value types (see the
// package documentation), so that handler results of any type can be
// encoded, compared and rendered alike:
//
//   - value types are returned as they are; []any and map[string]any are
//     copied with their elements converted;
//   - every Go integer type becomes int64 (*big.Int above the int64
//     range), float32 becomes the float64 with the same shortest digits;
//   - a nil pointer, slice, map or interface becomes nil;
//   - json.Marshaler output and json.Number are decoded with [DecodeJSON];
//   - encoding.TextMarshaler becomes its text;
//   - pointers and interfaces are followed; slices and arrays become
//     []any ([]byte for byte elements); maps with string keys become
//     map[string]any;
//   - structs and maps with other keys go through encoding/json and are
//     decoded back, so their json tags apply. encoding/json writes a
//     float64 with no fraction as an integer, so such a struct field comes
//     back as int64.
//
// Channels, functions, complex numbers and unsafe pointers are errors. A
// []byte is returned as it is, not copied; see [ToValueStrict] for a result
// that shares no memory with v.
func ToValue(v any) (any, error) { return toValue(v, 0) }

// ToValueStrict converts v as [ToValue] does, except that it has no
// encoding/json fallback: a struct, or a map whose keys are not strings, is
// an error wrapping [ErrUnencodable] (a type's own MarshalJSON or
// MarshalText still applies). A JSON-based transport would carry such a
// value as whatever encoding/json makes of it, AMQP headers not at all, so
// a stand-in for a broker (an in-memory transport) refuses it. The result
// shares no memory with v: a []byte is copied too.
func ToValueStrict(v any) (any, error) { return convertValue(v, 0, true) }

func toValue(v any, depth int) (any, error) { return convertValue(v, depth, false) }

// convertValue is ToValue, or with strict ToValueStrict.
func convertValue(v any, depth int, strict bool) (any, error) {
	if depth > maxEncodeDepth {
		return nil, errEncodeDepth
	}
	switch x := v.(type) {
	case nil, bool, int64, float64, string, time.Time, Date, TimeOfDay, Decimal, UUID:
		return x, nil
	case *big.Int:
		if x == nil {
			return nil, nil
		}
		if x.IsInt64() {
			return x.Int64(), nil
		}
		return new(big.Int).Set(x), nil
	case []byte:
		if x == nil {
			return nil, nil
		}
		if strict {
			return append(make([]byte, 0, len(x)), x...), nil
		}
		return x, nil
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint:
		return uintValue(uint64(x)), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return uintValue(x), nil
	case float32:
		return float32Value(x), nil
	case json.Number:
		n, err := DecodeJSON([]byte(x), DecodeOptions{})
		switch n.(type) {
		case int64, float64, *big.Int:
			return n, nil
		}
		return nil, fmt.Errorf("%w: json.Number %q is not a number (%v)", ErrUnencodable, string(x), err)
	case []any:
		if x == nil {
			return nil, nil
		}
		out := make([]any, len(x))
		for i, el := range x {
			var err error
			if out[i], err = convertValue(el, depth+1, strict); err != nil {
				return nil, err
			}
		}
		return out, nil
	case map[string]any:
		if x == nil {
			return nil, nil
		}
		out := make(map[string]any, len(x))
		for k, el := range x {
			nv, err := convertValue(el, depth+1, strict)
			if err != nil {
				return nil, err
			}
			out[k] = nv
		}
		return out, nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil, nil
		}
		// A pointer to a value type means the value (*time.Time would
		// otherwise take its MarshalJSON and lose the isoformat text).
		switch elem := rv.Elem().Interface().(type) {
		case time.Time, Date, TimeOfDay, Decimal, UUID:
			return elem, nil
		}
	}
	switch x := v.(type) {
	case json.Marshaler:
		data, err := x.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%w: %T: %w", ErrUnencodable, v, err)
		}
		return decodeFallbackJSON(v, data)
	case encoding.TextMarshaler:
		text, err := x.MarshalText()
		if err != nil {
			return nil, fmt.Errorf("%w: %T: %w", ErrUnencodable, v, err)
		}
		return string(text), nil
	}
	switch rv.Kind() {
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return uintValue(rv.Uint()), nil
	case reflect.Float32:
		return float32Value(float32(rv.Float())), nil
	case reflect.Float64:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Pointer, reflect.Interface:
		return convertValue(rv.Elem().Interface(), depth+1, strict)
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			b := make([]byte, rv.Len())
			reflect.Copy(reflect.ValueOf(b), rv)
			return b, nil
		}
		out := make([]any, rv.Len())
		for i := range out {
			var err error
			if out[i], err = convertValue(rv.Index(i).Interface(), depth+1, strict); err != nil {
				return nil, err
			}
		}
		return out, nil
	case reflect.Map:
		if rv.IsNil() {
			return nil, nil
		}
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		out := make(map[string]any, rv.Len())
		iter := rv.MapRange()
		for iter.Next() {
			nv, err := convertValue(iter.Value().Interface(), depth+1, strict)
			if err != nil {
				return nil, err
			}
			out[iter.Key().String()] = nv
		}
		return out, nil
	case reflect.Struct:
	default:
		return nil, fmt.Errorf("%w: type %T", ErrUnencodable, v)
	}
	if strict {
		return nil, fmt.Errorf("%w: type %T (ToValueStrict does not fall back to encoding/json)", ErrUnencodable, v)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %T: %w", ErrUnencodable, v, err)
	}
	return decodeFallbackJSON(v, data)
}

func decodeFallbackJSON(v any, data []byte) (any, error) {
	out, err := DecodeJSON(data, DecodeOptions{MaxBodySize: math.MaxInt, MaxDepth: MaxDepthLimit})
	if err != nil {
		return nil, fmt.Errorf("%w: %T: %w", ErrUnencodable, v, err)
	}
	return out, nil
}

func uintValue(u uint64) any {
	if u > math.MaxInt64 {
		return new(big.Int).SetUint64(u)
	}
	return int64(u)
}

// float32Value widens f keeping its shortest decimal digits: float32(0.1)
// becomes 0.1, which is what the caller meant, not 0.10000000149011612.
func float32Value(f float32) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	return v
}

// maxCommonValueLen is the length of the longest value commonValue knows.
const maxCommonValueLen = 21

// commonValue returns string values found in most Celery messages (the
// language, empty reprs, kombu's encodings and content types, Celery's
// default queue) as constant interface values, which cost no allocation.
func commonValue(b []byte) (any, bool) {
	switch string(b) {
	case "":
		return "", true
	case "py":
		return "py", true
	case "{}":
		return "{}", true
	case "()":
		return "()", true
	case "[]":
		return "[]", true
	case "base64":
		return "base64", true
	case "utf-8":
		return "utf-8", true
	case "binary":
		return "binary", true
	case "celery":
		return "celery", true
	case "application/json":
		return "application/json", true
	case "application/x-msgpack":
		return "application/x-msgpack", true
	}
	return nil, false
}

// maxCommonKeyLen is the length of the longest key commonKey knows.
const maxCommonKeyLen = 16

// commonKey returns the keys of Celery's task bodies, signatures,
// envelopes and result documents as constant strings, so decoders need not
// allocate a string for each of them in every message.
func commonKey(b []byte) (string, bool) {
	switch string(b) { // no allocation: the compiler compares in place
	case "args":
		return "args", true
	case "kwargs":
		return "kwargs", true
	case "callbacks":
		return "callbacks", true
	case "errbacks":
		return "errbacks", true
	case "chain":
		return "chain", true
	case "chord":
		return "chord", true
	case "task":
		return "task", true
	case "options":
		return "options", true
	case "subtask_type":
		return "subtask_type", true
	case "immutable":
		return "immutable", true
	case "task_id":
		return "task_id", true
	case "reply_to":
		return "reply_to", true
	case "group_id":
		return "group_id", true
	case "group_index":
		return "group_index", true
	case "root_id":
		return "root_id", true
	case "parent_id":
		return "parent_id", true
	case "priority":
		return "priority", true
	case "queue":
		return "queue", true
	case "link":
		return "link", true
	case "link_error":
		return "link_error", true
	case "chord_size":
		return "chord_size", true
	case "status":
		return "status", true
	case "result":
		return "result", true
	case "traceback":
		return "traceback", true
	case "children":
		return "children", true
	case "date_done":
		return "date_done", true
	case "exc_type":
		return "exc_type", true
	case "exc_message":
		return "exc_message", true
	case "exc_module":
		return "exc_module", true
	case "body":
		return "body", true
	case "headers":
		return "headers", true
	case "properties":
		return "properties", true
	case "content-type":
		return "content-type", true
	case "content-encoding":
		return "content-encoding", true
	case "correlation_id":
		return "correlation_id", true
	case "delivery_mode":
		return "delivery_mode", true
	case "delivery_info":
		return "delivery_info", true
	case "delivery_tag":
		return "delivery_tag", true
	case "body_encoding":
		return "body_encoding", true
	case "exchange":
		return "exchange", true
	case "routing_key":
		return "routing_key", true
	case "lang":
		return "lang", true
	case "id":
		return "id", true
	case "shadow":
		return "shadow", true
	case "eta":
		return "eta", true
	case "expires":
		return "expires", true
	case "group":
		return "group", true
	case "retries":
		return "retries", true
	case "timelimit":
		return "timelimit", true
	case "argsrepr":
		return "argsrepr", true
	case "kwargsrepr":
		return "kwargsrepr", true
	case "origin":
		return "origin", true
	case "ignore_result":
		return "ignore_result", true
	case "__type__":
		return "__type__", true
	case "__value__":
		return "__value__", true
	case "hex":
		return "hex", true
	case "tasks":
		return "tasks", true
	}
	return "", false
}
