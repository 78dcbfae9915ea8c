package protocol

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// Decoding bounds.
const (
	// DefaultMaxBodySize is the body size bound used when
	// DecodeOptions.MaxBodySize is zero: 64 MiB.
	DefaultMaxBodySize = 64 << 20
	// DefaultMaxDepth is the nesting bound used when DecodeOptions.MaxDepth
	// is zero.
	DefaultMaxDepth = 256
	// MaxDepthLimit caps DecodeOptions.MaxDepth: larger values are treated
	// as this one, so that no option can let a deeply nested input exhaust
	// the goroutine stack (the decoders recurse once per level).
	MaxDepthLimit = 10000
	// maxIntDigits is Python's default limit on the digits of an integer
	// literal (sys.get_int_max_str_digits, Python 3.11+): Python refuses
	// longer ones, and refusing them here also keeps big-number parsing
	// from going quadratic on hostile input.
	maxIntDigits = 4300
)

func (o DecodeOptions) maxBodySize() int {
	if o.MaxBodySize <= 0 {
		return DefaultMaxBodySize
	}
	return o.MaxBodySize
}

func (o DecodeOptions) maxDepth() int {
	switch {
	case o.MaxDepth <= 0:
		return DefaultMaxDepth
	case o.MaxDepth > MaxDepthLimit:
		return MaxDepthLimit
	}
	return o.MaxDepth
}

// DecodeJSON parses a JSON document as Python's json module and kombu do
// and returns it as the package's value types (see the package
// documentation):
//
//   - integers become int64, or *big.Int outside the int64 range (at most
//     4300 digits, Python's own limit);
//   - numbers with a fraction or exponent become float64; NaN, Infinity
//     and -Infinity (which Python writes) are accepted;
//   - strings may use every JSON escape, surrogate pairs included; a lone
//     surrogate escape, which Go strings cannot hold, becomes U+FFFD;
//     invalid UTF-8 and raw control characters are errors, as in Python;
//   - objects become map[string]any and a repeated key keeps its last
//     value, as in Python;
//   - an object whose keys are exactly "__type__" and "__value__" is a
//     kombu ≥5.3 typed value and is converted: datetime → time.Time (naive
//     values as UTC), date → Date, time → TimeOfDay, decimal → Decimal,
//     uuid → UUID, bytes and base64 → []byte. An unknown type is an error,
//     as it is in kombu.
//
// Input longer than opts.MaxBodySize fails with an error wrapping
// ErrTooLarge, nesting deeper than opts.MaxDepth with one wrapping
// ErrTooDeep. Anything but whitespace after the value is an error.
func DecodeJSON(data []byte, opts DecodeOptions) (any, error) {
	if len(data) > opts.maxBodySize() {
		return nil, fmt.Errorf("%w: json document of %d bytes exceeds %d", ErrTooLarge, len(data), opts.maxBodySize())
	}
	var scratch decodeScratch
	d := jsonDecoder{data: data, maxDepth: opts.maxDepth(), vals: scratch.vals[:0], keys: scratch.keys[:0]}
	d.skipSpace()
	v, err := d.value()
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return nil, d.syntaxError("extra data after the value")
	}
	return v, nil
}

// decodeScratch gives the decoders' element stacks a starting capacity
// that covers typical Celery bodies without growing.
type decodeScratch struct {
	vals [16]any
	keys [8]string
}

// jsonDecoder is a recursive-descent parser over a byte slice. The
// recursion is bounded by maxDepth (itself capped by MaxDepthLimit).
type jsonDecoder struct {
	data     []byte
	pos      int
	depth    int
	maxDepth int
	// vals and keys are stacks shared by all nesting levels: elements are
	// collected here and copied into an exactly sized slice or map when
	// their container closes, so a container costs one allocation.
	vals []any
	keys []string
	// buf holds a string being unescaped.
	buf []byte
}

func (d *jsonDecoder) syntaxError(msg string) error {
	return fmt.Errorf("protocol: json: %s at offset %d", msg, d.pos)
}

func (d *jsonDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value() (any, error) {
	if d.pos >= len(d.data) {
		return nil, d.syntaxError("unexpected end of input")
	}
	switch c := d.data[d.pos]; c {
	case '{':
		return d.object()
	case '[':
		return d.array()
	case '"':
		return d.str()
	case 'n':
		return nil, d.literal("null")
	case 't':
		return true, d.literal("true")
	case 'f':
		return false, d.literal("false")
	case 'N':
		return math.NaN(), d.literal("NaN")
	case 'I':
		return math.Inf(1), d.literal("Infinity")
	default:
		if c == '-' || isDigit(c) {
			return d.number()
		}
		return nil, d.syntaxError(fmt.Sprintf("unexpected character %q", c))
	}
}

func (d *jsonDecoder) literal(word string) error {
	if len(d.data)-d.pos < len(word) || string(d.data[d.pos:d.pos+len(word)]) != word {
		return d.syntaxError("invalid literal")
	}
	d.pos += len(word)
	return nil
}

func (d *jsonDecoder) enter() error {
	d.depth++
	if d.depth > d.maxDepth {
		return fmt.Errorf("%w: json nesting exceeds %d at offset %d", ErrTooDeep, d.maxDepth, d.pos)
	}
	return nil
}

func (d *jsonDecoder) array() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.pos++ // '['
	mark := len(d.vals)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		d.depth--
		return []any{}, nil
	}
	for {
		d.skipSpace()
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.vals = append(d.vals, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.syntaxError("unterminated array")
		}
		c := d.data[d.pos]
		d.pos++
		if c == ']' {
			break
		}
		if c != ',' {
			d.pos--
			return nil, d.syntaxError("expected ',' or ']'")
		}
	}
	out := make([]any, len(d.vals)-mark)
	copy(out, d.vals[mark:])
	clear(d.vals[mark:])
	d.vals = d.vals[:mark]
	d.depth--
	return out, nil
}

func (d *jsonDecoder) object() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.pos++ // '{'
	vmark, kmark := len(d.vals), len(d.keys)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		d.depth--
		return map[string]any{}, nil
	}
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.syntaxError("expected a string key")
		}
		k, err := d.key()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.syntaxError("expected ':'")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.syntaxError("unterminated object")
		}
		c := d.data[d.pos]
		d.pos++
		if c == '}' {
			break
		}
		if c != ',' {
			d.pos--
			return nil, d.syntaxError("expected ',' or '}'")
		}
	}
	keys, vals := d.keys[kmark:], d.vals[vmark:]
	m := make(map[string]any, len(keys))
	for i, k := range keys {
		m[k] = vals[i] // later duplicates overwrite earlier ones, as in Python
	}
	clear(keys)
	clear(vals)
	d.keys, d.vals = d.keys[:kmark], d.vals[:vmark]
	d.depth--
	if len(m) == 2 {
		if t, ok := m["__type__"]; ok {
			if v, ok := m["__value__"]; ok {
				tv, err := decodeTyped(t, v)
				if err != nil {
					return nil, fmt.Errorf("protocol: json: typed value ending at offset %d: %w", d.pos, err)
				}
				return tv, nil
			}
		}
	}
	return m, nil
}

// decodeTyped converts a kombu ≥5.3 typed envelope, as
// kombu.utils.json.object_hook does.
func decodeTyped(t, v any) (any, error) {
	typ, ok := t.(string)
	if !ok {
		return nil, fmt.Errorf("__type__ is %s, not a string", typeName(t))
	}
	s, isStr := v.(string)
	switch typ {
	case "datetime":
		if isStr {
			return ParseTime(s)
		}
	case "date":
		if isStr {
			return ParseDate(s)
		}
	case "time":
		if isStr {
			return ParseTimeOfDay(s)
		}
	case "decimal":
		if n, ok := v.(int64); ok {
			return Decimal(strconv.FormatInt(n, 10)), nil
		}
		if n, ok := v.(*big.Int); ok {
			return Decimal(n.String()), nil
		}
		if isStr {
			return ParseDecimal(s)
		}
	case "uuid":
		return decodeTypedUUID(v)
	case "bytes":
		if isStr {
			return []byte(s), nil
		}
	case "base64":
		if isStr {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("invalid base64: %w", err)
			}
			return b, nil
		}
	default:
		return nil, fmt.Errorf("unsupported __type__ %q", typ)
	}
	return nil, fmt.Errorf("__type__ %q with a %s __value__", typ, typeName(v))
}

// decodeTypedUUID mirrors uuid.UUID(**value): "hex" is required and
// "version" optional; any other keyword is refused.
func decodeTypedUUID(v any) (UUID, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return UUID{}, fmt.Errorf("uuid __value__ is %s, not an object", typeName(v))
	}
	h, ok := m["hex"].(string)
	if !ok {
		return UUID{}, errors.New(`uuid __value__ needs a "hex" string`)
	}
	for k := range m {
		if k != "hex" && k != "version" {
			return UUID{}, fmt.Errorf("uuid __value__ has unsupported key %q", k)
		}
	}
	u, err := ParseUUID(h)
	if err != nil {
		return UUID{}, err
	}
	if ver, present := m["version"]; present && ver != nil {
		n, ok := ver.(int64)
		if !ok {
			return UUID{}, fmt.Errorf("uuid version is %s, not an integer", typeName(ver))
		}
		return u.withVersion(n)
	}
	return u, nil
}

func (d *jsonDecoder) str() (any, error) {
	if v, ok := d.commonString(); ok {
		return v, nil
	}
	s, err := d.rawString()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// commonString returns the string values every Celery message repeats as
// constants, saving the two allocations (text and interface) of each.
func (d *jsonDecoder) commonString() (any, bool) {
	start := d.pos + 1
	for i := start; i < len(d.data) && i-start <= maxCommonValueLen; i++ {
		c := d.data[i]
		if c == '"' {
			v, ok := commonValue(d.data[start:i])
			if ok {
				d.pos = i + 1
			}
			return v, ok
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return nil, false
		}
	}
	return nil, false
}

// key parses an object key, without allocating for the keys Celery's
// documents repeat in every message.
func (d *jsonDecoder) key() (string, error) {
	start := d.pos + 1
	for i := start; i < len(d.data) && i-start <= maxCommonKeyLen; i++ {
		c := d.data[i]
		if c == '"' {
			if k, ok := commonKey(d.data[start:i]); ok {
				d.pos = i + 1
				return k, nil
			}
			break
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	return d.rawString()
}

// plainString returns the bytes of the string at d.pos, without copying,
// when it is printable ASCII without escapes (a base64 body); nil
// otherwise, with d.pos unchanged.
func (d *jsonDecoder) plainString() []byte {
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return nil
	}
	start := d.pos + 1
	for i := start; i < len(d.data); i++ {
		c := d.data[i]
		if c == '"' {
			d.pos = i + 1
			return d.data[start:i:i]
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return nil
		}
	}
	return nil
}

// rawString parses the string starting at the opening quote at d.pos.
func (d *jsonDecoder) rawString() (string, error) {
	start := d.pos + 1
	i := start
	for i < len(d.data) {
		c := d.data[i]
		if c == '"' {
			d.pos = i + 1
			return string(d.data[start:i]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	// Slow path: escapes, non-ASCII text or an error.
	d.buf = append(d.buf[:0], d.data[start:i]...)
	for i < len(d.data) {
		c := d.data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return string(d.buf), nil
		case c == '\\':
			d.pos = i
			n, err := d.escape(i)
			if err != nil {
				return "", err
			}
			i += n
		case c < 0x20:
			d.pos = i
			return "", d.syntaxError("invalid control character in string")
		case c < utf8.RuneSelf:
			d.buf = append(d.buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(d.data[i:])
			if r == utf8.RuneError && size == 1 {
				d.pos = i
				return "", d.syntaxError("invalid UTF-8 in string")
			}
			d.buf = append(d.buf, d.data[i:i+size]...)
			i += size
		}
	}
	d.pos = len(d.data)
	return "", d.syntaxError("unterminated string")
}

// escape decodes the escape sequence at d.data[i] (a backslash) into d.buf
// and returns its length in bytes.
func (d *jsonDecoder) escape(i int) (int, error) {
	if i+1 >= len(d.data) {
		return 0, d.syntaxError("unterminated escape")
	}
	var c byte
	switch d.data[i+1] {
	case '"':
		c = '"'
	case '\\':
		c = '\\'
	case '/':
		c = '/'
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, ok := hex4(d.data, i+2)
		if !ok {
			return 0, d.syntaxError(`invalid \u escape`)
		}
		n := 6
		if utf16.IsSurrogate(r) {
			r2, ok := rune(0), false
			if i+7 < len(d.data) && d.data[i+6] == '\\' && d.data[i+7] == 'u' {
				r2, ok = hex4(d.data, i+8)
			}
			if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
				r = dec
				n = 12
			} else {
				// A lone surrogate: Python keeps it, a Go string cannot.
				r = utf8.RuneError
			}
		}
		d.buf = utf8.AppendRune(d.buf, r)
		return n, nil
	default:
		return 0, d.syntaxError("invalid escape")
	}
	d.buf = append(d.buf, c)
	return 2, nil
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number parses Python's JSON number grammar,
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?, plus -Infinity.
func (d *jsonDecoder) number() (any, error) {
	start := d.pos
	i := d.pos
	neg := false
	if d.data[i] == '-' {
		neg = true
		i++
		if i < len(d.data) && d.data[i] == 'I' {
			d.pos = i
			if err := d.literal("Infinity"); err != nil {
				return nil, err
			}
			return math.Inf(-1), nil
		}
	}
	intStart := i
	if i < len(d.data) && d.data[i] == '0' {
		i++
	} else {
		for i < len(d.data) && isDigit(d.data[i]) {
			i++
		}
	}
	if i == intStart {
		d.pos = i
		return nil, d.syntaxError("invalid number")
	}
	intEnd := i
	isFloat := false
	if i+1 < len(d.data) && d.data[i] == '.' && isDigit(d.data[i+1]) {
		isFloat = true
		i += 2
		for i < len(d.data) && isDigit(d.data[i]) {
			i++
		}
	}
	if i < len(d.data) && (d.data[i] == 'e' || d.data[i] == 'E') {
		j := i + 1
		if j < len(d.data) && (d.data[j] == '+' || d.data[j] == '-') {
			j++
		}
		if j < len(d.data) && isDigit(d.data[j]) {
			isFloat = true
			for j < len(d.data) && isDigit(d.data[j]) {
				j++
			}
			i = j
		}
	}
	d.pos = i
	if isFloat {
		f, err := strconv.ParseFloat(string(d.data[start:i]), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, d.syntaxError("invalid number")
		}
		// Out of range means ±Inf or 0, which is what Python's float() gives.
		return f, nil
	}
	digits := d.data[intStart:intEnd]
	if len(digits) <= 18 {
		var n int64
		for _, c := range digits {
			n = n*10 + int64(c-'0')
		}
		if neg {
			n = -n
		}
		return n, nil
	}
	if len(digits) > maxIntDigits {
		d.pos = start
		return nil, d.syntaxError(fmt.Sprintf("integer literal of %d digits exceeds Python's limit of %d", len(digits), maxIntDigits))
	}
	text := string(d.data[start:i])
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n, nil
	}
	b, ok := new(big.Int).SetString(text, 10)
	if !ok {
		return nil, d.syntaxError("invalid number")
	}
	return b, nil
}

// typeName names the value type of v for error messages, in Python's terms
// where they exist.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "string"
	case []byte:
		return "bytes"
	case []any:
		return "list"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// JSONOptions choose how [AppendJSON] writes values that JSON lacks.
type JSONOptions struct {
	// Typed writes time.Time, Date, TimeOfDay, Decimal, UUID and []byte as
	// kombu ≥5.3 typed envelopes ({"__type__": ..., "__value__": ...}), so
	// that a kombu ≥5.3 client gets datetime, date, time, Decimal, UUID and
	// bytes back. Only kombu ≥5.3 reads them: Celery 5.2 clients see plain
	// dicts. The default (false) writes the plain forms every client reads:
	// ISO strings, decimal text, the canonical UUID text and UTF-8 text for
	// bytes. Bytes that are not UTF-8 are always written as a typed base64
	// envelope, since no plain form carries them.
	Typed bool
}

// maxEncodeDepth bounds the nesting the encoders follow, so that a cyclic
// value (a map containing itself) is an error instead of a crash.
const maxEncodeDepth = MaxDepthLimit

// AppendJSON appends the JSON encoding of v to dst, written as Python's
// json.dumps(v, sort_keys=True) writes it (ASCII-only, ", " and ": "
// separators, keys sorted), so Python reads back the same values:
//
//   - float64 is always written so that Python reads a float (1.0, not 1),
//     with Python's repr digits (1e+16, 1e-05), and NaN, Infinity and
//     -Infinity as Python writes them; float32 uses its shortest digits;
//   - *big.Int and every Go integer type are written as bare integers;
//   - time.Time, Date, TimeOfDay, Decimal, UUID and []byte follow
//     opts.Typed (see [JSONOptions]); a time.Time is written with
//     [FormatTime];
//   - a string that is not valid UTF-8 has each bad byte replaced by U+FFFD;
//   - other Go values (structs, typed slices and maps, pointers,
//     json.Marshaler, encoding.TextMarshaler) are converted with [ToValue]
//     first, which uses encoding/json for structs.
//
// Values nested deeper than MaxDepthLimit (a cyclic map, for instance) fail
// with an error wrapping ErrTooDeep.
func AppendJSON(dst []byte, v any, opts JSONOptions) ([]byte, error) {
	e := jsonEncoder{typed: opts.Typed, lim: math.MaxInt}
	return e.value(dst, v, 0)
}

// AppendJSONLimit is [AppendJSON] cut to at most limit bytes appended to
// dst (at a character boundary), for showing a value that may be large:
// it stops writing once the limit is passed instead of building the
// whole document and clipping it, so its output, memory and work are
// bounded by limit whatever v holds (beyond one scan of a dict's keys to
// sort them, and of a []byte to tell UTF-8 from binary), and a value that
// expands when written costs no more than a small one. truncated reports
// that what was appended is a cut prefix of AppendJSON's output, which
// is then not a JSON document: the caller shows that (with "…", say). An
// error is one AppendJSON would report within the part written.
func AppendJSONLimit(dst []byte, v any, opts JSONOptions, limit int) (b []byte, truncated bool, err error) {
	start := len(dst)
	e := jsonEncoder{typed: opts.Typed, lim: start + max(limit, 0)}
	b, err = e.value(dst, v, 0)
	if err != nil {
		return b, false, err
	}
	b, truncated = clipOutput(b, start, limit)
	return b, truncated, nil
}

type jsonEncoder struct {
	typed bool
	// lim is where the encoder may stop: once the output is longer,
	// nothing more is written (AppendJSONLimit clips); math.MaxInt
	// for the whole document.
	lim int
}

func (e *jsonEncoder) value(b []byte, v any, depth int) ([]byte, error) {
	if len(b) > e.lim {
		return b, nil
	}
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if x {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return appendJSONString(b, clipInput(x, e.lim-len(b))), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case float64:
		return appendJSONFloat(b, x, 64), nil
	case []any:
		if depth >= maxEncodeDepth {
			return b, errEncodeDepth
		}
		if len(x) == 0 {
			return append(b, "[]"...), nil
		}
		b = append(b, '[')
		for i, el := range x {
			if len(b) > e.lim {
				return b, nil
			}
			if i > 0 {
				b = append(b, ", "...)
			}
			var err error
			if b, err = e.value(b, el, depth+1); err != nil {
				return b, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		if depth >= maxEncodeDepth {
			return b, errEncodeDepth
		}
		if len(x) == 0 {
			return append(b, "{}"...), nil
		}
		var buf [8]string // small maps sort on the stack
		keys := sortedKeysInto(buf[:0], x)
		b = append(b, '{')
		for i, k := range keys {
			if len(b) > e.lim {
				return b, nil
			}
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendJSONString(b, clipInput(k, e.lim-len(b)))
			b = append(b, ": "...)
			var err error
			if b, err = e.value(b, x[k], depth+1); err != nil {
				return b, err
			}
		}
		return append(b, '}'), nil
	case *big.Int:
		if x == nil {
			return append(b, "null"...), nil
		}
		if bigIntTooLong(x) {
			return b, fmt.Errorf("%w: an int of %d bits is over %d digits, which Python's json refuses to write or read", ErrTooLarge, x.BitLen(), maxIntDigits)
		}
		return x.Append(b, 10), nil
	case []byte:
		if x == nil {
			return append(b, "null"...), nil
		}
		if !utf8.Valid(x) {
			b = append(openEnvelope(b, "base64"), '"')
			// Whole groups of three bytes, so that the cut text is a
			// prefix of the whole one.
			if room := max(e.lim-len(b), 0); room < len(x)-8 {
				x = x[:(room+8)/3*3]
			}
			b = base64.StdEncoding.AppendEncode(b, x)
			return append(b, `"}`...), nil
		}
		s := string(clipInput(x, e.lim-len(b)))
		if e.typed {
			return append(appendJSONString(openEnvelope(b, "bytes"), s), '}'), nil
		}
		return appendJSONString(b, s), nil
	case time.Time:
		var tmp [40]byte
		return e.textual(b, "datetime", appendTime(tmp[:0], x)), nil
	case Date:
		var tmp [16]byte
		return e.textual(b, "date", x.appendISO(tmp[:0])), nil
	case TimeOfDay:
		var tmp [16]byte
		return e.textual(b, "time", x.appendISO(tmp[:0])), nil
	case Decimal:
		s := clipInput(string(x), e.lim-len(b))
		if e.typed {
			return append(appendJSONString(openEnvelope(b, "decimal"), s), '}'), nil
		}
		return appendJSONString(b, s), nil
	case UUID:
		if e.typed {
			b = append(b, `{"__type__": "uuid", "__value__": {"hex": "`...)
			b = hex.AppendEncode(b, x[:])
			return append(b, `"}}`...), nil
		}
		b = append(b, '"')
		b = append(b, x.String()...)
		return append(b, '"'), nil
	case float32:
		return appendJSONFloat(b, float64(x), 32), nil
	case int8:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	}
	if depth >= maxEncodeDepth {
		return b, errEncodeDepth
	}
	nv, err := toValue(v, depth)
	if err != nil {
		return b, err
	}
	return e.value(b, nv, depth+1)
}

var errEncodeDepth = fmt.Errorf("%w: value nested more than %d levels (cyclic?)", ErrTooDeep, maxEncodeDepth)

// textual writes a value that has an ISO or decimal text form: a plain JSON
// string, or a typed envelope.
func (e *jsonEncoder) textual(b []byte, typ string, text []byte) []byte {
	if e.typed {
		b = openEnvelope(b, typ)
	}
	b = append(b, '"')
	b = append(b, text...)
	b = append(b, '"')
	if e.typed {
		b = append(b, '}')
	}
	return b
}

// openEnvelope starts a kombu typed envelope; the caller writes the value
// and the closing brace.
func openEnvelope(b []byte, typ string) []byte {
	b = append(b, `{"__type__": "`...)
	b = append(b, typ...)
	return append(b, `", "__value__": `...)
}

// appendJSONFloat writes f so that Python's json reads a float: repr
// digits, NaN and ±Infinity as json.dumps writes them.
func appendJSONFloat(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "Infinity"...)
	case math.IsInf(f, -1):
		return append(b, "-Infinity"...)
	}
	return appendPyFloat(b, f, bits)
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s quoted and escaped as Python's json.dumps with
// ensure_ascii=True does: only printable ASCII is written as is.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			i++
			continue
		}
		b = append(b, s[start:i]...)
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				b = append(b, `\"`...)
			case '\\':
				b = append(b, `\\`...)
			case '\n':
				b = append(b, `\n`...)
			case '\r':
				b = append(b, `\r`...)
			case '\t':
				b = append(b, `\t`...)
			case '\b':
				b = append(b, `\b`...)
			case '\f':
				b = append(b, `\f`...)
			default:
				b = appendU4(b, rune(c))
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r >= 0x10000 {
			r1, r2 := utf16.EncodeRune(r)
			b = appendU4(b, r1)
			b = appendU4(b, r2)
		} else {
			b = appendU4(b, r) // invalid UTF-8 arrives here as U+FFFD
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendU4(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}
