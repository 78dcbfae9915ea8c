package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"time"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// DecodeMsgpack decodes a msgpack document as Python's
// msgpack.unpackb(data, raw=False) (kombu's msgpack serializer) does and
// returns it as the package's value types:
//
//   - integers of every width become int64; a uint64 above the int64 range
//     becomes *big.Int;
//   - float32 and float64 become float64 (float32 widened exactly, as
//     Python does);
//   - str becomes string (invalid UTF-8 is an error, as in Python) and bin
//     becomes []byte;
//   - maps become map[string]any: keys must be str, or bin holding UTF-8
//     text. Other keys are an error: Python's unpackb refuses them too
//     (strict_map_key), so no Python producer sends them;
//   - the timestamp extension (-1) becomes a time.Time in UTC; any other
//     extension is an error.
//
// A repeated map key keeps its last value. Input longer than
// opts.MaxBodySize fails with an error wrapping ErrTooLarge, nesting deeper
// than opts.MaxDepth with one wrapping ErrTooDeep. Lengths are checked
// against the bytes left before anything is allocated, so a short header
// claiming billions of elements is an error, not an allocation. Data after
// the value is an error.
func DecodeMsgpack(data []byte, opts DecodeOptions) (any, error) {
	if len(data) > opts.maxBodySize() {
		return nil, fmt.Errorf("%w: msgpack document of %d bytes exceeds %d", ErrTooLarge, len(data), opts.maxBodySize())
	}
	r := bytes.NewReader(data)
	dec := msgpack.GetDecoder()
	// bytes.Reader is an io.ByteScanner, so the decoder reads it directly,
	// without a buffer of its own: r.Len() is exactly what is left.
	dec.Reset(r)
	var scratch decodeScratch
	d := msgpackDecoder{dec: dec, r: r, data: data, maxDepth: opts.maxDepth(), vals: scratch.vals[:0], keys: scratch.keys[:0]}
	v, err := d.value()
	msgpack.PutDecoder(dec)
	if err != nil {
		return nil, err
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("protocol: msgpack: %d bytes of extra data after the value", r.Len())
	}
	return v, nil
}

type msgpackDecoder struct {
	dec      *msgpack.Decoder
	r        *bytes.Reader
	data     []byte
	depth    int
	maxDepth int
	// Shared element stacks, as in jsonDecoder: a container is copied out
	// once complete, so its size comes from decoded elements, never from a
	// length header.
	vals []any
	keys []string
}

func (d *msgpackDecoder) offset() int { return len(d.data) - d.r.Len() }

func (d *msgpackDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("protocol: msgpack: "+format+" at offset %d", append(args, d.offset())...)
}

func (d *msgpackDecoder) wrap(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return d.errorf("unexpected end of input")
	}
	return fmt.Errorf("protocol: msgpack: %w (offset %d)", err, d.offset())
}

func (d *msgpackDecoder) value() (any, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, d.wrap(err)
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.wrapErr(d.dec.DecodeNil())
	case c == msgpcode.False || c == msgpcode.True:
		b, err := d.dec.DecodeBool()
		return b, d.wrapErr(err)
	case msgpcode.IsFixedNum(c), c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32, c == msgpcode.Int64,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32:
		n, err := d.dec.DecodeInt64()
		return n, d.wrapErr(err)
	case c == msgpcode.Uint64:
		u, err := d.dec.DecodeUint64()
		if err != nil {
			return nil, d.wrap(err)
		}
		return uintValue(u), nil
	case c == msgpcode.Float:
		f, err := d.dec.DecodeFloat32()
		return float64(f), d.wrapErr(err)
	case c == msgpcode.Double:
		f, err := d.dec.DecodeFloat64()
		return f, d.wrapErr(err)
	case msgpcode.IsString(c):
		return d.str()
	case msgpcode.IsBin(c):
		raw, err := d.raw()
		if err != nil {
			return nil, err
		}
		return bytes.Clone(raw), nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return d.array()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return d.object()
	case msgpcode.IsExt(c):
		return d.ext()
	}
	return nil, d.errorf("invalid code 0x%02x", c)
}

func (d *msgpackDecoder) wrapErr(err error) error {
	if err != nil {
		return d.wrap(err)
	}
	return nil
}

// raw reads the payload of a str or bin as a slice of the input.
func (d *msgpackDecoder) raw() ([]byte, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, d.wrap(err)
	}
	return d.take(n)
}

// take consumes n bytes of input without copying them.
func (d *msgpackDecoder) take(n int) ([]byte, error) {
	if n < 0 || n > d.r.Len() {
		return nil, d.errorf("length %d exceeds the %d bytes left", n, d.r.Len())
	}
	off := d.offset()
	if _, err := d.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, d.wrap(err)
	}
	return d.data[off : off+n], nil
}

func (d *msgpackDecoder) str() (string, error) {
	raw, err := d.raw()
	if err != nil {
		return "", err
	}
	if !utf8.Valid(raw) {
		return "", d.errorf("invalid UTF-8 in str")
	}
	return string(raw), nil
}

// key decodes a str map key, without allocating for the keys Celery's
// documents repeat in every message.
func (d *msgpackDecoder) key() (string, error) {
	raw, err := d.raw()
	if err != nil {
		return "", err
	}
	if k, ok := commonKey(raw); ok {
		return k, nil
	}
	if !utf8.Valid(raw) {
		return "", d.errorf("invalid UTF-8 in str")
	}
	return string(raw), nil
}

func (d *msgpackDecoder) enter() error {
	d.depth++
	if d.depth > d.maxDepth {
		return fmt.Errorf("%w: msgpack nesting exceeds %d at offset %d", ErrTooDeep, d.maxDepth, d.offset())
	}
	return nil
}

func (d *msgpackDecoder) array() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return nil, d.wrap(err)
	}
	if n > d.r.Len() { // every element takes at least one byte
		return nil, d.errorf("array of %d elements exceeds the %d bytes left", n, d.r.Len())
	}
	mark := len(d.vals)
	for range n {
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.vals = append(d.vals, v)
	}
	out := make([]any, n)
	copy(out, d.vals[mark:])
	clear(d.vals[mark:])
	d.vals = d.vals[:mark]
	d.depth--
	return out, nil
}

func (d *msgpackDecoder) object() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return nil, d.wrap(err)
	}
	if n > d.r.Len()/2 { // every entry takes at least two bytes
		return nil, d.errorf("map of %d entries exceeds the %d bytes left", n, d.r.Len())
	}
	vmark, kmark := len(d.vals), len(d.keys)
	for range n {
		c, err := d.dec.PeekCode()
		if err != nil {
			return nil, d.wrap(err)
		}
		var k string
		switch {
		case msgpcode.IsString(c):
			k, err = d.key()
		case msgpcode.IsBin(c):
			var raw []byte
			if raw, err = d.raw(); err == nil && !utf8.Valid(raw) {
				// Keys are strings here, and strings are UTF-8.
				err = d.errorf("bin map key is not UTF-8")
			}
			k = string(raw)
		default:
			return nil, d.errorf("map key with code 0x%02x is not a str or bin", c)
		}
		if err != nil {
			return nil, err
		}
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
	}
	keys, vals := d.keys[kmark:], d.vals[vmark:]
	m := make(map[string]any, len(keys))
	for i, k := range keys {
		m[k] = vals[i]
	}
	clear(keys)
	clear(vals)
	d.keys, d.vals = d.keys[:kmark], d.vals[:vmark]
	d.depth--
	return m, nil
}

// ext decodes the timestamp extension (type -1) as msgpack-python's
// Timestamp.from_bytes does.
func (d *msgpackDecoder) ext() (any, error) {
	id, n, err := d.dec.DecodeExtHeader()
	if err != nil {
		return nil, d.wrap(err)
	}
	payload, err := d.take(n)
	if err != nil {
		return nil, err
	}
	if id != -1 {
		return nil, d.errorf("unsupported extension type %d", id)
	}
	var sec int64
	var nsec uint32
	switch n {
	case 4:
		sec = int64(binary.BigEndian.Uint32(payload))
	case 8:
		v := binary.BigEndian.Uint64(payload)
		nsec, sec = uint32(v>>34), int64(v&(1<<34-1))
	case 12:
		nsec = binary.BigEndian.Uint32(payload)
		sec = int64(binary.BigEndian.Uint64(payload[4:]))
	default:
		return nil, d.errorf("timestamp extension of %d bytes", n)
	}
	if nsec >= 1e9 {
		return nil, d.errorf("timestamp nanoseconds %d out of range", nsec)
	}
	return time.Unix(sec, int64(nsec)).UTC(), nil
}

// AppendMsgpack appends the msgpack encoding of v to dst, as Python's
// msgpack.packb(v, use_bin_type=True) would encode the equivalent Python
// value: integers in their smallest form, float64 as a double (float32 as
// a float), strings as str, []byte as bin, maps with sorted keys.
//
// msgpack has no types for the rest, and kombu's msgpack serializer adds
// none, so they are written as the plain JSON encoder writes them:
// time.Time as its [FormatTime] text (what kombu's msgpack would need a
// Python producer to pass), Date and TimeOfDay as ISO text, Decimal as its
// text and UUID in canonical form. *big.Int must fit in 64 bits (Python's
// packb refuses wider integers too). Other Go values are converted with
// [ToValue] first.
func AppendMsgpack(dst []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	e := msgpackEncoder{enc: enc}
	err := e.value(v, 0)
	msgpack.PutEncoder(enc)
	if err != nil {
		return dst, err
	}
	return buf.Bytes(), nil
}

const pythonNaNBits = 0x7ff8000000000000

type msgpackEncoder struct {
	enc *msgpack.Encoder
}

func (e *msgpackEncoder) value(v any, depth int) error {
	enc := e.enc
	switch x := v.(type) {
	case nil:
		return enc.EncodeNil()
	case bool:
		return enc.EncodeBool(x)
	case string:
		return enc.EncodeString(x)
	case int64:
		return enc.EncodeInt(x)
	case int:
		return enc.EncodeInt(int64(x))
	case float64:
		if math.IsNaN(x) {
			// Python writes NaN with C's default bits; do the same so
			// output is byte-identical (any NaN reads back as nan).
			x = math.Float64frombits(pythonNaNBits)
		}
		return enc.EncodeFloat64(x)
	case []any:
		if depth >= maxEncodeDepth {
			return errEncodeDepth
		}
		if err := enc.EncodeArrayLen(len(x)); err != nil {
			return err
		}
		for _, el := range x {
			if err := e.value(el, depth+1); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if depth >= maxEncodeDepth {
			return errEncodeDepth
		}
		if err := enc.EncodeMapLen(len(x)); err != nil {
			return err
		}
		var buf [8]string // small maps sort on the stack
		for _, k := range sortedKeysInto(buf[:0], x) {
			if err := enc.EncodeString(k); err != nil {
				return err
			}
			if err := e.value(x[k], depth+1); err != nil {
				return err
			}
		}
		return nil
	case []byte:
		return enc.EncodeBytes(x)
	case *big.Int:
		switch {
		case x == nil:
			return enc.EncodeNil()
		case x.IsInt64():
			return enc.EncodeInt(x.Int64())
		case x.IsUint64():
			return enc.EncodeUint(x.Uint64())
		}
		return fmt.Errorf("%w: msgpack cannot carry the integer %s (wider than 64 bits)", ErrUnencodable, x)
	case time.Time:
		var tmp [40]byte
		return enc.EncodeString(string(appendTime(tmp[:0], x)))
	case Date:
		return enc.EncodeString(x.String())
	case TimeOfDay:
		return enc.EncodeString(x.String())
	case Decimal:
		return enc.EncodeString(string(x))
	case UUID:
		return enc.EncodeString(x.String())
	case float32:
		return enc.EncodeFloat32(x)
	case uint64:
		return enc.EncodeUint(x)
	case uint:
		return enc.EncodeUint(uint64(x))
	case int32:
		return enc.EncodeInt(int64(x))
	}
	if depth >= maxEncodeDepth {
		return errEncodeDepth
	}
	nv, err := toValue(v, depth)
	if err != nil {
		return err
	}
	return e.value(nv, depth+1)
}
