package sql

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/celeriac/celeriac/protocol"
)

// Pickle opcodes (Python's Lib/pickletools.py), protocol 3: the oldest
// protocol with a bytes opcode, read by every Python 3.
const (
	opProto        = 0x80
	opStop         = '.'
	opNone         = 'N'
	opTrue         = 0x88
	opFalse        = 0x89
	opBinInt       = 'J'
	opBinInt1      = 'K'
	opLong1        = 0x8a
	opLong4        = 0x8b
	opBinFloat     = 'G'
	opBinUnicode   = 'X'
	opShortBytes   = 'C'
	opBinBytes     = 'B'
	opEmptyList    = ']'
	opAppends      = 'e'
	opEmptyDict    = '}'
	opSetItems     = 'u'
	opMark         = '('
	opEmptyTuple   = ')'
	opTuple        = 't'
	opGlobal       = 'c'
	opReduce       = 'R'
	pickleProtocol = 3
)

// maxPickleDepth bounds nesting, so that a cyclic value is an error and not
// a stack overflow. Python's unpickler has no such limit of its own.
const maxPickleDepth = protocol.MaxDepthLimit

// errPickleDepth is returned for values nested deeper than maxPickleDepth.
var errPickleDepth = fmt.Errorf("%w: pickle: value nested too deeply", protocol.ErrUnencodable)

// EncodePickle returns the pickle (protocol 3) of v as Python's
// pickle.dumps would write the value Celery's database backend stores in
// its PickleType column, for the values a Go handler returns:
//
//   - nil, bool, integers (a *big.Int up to 4300 decimal digits, the
//     limit of DecodePickle and of Python's int to text), float64,
//     string (invalid UTF-8 becomes U+FFFD, as in JSON), []byte (bytes);
//   - []any → list, map[string]any → dict;
//   - *protocol.ExceptionInfo → {"exc_type", "exc_message" (a tuple),
//     "exc_module"}, the dict Celery stores for an exception with a
//     non-pickle result_serializer;
//   - time.Time → datetime.datetime (naive for time.UTC, as Celery's own
//     utcnow() values are; aware with its offset otherwise), protocol.Date →
//     datetime.date, protocol.TimeOfDay → datetime.time,
//     protocol.Decimal → decimal.Decimal, protocol.UUID → its string.
//
// Any other Go value (structs, typed maps and slices) is first converted
// the way the JSON result serializer would convert it, so a handler's
// result reads back in Python as it would from the Redis backend.
//
// [DecodePickle] reads these pickles back.
func EncodePickle(v any) ([]byte, error) {
	e := pickler{buf: make([]byte, 0, 64)}
	e.buf = append(e.buf, opProto, pickleProtocol)
	if err := e.value(v, 0); err != nil {
		return nil, err
	}
	e.buf = append(e.buf, opStop)
	return e.buf, nil
}

type pickler struct{ buf []byte }

func (e *pickler) value(v any, depth int) error {
	if depth > maxPickleDepth {
		return errPickleDepth
	}
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, opNone)
	case bool:
		if x {
			e.buf = append(e.buf, opTrue)
		} else {
			e.buf = append(e.buf, opFalse)
		}
	case int:
		e.int(int64(x))
	case int8:
		e.int(int64(x))
	case int16:
		e.int(int64(x))
	case int32:
		e.int(int64(x))
	case int64:
		e.int(x)
	case uint:
		e.bigInt(new(big.Int).SetUint64(uint64(x)))
	case uint8:
		e.int(int64(x))
	case uint16:
		e.int(int64(x))
	case uint32:
		e.int(int64(x))
	case uint64:
		e.bigInt(new(big.Int).SetUint64(x))
	case *big.Int:
		if x == nil {
			e.buf = append(e.buf, opNone)
			return nil
		}
		if intTooLong(x) {
			// Python would read it, but not DecodePickle, JSON or repr.
			return fmt.Errorf("%w: pickle: an int of %d bits is over %d digits", protocol.ErrUnencodable, x.BitLen(), maxPickleIntDigits)
		}
		e.bigInt(x)
	case float32:
		e.float(float64(x))
	case float64:
		e.float(x)
	case string:
		e.str(x)
	case []byte:
		e.bytes(x)
	case []any:
		e.buf = append(e.buf, opEmptyList)
		if len(x) == 0 {
			return nil
		}
		e.buf = append(e.buf, opMark)
		for _, it := range x {
			if err := e.value(it, depth+1); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, opAppends)
	case map[string]any:
		e.buf = append(e.buf, opEmptyDict)
		if len(x) == 0 {
			return nil
		}
		e.buf = append(e.buf, opMark)
		// Sorted keys: the same value always pickles to the same bytes.
		for _, k := range slices.Sorted(maps.Keys(x)) {
			e.str(k)
			if err := e.value(x[k], depth+1); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, opSetItems)
	case *protocol.ExceptionInfo:
		if x == nil {
			e.buf = append(e.buf, opNone)
			return nil
		}
		e.buf = append(e.buf, opEmptyDict, opMark)
		e.str("exc_message")
		if err := e.tuple(x.Message, depth+1); err != nil {
			return err
		}
		e.str("exc_module")
		e.str(x.Module)
		e.str("exc_type")
		e.str(x.Type)
		e.buf = append(e.buf, opSetItems)
	case time.Time:
		e.datetime(x)
	case protocol.Date:
		// datetime.date(state): 4 bytes, year (big-endian), month, day.
		e.global("datetime", "date")
		e.bytesArg([]byte{byte(x.Year >> 8), byte(x.Year), byte(x.Month), byte(x.Day)})
	case protocol.TimeOfDay:
		us := x.Nanosecond / 1000
		e.global("datetime", "time")
		e.bytesArg([]byte{byte(x.Hour), byte(x.Minute), byte(x.Second), byte(us >> 16), byte(us >> 8), byte(us)})
	case protocol.Decimal:
		e.global("decimal", "Decimal")
		e.buf = append(e.buf, opMark)
		e.str(string(x))
		e.buf = append(e.buf, opTuple, opReduce)
	case protocol.UUID:
		e.str(x.String())
	default:
		return e.converted(v, depth)
	}
	return nil
}

// converted pickles a value of another Go type as the JSON result
// serializer would carry it (typed, so times and bytes keep their type).
func (e *pickler) converted(v any, depth int) error {
	data, err := protocol.AppendJSON(nil, v, protocol.JSONOptions{Typed: true})
	if err == nil {
		var w any
		if w, err = protocol.DecodeJSON(data, protocol.DecodeOptions{}); err == nil {
			return e.value(w, depth)
		}
	}
	if errors.Is(err, protocol.ErrUnencodable) {
		return fmt.Errorf("pickle: %T: %w", v, err)
	}
	// Another try cannot mend it: the worker must not retry the write.
	return fmt.Errorf("%w: pickle: %T: %w", protocol.ErrUnencodable, v, err)
}

func (e *pickler) tuple(items []any, depth int) error {
	if len(items) == 0 {
		e.buf = append(e.buf, opEmptyTuple)
		return nil
	}
	e.buf = append(e.buf, opMark)
	for _, it := range items {
		if err := e.value(it, depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, opTuple)
	return nil
}

func (e *pickler) int(n int64) {
	switch {
	case n >= 0 && n < 256:
		e.buf = append(e.buf, opBinInt1, byte(n))
	case n >= math.MinInt32 && n <= math.MaxInt32:
		e.buf = append(e.buf, opBinInt)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(int32(n)))
	default:
		e.bigInt(big.NewInt(n))
	}
}

// bigInt writes LONG1/LONG4: the little-endian two's complement bytes of n,
// as few as hold its sign (pickle's encode_long).
func (e *pickler) bigInt(n *big.Int) {
	if n.IsInt64() {
		if i := n.Int64(); i >= math.MinInt32 && i <= math.MaxInt32 {
			e.int(i)
			return
		}
	}
	// Two's complement in nbytes: for negative n, 2^(8*nbytes) + n.
	nbytes := n.BitLen()/8 + 1
	abs := n
	if n.Sign() < 0 {
		abs = new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*nbytes)), n)
	}
	be := abs.FillBytes(make([]byte, nbytes))
	// A negative value whose magnitude is a power of 256 fits in one byte
	// less (encode_long trims a redundant 0xff).
	if n.Sign() < 0 && nbytes > 1 && be[0] == 0xff && be[1]&0x80 != 0 {
		be = be[1:]
		nbytes--
	}
	if nbytes < 256 {
		e.buf = append(e.buf, opLong1, byte(nbytes))
	} else {
		e.buf = append(e.buf, opLong4)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(nbytes))
	}
	for i := len(be) - 1; i >= 0; i-- {
		e.buf = append(e.buf, be[i])
	}
}

func (e *pickler) float(f float64) {
	e.buf = append(e.buf, opBinFloat)
	e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(f))
}

func (e *pickler) str(s string) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	e.buf = append(e.buf, opBinUnicode)
	e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *pickler) bytes(b []byte) {
	if len(b) < 256 {
		e.buf = append(e.buf, opShortBytes, byte(len(b)))
	} else {
		e.buf = append(e.buf, opBinBytes)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(b)))
	}
	e.buf = append(e.buf, b...)
}

func (e *pickler) global(module, name string) {
	e.buf = append(e.buf, opGlobal)
	e.buf = append(e.buf, module...)
	e.buf = append(e.buf, '\n')
	e.buf = append(e.buf, name...)
	e.buf = append(e.buf, '\n')
}

// bytesArg closes a GLOBAL with the call cls(state): how datetime's
// types reduce themselves.
func (e *pickler) bytesArg(state []byte) {
	e.buf = append(e.buf, opMark)
	e.bytes(state)
	e.buf = append(e.buf, opTuple, opReduce)
}

// datetime writes datetime.datetime(state[, tzinfo]). A time in UTC is
// written naive, as Celery's own date_done and datetime.utcnow() values
// are; any other location keeps its offset as a datetime.timezone.
func (e *pickler) datetime(t time.Time) {
	_, offset := t.Zone()
	if t.Location() == time.UTC {
		offset = 0
	}
	aware := t.Location() != time.UTC
	y := t.Year()
	if y < 1 || y > 9999 {
		// Python's datetime cannot hold it: keep the text.
		e.str(t.Format(time.RFC3339Nano))
		return
	}
	us := t.Nanosecond() / 1000
	state := []byte{byte(y >> 8), byte(y), byte(t.Month()), byte(t.Day()),
		byte(t.Hour()), byte(t.Minute()), byte(t.Second()), byte(us >> 16), byte(us >> 8), byte(us)}
	e.global("datetime", "datetime")
	e.buf = append(e.buf, opMark)
	e.bytes(state)
	if aware {
		// datetime.timezone(datetime.timedelta(0, offset)); timedelta
		// normalizes a negative offset to days=-1.
		days, secs := 0, offset
		if secs < 0 {
			days, secs = -1, secs+86400
		}
		e.global("datetime", "timezone")
		e.buf = append(e.buf, opMark)
		e.global("datetime", "timedelta")
		e.buf = append(e.buf, opMark)
		e.int(int64(days))
		e.int(int64(secs))
		e.buf = append(e.buf, opTuple, opReduce, opTuple, opReduce)
	}
	e.buf = append(e.buf, opTuple, opReduce)
}
