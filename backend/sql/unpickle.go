package sql

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/celeriac/celeriac/protocol"
)

// ErrUnsafePickle is wrapped by [DecodePickle]'s error for a pickle that
// names a class or function outside its allow-list, or uses an opcode that
// would make Python's unpickler import or call something (INST, OBJ, REDUCE
// or NEWOBJ of another class, BUILD of another object, the extension
// registry, persistent ids). The decoder stops there; nothing is imported
// or called, whatever the pickle says.
var ErrUnsafePickle = errors.New("sql backend: pickle would import or call code")

// Bounds of DecodePickle.
const (
	// maxPickleSize is the largest pickle read, as protocol's decoders
	// bound a body.
	maxPickleSize = protocol.DefaultMaxBodySize
	// maxPickleMemo bounds the memo (and no index may exceed the input's
	// length: Python's pickler numbers its entries from 0, one per
	// opcode at most).
	maxPickleMemo = 1 << 22
	// maxPickleIntDigits is Python's limit on the digits of an int written
	// as text (sys.get_int_max_str_digits), for INT and LONG and for dict
	// keys made text.
	maxPickleIntDigits = 4300
	// pickleWorkFactor bounds the work that input bytes do not pay for
	// (hashing dict keys fetched from the memo again and again, converting
	// a memoized string repeatedly) and the size of the result written out
	// as a tree (see resolve): at most this many bytes for each byte of
	// input, plus pickleWorkBase.
	pickleWorkFactor = 64
	pickleWorkBase   = 1 << 20
	// maxPickleMemory bounds the memory the decoder allocates, charged
	// for every value pushed, container filled, mark, memo slot and
	// converted container (see pushCost): a byte of input can be a map
	// in memory, so 16 MiB of EMPTY_DICT opcodes is refused here instead
	// of taking gigabytes.
	maxPickleMemory = 256 << 20
	// maxPickleLongBytes bounds LONG1 and LONG4 before their value is
	// read: an int of maxPickleIntDigits digits needs 1786 bytes, and
	// Python's pickler writes no more bytes than the value needs.
	maxPickleLongBytes = 1800
	// maxQuoted is how much of an invalid argument an error quotes.
	maxQuoted = 40
)

// Pickle opcodes the encoder does not write (Lib/pickletools.py).
const (
	opInt            = 'I'
	opLong           = 'L'
	opFloat          = 'F'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinInt2        = 'M'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opByteArray8     = 0x96
	opList           = 'l'
	opAppend         = 'a'
	opDict           = 'd'
	opSetItem        = 's'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opFrozenSet      = 0x91
	opPop            = '0'
	opDup            = '2'
	opPopMark        = '1'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opMemoize        = 0x94
	opGet            = 'g'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opFrame          = 0x95
	opStackGlobal    = 0x93
	opNewObj         = 0x81
	opNewObjEx       = 0x92
	opBuild          = 'b'
	opInst           = 'i'
	opObj            = 'o'
	opPersID         = 'P'
	opBinPersID      = 'Q'
	opExt1           = 0x82
	opExt2           = 0x83
	opExt4           = 0x84
	opNextBuffer     = 0x97
	opReadonlyBuffer = 0x98
)

// DecodePickle reads a pickle (protocols 0 to 5) as data, the way
// pickle.loads would build the value, without importing or calling
// anything. It is what [Backend.Get] uses to read the result column of
// Celery's SQLAlchemy schema, which Python writes with pickle.dumps (and
// [EncodePickle] writes for celeriac).
//
// Values become the types of package protocol:
//
//   - None → nil, bool, int → int64 (or *big.Int outside int64),
//     float → float64, str → string (a lone surrogate, which Go strings
//     cannot hold, becomes U+FFFD, as in protocol's JSON decoder),
//     bytes and bytearray → []byte;
//   - list, tuple, set and frozenset → []any (a set in pickle order);
//   - dict → map[string]any; keys that are not str are made text as
//     Python's json.dumps makes them (1 → "1", True → "true", None →
//     "null", 1.5 → "1.5"), so a value reads as it would through a JSON
//     result backend; other keys (tuples, bytes) are an error.
//
// A few classes are recognised by name and read from their pickled state,
// never constructed by calling them: datetime.datetime → time.Time (naive
// as UTC; an aware value needs a datetime.timezone, a fixed offset, and
// keeps it, a zero offset as time.UTC), datetime.date → protocol.Date,
// datetime.time → protocol.TimeOfDay (naive or UTC), decimal.Decimal →
// protocol.Decimal, uuid.UUID → protocol.UUID; and the helpers Python's
// pickler itself uses for them and for sets and bytes in old protocols
// (builtins.set, frozenset and bytearray, _codecs.encode with latin-1,
// copyreg._reconstructor of a uuid.UUID).
//
// Every other class or function (a zoneinfo or pytz time zone included),
// and the opcodes that would call or import one, fail with an error
// wrapping [ErrUnsafePickle]. A value of an allowed class in a form
// Python's pickler does not write (a datetime built from integers), or
// one that has no protocol value (a timedelta on its own, a datetime.time
// with an offset), is an error too, and so is an int written as text
// (INT, LONG) of more than 4300 decimal digits, which Python refuses as
// well. A binary int (LONG1, LONG4) over that limit, which Python reads
// but which no text form (JSON, repr) holds, fails with an error
// wrapping protocol.ErrTooLarge, and so does input over 64 MiB, and a
// pickle whose value would be over
// 64 times its size plus 1 MiB written out as repr or typed JSON (each
// scalar counted at the most it writes, shared parts repeated), or whose
// decoding would allocate more than 256 MiB (every value pushed,
// container filled, mark and memo slot is charged as it is made);
// nesting deeper than protocol.MaxDepthLimit (a recursive list included)
// fails with one wrapping protocol.ErrTooDeep. An error quotes at most 40
// bytes of the input. A bug in the decoder that panics is an error
// wrapping ErrUnsafePickle, not a panic. Data after STOP is ignored, as
// pickle.loads ignores it.
//
// Containers the pickle shares (one object referenced twice through the
// memo) are shared in the result too; the result shares no memory with
// data.
func DecodePickle(data []byte) (any, error) {
	return decodePickle(data, maxPickleMemory)
}

// decodePickle is DecodePickle with mem bytes of memory budget.
func decodePickle(data []byte, mem int) (v any, err error) {
	if len(data) > maxPickleSize {
		return nil, fmt.Errorf("%w: pickle of %d bytes exceeds %d", protocol.ErrTooLarge, len(data), maxPickleSize)
	}
	u := unpickler{data: data, work: pickleWorkFactor*len(data) + pickleWorkBase, mem: mem}
	defer u.recoverPanic(&v, &err)
	if v, err = u.run(); err != nil {
		return nil, err
	}
	// The stack, marks and memo are garbage now; resolve allocates the
	// result.
	u.stack, u.marks, u.memo = nil, nil, nil
	return u.resolve(v, 0)
}

// While decoding, containers are pointers, so that the memo shares them
// and APPENDS or SETITEMS after a MEMOIZE reach every reference;
// [unpickler.resolve] turns them into []any and map[string]any at the end.
type (
	pyList  struct{ items []any }
	pyTuple struct{ items []any }
	pySet   struct {
		items  []any
		frozen bool
	}
	pyDict struct{ m map[string]any }
	// pyUUID is a uuid.UUID made by NEWOBJ or copyreg._reconstructor,
	// whose state BUILD sets.
	pyUUID struct {
		u     protocol.UUID
		built bool
	}
	// pyTimedelta and pyTimezone exist only as arguments of a datetime.
	pyTimedelta struct{ us int64 }
	pyTimezone  struct{ offset int }
	// memoNone stands for None in the memo, where nil means unset.
	memoNone struct{}
)

// pyGlobal is an allow-listed class or function.
type pyGlobal int

const (
	gDatetime pyGlobal = iota + 1
	gDate
	gTime
	gTimedelta
	gTimezone
	gDecimal
	gUUID
	gSet
	gFrozenSet
	gBytes
	gByteArray
	gObject
	gCodecsEncode
	gReconstructor
)

// globalNames are the allow-listed globals, by module and name.
var globalNames = [...]string{
	gDatetime: "datetime.datetime", gDate: "datetime.date", gTime: "datetime.time",
	gTimedelta: "datetime.timedelta", gTimezone: "datetime.timezone", gDecimal: "decimal.Decimal",
	gUUID: "uuid.UUID", gSet: "builtins.set", gFrozenSet: "builtins.frozenset", gBytes: "builtins.bytes",
	gByteArray: "builtins.bytearray", gObject: "builtins.object", gCodecsEncode: "_codecs.encode",
	gReconstructor: "copyreg._reconstructor",
}

func (g pyGlobal) String() string { return globalNames[g] }

// lookupGlobal finds module.name in the allow-list.
func lookupGlobal(module, name string) (pyGlobal, bool) {
	for g, n := range globalNames {
		if g > 0 && len(n) == len(module)+1+len(name) && n[:len(module)] == module && n[len(module)] == '.' && n[len(module)+1:] == name {
			return pyGlobal(g), true
		}
	}
	return 0, false
}

type unpickler struct {
	data  []byte
	pos   int
	op    int // offset of the opcode being run
	proto int
	stack []any
	marks []int
	memo  []any
	nmemo int
	// work is what is left of the budget of work input bytes do not
	// pay for (see pickleWorkFactor), mem of the memory budget (see
	// maxPickleMemory).
	work, mem int
	// err is the first charge a push could not pay; run stops there.
	err error
	// done holds the containers resolve converted.
	done map[any]resolved
}

// recoverPanic makes a panic in the decoder this pickle's error: a bug
// here must not take down the worker's chord_unlock or the dashboard
// with it.
func (u *unpickler) recoverPanic(v *any, err *error) {
	if r := recover(); r != nil {
		*v, *err = nil, fmt.Errorf("%w: sql backend: pickle: decoder failed at offset %d: %v", ErrUnsafePickle, u.op, r)
	}
}

func (u *unpickler) errorf(format string, args ...any) error {
	return fmt.Errorf("sql backend: pickle: offset %d: %s", u.op, fmt.Sprintf(format, args...))
}

func (u *unpickler) unsafe(what string) error {
	return fmt.Errorf("%w: %s at offset %d (only allow-listed value classes are read)", ErrUnsafePickle, what, u.op)
}

// spend charges n units of work that no input byte paid for.
func (u *unpickler) spend(n int) error {
	if err := u.charge(n); err != nil {
		return fmt.Errorf("%w (at offset %d)", err, u.op)
	}
	return nil
}

func (u *unpickler) take(n uint64) ([]byte, error) {
	if n > uint64(len(u.data)-u.pos) {
		return nil, u.errorf("truncated (%d bytes wanted, %d left)", n, len(u.data)-u.pos)
	}
	b := u.data[u.pos : u.pos+int(n)]
	u.pos += int(n)
	return b, nil
}

func (u *unpickler) uint(n int) (uint64, error) {
	b, err := u.take(uint64(n))
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

// line reads up to and without the next newline.
func (u *unpickler) line() ([]byte, error) {
	rest := u.data[u.pos:]
	for i, c := range rest {
		if c == '\n' {
			u.pos += i + 1
			return rest[:i], nil
		}
	}
	return nil, u.errorf("truncated (no newline)")
}

// fence is where the items of the innermost MARK start.
func (u *unpickler) fence() int {
	if len(u.marks) == 0 {
		return 0
	}
	return u.marks[len(u.marks)-1]
}

// need checks that n items are on the stack above the innermost mark.
func (u *unpickler) need(n int) error {
	if len(u.stack)-u.fence() < n {
		return u.errorf("stack underflow")
	}
	return nil
}

// push charges every value pushed, so that no opcode allocates beyond
// the budget: one byte of EMPTY_DICT is a map in memory.
func (u *unpickler) push(v any) {
	if u.err == nil {
		u.err = u.alloc(pushCost(v))
	}
	u.stack = append(u.stack, v)
}

// Approximate bytes of memory, charged against the work budget.
const (
	// slotCost is an item on the stack, then in a container (slices
	// grow by doubling), or in the result.
	slotCost = 32
	// objectCost is a container, a boxed number or a time, and its
	// pointer.
	objectCost = 64
	// entryCost is a map entry (key, value, control bytes, growth).
	entryCost = 64
)

// pushCost is what a value pushed on the stack holds in memory.
func pushCost(v any) int {
	switch x := v.(type) {
	case nil, bool, pyGlobal:
		return slotCost
	case string:
		return slotCost + len(x)
	case []byte:
		return slotCost + len(x)
	case *big.Int:
		return slotCost + objectCost + len(x.Bits())*8
	case protocol.Decimal:
		return slotCost + objectCost + len(x)
	}
	return slotCost + objectCost
}

func (u *unpickler) pop() any {
	v := u.stack[len(u.stack)-1]
	u.stack[len(u.stack)-1] = nil
	u.stack = u.stack[:len(u.stack)-1]
	return v
}

// popMark removes the innermost mark and returns the items above it,
// which stay valid until the next push.
func (u *unpickler) popMark() ([]any, error) {
	if len(u.marks) == 0 {
		return nil, u.errorf("no MARK")
	}
	m := u.marks[len(u.marks)-1]
	u.marks = u.marks[:len(u.marks)-1]
	items := u.stack[m:]
	u.stack = u.stack[:m]
	return items, nil
}

// popMarkCopy is popMark for items that are kept.
func (u *unpickler) popMarkCopy() ([]any, error) {
	items, err := u.popMark()
	if err != nil {
		return nil, err
	}
	out := make([]any, len(items))
	copy(out, items)
	clear(items)
	return out, nil
}

func (u *unpickler) run() (any, error) {
	for {
		if u.pos >= len(u.data) {
			return nil, fmt.Errorf("sql backend: pickle: truncated (no STOP)")
		}
		u.op = u.pos
		op := u.data[u.pos]
		u.pos++
		if op == opStop {
			if err := u.need(1); err != nil {
				return nil, err
			}
			return u.pop(), nil
		}
		if err := u.step(op); err != nil {
			return nil, err
		}
		if u.err != nil {
			return nil, u.err
		}
	}
}

func (u *unpickler) step(op byte) error {
	switch op {
	case opProto:
		v, err := u.uint(1)
		if err != nil {
			return err
		}
		if v > 5 {
			return u.errorf("unsupported pickle protocol %d", v)
		}
		u.proto = int(v)
	case opFrame:
		n, err := u.uint(8)
		if err != nil {
			return err
		}
		if n > uint64(len(u.data)-u.pos) {
			return u.errorf("truncated (frame of %d bytes, %d left)", n, len(u.data)-u.pos)
		}
	case opNone:
		u.push(nil)
	case opTrue:
		u.push(true)
	case opFalse:
		u.push(false)
	case opBinInt:
		v, err := u.uint(4)
		if err != nil {
			return err
		}
		u.push(int64(int32(uint32(v))))
	case opBinInt1, opBinInt2:
		n := 1
		if op == opBinInt2 {
			n = 2
		}
		v, err := u.uint(n)
		if err != nil {
			return err
		}
		u.push(int64(v))
	case opLong1, opLong4:
		return u.binLong(op)
	case opInt, opLong:
		return u.textInt(op)
	case opBinFloat:
		v, err := u.take(8)
		if err != nil {
			return err
		}
		u.push(math.Float64frombits(binary.BigEndian.Uint64(v)))
	case opFloat:
		return u.textFloat()
	case opBinUnicode, opShortBinUni, opBinUnicode8:
		b, err := u.counted(op)
		if err != nil {
			return err
		}
		s, err := u.utf8(b)
		if err != nil {
			return err
		}
		u.push(s)
	case opUnicode:
		l, err := u.line()
		if err != nil {
			return err
		}
		s, err := u.rawUnicodeEscape(l)
		if err != nil {
			return err
		}
		u.push(s)
	case opBinString, opShortBinString:
		b, err := u.counted(op)
		if err != nil {
			return err
		}
		s, err := u.ascii(b)
		if err != nil {
			return err
		}
		u.push(s)
	case opString:
		return u.textString()
	case opBinBytes, opShortBytes, opBinBytes8, opByteArray8:
		b, err := u.counted(op)
		if err != nil {
			return err
		}
		u.push(append([]byte{}, b...))
	case opEmptyList:
		u.push(&pyList{})
	case opEmptyTuple:
		u.push(&pyTuple{})
	case opEmptyDict:
		u.push(&pyDict{m: map[string]any{}})
	case opEmptySet:
		u.push(&pySet{})
	case opMark:
		if err := u.alloc(slotCost); err != nil {
			return err
		}
		u.marks = append(u.marks, len(u.stack))
	case opList:
		items, err := u.popMarkCopy()
		if err != nil {
			return err
		}
		u.push(&pyList{items: items})
	case opTuple:
		items, err := u.popMarkCopy()
		if err != nil {
			return err
		}
		u.push(&pyTuple{items: items})
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		if err := u.need(n); err != nil {
			return err
		}
		items := make([]any, n)
		copy(items, u.stack[len(u.stack)-n:])
		clear(u.stack[len(u.stack)-n:])
		u.stack = u.stack[:len(u.stack)-n]
		u.push(&pyTuple{items: items})
	case opFrozenSet:
		items, err := u.popMarkCopy()
		if err != nil {
			return err
		}
		u.push(&pySet{items: items, frozen: true})
	case opDict:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		d := &pyDict{m: make(map[string]any, len(items)/2)}
		err = u.setItems(d, items)
		clear(items)
		if err != nil {
			return err
		}
		u.push(d)
	case opAppend:
		if err := u.need(2); err != nil {
			return err
		}
		v := u.pop()
		l, ok := u.stack[len(u.stack)-1].(*pyList)
		if !ok {
			return u.unsafe("APPEND to " + kindOf(u.stack[len(u.stack)-1]))
		}
		l.items = append(l.items, v)
	case opAppends, opAddItems:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		if err := u.need(1); err != nil {
			return err
		}
		switch c := u.stack[len(u.stack)-1].(type) {
		case *pyList:
			if op == opAppends {
				c.items = append(c.items, items...)
				clear(items)
				return nil
			}
		case *pySet:
			if op == opAddItems && !c.frozen {
				c.items = append(c.items, items...)
				clear(items)
				return nil
			}
		}
		return u.unsafe(opName(op) + " to " + kindOf(u.stack[len(u.stack)-1]))
	case opSetItem:
		if err := u.need(3); err != nil {
			return err
		}
		d, ok := u.stack[len(u.stack)-3].(*pyDict)
		if !ok {
			return u.unsafe("SETITEM on " + kindOf(u.stack[len(u.stack)-3]))
		}
		err := u.setItems(d, u.stack[len(u.stack)-2:])
		u.pop()
		u.pop()
		return err
	case opSetItems:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		if err := u.need(1); err != nil {
			return err
		}
		d, ok := u.stack[len(u.stack)-1].(*pyDict)
		if !ok {
			return u.unsafe("SETITEMS on " + kindOf(u.stack[len(u.stack)-1]))
		}
		err = u.setItems(d, items)
		clear(items)
		return err
	case opPop:
		if n := len(u.marks); n > 0 && u.marks[n-1] == len(u.stack) {
			u.marks = u.marks[:n-1]
			return nil
		}
		if err := u.need(1); err != nil {
			return err
		}
		u.pop()
	case opPopMark:
		items, err := u.popMark()
		if err != nil {
			return err
		}
		clear(items)
	case opDup:
		if err := u.need(1); err != nil {
			return err
		}
		u.push(u.stack[len(u.stack)-1])
	case opPut, opBinPut, opLongBinPut, opMemoize:
		return u.put(op)
	case opGet, opBinGet, opLongBinGet:
		return u.get(op)
	case opGlobal:
		mod, err := u.line()
		if err != nil {
			return err
		}
		name, err := u.line()
		if err != nil {
			return err
		}
		return u.global(string(mod), string(name))
	case opStackGlobal:
		if err := u.need(2); err != nil {
			return err
		}
		name, ok1 := u.pop().(string)
		mod, ok2 := u.pop().(string)
		if !ok1 || !ok2 {
			return u.errorf("STACK_GLOBAL requires str")
		}
		return u.global(mod, name)
	case opReduce:
		if err := u.need(2); err != nil {
			return err
		}
		args, fn := u.pop(), u.pop()
		g, ok := fn.(pyGlobal)
		if !ok {
			return u.unsafe("REDUCE calling " + kindOf(fn))
		}
		t, ok := args.(*pyTuple)
		if !ok {
			return u.errorf("REDUCE arguments are %s, not a tuple", kindOf(args))
		}
		v, err := u.call(g, t.items)
		if err != nil {
			return err
		}
		u.push(v)
	case opNewObj:
		if err := u.need(2); err != nil {
			return err
		}
		args, cls := u.pop(), u.pop()
		if t, ok := args.(*pyTuple); ok && cls == gUUID && len(t.items) == 0 {
			u.push(&pyUUID{})
			return nil
		}
		return u.unsafe("NEWOBJ of " + kindOf(cls))
	case opBuild:
		if err := u.need(2); err != nil {
			return err
		}
		state := u.pop()
		if id, ok := u.stack[len(u.stack)-1].(*pyUUID); ok && !id.built {
			return u.uuidState(id, state)
		}
		return u.unsafe("BUILD of " + kindOf(u.stack[len(u.stack)-1]))
	case opInst, opObj, opNewObjEx, opExt1, opExt2, opExt4, opPersID, opBinPersID:
		return u.unsafe(opName(op))
	case opNextBuffer:
		return u.errorf("NEXT_BUFFER: out-of-band buffers are not read")
	case opReadonlyBuffer:
		if err := u.need(1); err != nil {
			return err
		}
		if _, ok := u.stack[len(u.stack)-1].([]byte); !ok {
			return u.errorf("READONLY_BUFFER on %s", kindOf(u.stack[len(u.stack)-1]))
		}
	default:
		return u.errorf("invalid opcode 0x%02x", op)
	}
	return nil
}

// quoted is b quoted for an error, cut to maxQuoted bytes: an error
// never carries a whole hostile line (a FLOAT argument may be megabytes).
func quoted(b []byte) string {
	if len(b) <= maxQuoted {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(string(b[:maxQuoted])), len(b))
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func opName(op byte) string {
	switch op {
	case opInst:
		return "INST"
	case opObj:
		return "OBJ"
	case opNewObjEx:
		return "NEWOBJ_EX"
	case opExt1, opExt2, opExt4:
		return "EXT (the extension registry)"
	case opPersID, opBinPersID:
		return "PERSID (a persistent id)"
	case opAppends:
		return "APPENDS"
	case opAddItems:
		return "ADDITEMS"
	}
	return fmt.Sprintf("opcode 0x%02x", op)
}

// kindOf names what a decoded item is, for errors.
func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *pyList:
		return "list"
	case *pyTuple:
		return "tuple"
	case *pyDict:
		return "dict"
	case *pySet:
		if x.frozen {
			return "frozenset"
		}
		return "set"
	case pyGlobal:
		return x.String()
	case *pyUUID, protocol.UUID:
		return "uuid.UUID"
	case pyTimedelta:
		return "datetime.timedelta"
	case pyTimezone:
		return "datetime.timezone"
	case time.Time:
		return "datetime.datetime"
	case protocol.Date:
		return "datetime.date"
	case protocol.TimeOfDay:
		return "datetime.time"
	case protocol.Decimal:
		return "decimal.Decimal"
	}
	return fmt.Sprintf("%T", v)
}

// counted reads the length-prefixed payload of a string or bytes opcode.
func (u *unpickler) counted(op byte) ([]byte, error) {
	var n uint64
	var err error
	switch op {
	case opShortBinUni, opShortBytes, opShortBinString:
		n, err = u.uint(1)
	case opBinUnicode, opBinBytes:
		n, err = u.uint(4)
	case opBinString:
		n, err = u.uint(4)
		if err == nil && int32(uint32(n)) < 0 {
			return nil, u.errorf("BINSTRING with a negative length")
		}
	default:
		n, err = u.uint(8)
	}
	if err != nil {
		return nil, err
	}
	return u.take(n)
}

// utf8 decodes str data as Python does (UTF-8 with surrogatepass): an
// encoded surrogate becomes U+FFFD; other invalid UTF-8 is an error.
func (u *unpickler) utf8(b []byte) (string, error) {
	if utf8.Valid(b) {
		return string(b), nil
	}
	var sb strings.Builder
	sb.Grow(len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			if len(b) >= 3 && b[0] == 0xed && b[1] >= 0xa0 && b[1] <= 0xbf && b[2] >= 0x80 && b[2] <= 0xbf {
				sb.WriteRune(utf8.RuneError)
				b = b[3:]
				continue
			}
			return "", u.errorf("str is not UTF-8")
		}
		sb.Write(b[:size])
		b = b[size:]
	}
	return sb.String(), nil
}

// ascii decodes a Python 2 str as pickle.loads does by default
// (encoding="ASCII").
func (u *unpickler) ascii(b []byte) (string, error) {
	for _, c := range b {
		if c >= 0x80 {
			return "", u.errorf("Python 2 str is not ASCII")
		}
	}
	return string(b), nil
}

// textString reads STRING: a quoted Python 2 str literal, unescaped as
// codecs.escape_decode does.
func (u *unpickler) textString() error {
	l, err := u.line()
	if err != nil {
		return err
	}
	if len(l) < 2 || l[0] != l[len(l)-1] || (l[0] != '\'' && l[0] != '"') {
		return u.errorf("the STRING opcode argument must be quoted")
	}
	l = l[1 : len(l)-1]
	out := make([]byte, 0, len(l))
	for i := 0; i < len(l); i++ {
		c := l[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i == len(l) {
			return u.errorf("STRING ends with a backslash")
		}
		switch c = l[i]; c {
		case '\n':
		case '\\', '\'', '"':
			out = append(out, c)
		case 'a':
			out = append(out, '\a')
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'v':
			out = append(out, '\v')
		case 'x':
			if i+2 >= len(l) || !isHex(l[i+1]) || !isHex(l[i+2]) {
				return u.errorf("invalid \\x escape in STRING")
			}
			h, _ := strconv.ParseUint(string(l[i+1:i+3]), 16, 8)
			out = append(out, byte(h))
			i += 2
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(c - '0')
			for k := 0; k < 2 && i+1 < len(l) && l[i+1] >= '0' && l[i+1] <= '7'; k++ {
				i++
				v = v*8 + int(l[i]-'0')
			}
			out = append(out, byte(v))
		default:
			out = append(out, '\\', c)
		}
	}
	s, err := u.ascii(out)
	if err != nil {
		return err
	}
	u.push(s)
	return nil
}

// rawUnicodeEscape decodes UNICODE's argument as Python's
// raw-unicode-escape codec: bytes are Latin-1, and \uXXXX or \UXXXXXXXX
// after an odd number of backslashes is a code point.
func (u *unpickler) rawUnicodeEscape(l []byte) (string, error) {
	var sb strings.Builder
	sb.Grow(len(l))
	for i := 0; i < len(l); {
		if l[i] != '\\' {
			sb.WriteRune(rune(l[i]))
			i++
			continue
		}
		start := i
		for i < len(l) && l[i] == '\\' {
			i++
		}
		run := i - start
		if run%2 == 0 || i == len(l) || (l[i] != 'u' && l[i] != 'U') {
			sb.WriteString(strings.Repeat("\\", run))
			continue
		}
		sb.WriteString(strings.Repeat("\\", run-1))
		n := 4
		if l[i] == 'U' {
			n = 8
		}
		i++
		if i+n > len(l) {
			return "", u.errorf("truncated \\u escape in UNICODE")
		}
		cp, err := strconv.ParseUint(string(l[i:i+n]), 16, 32)
		if err != nil {
			return "", u.errorf("invalid \\u escape in UNICODE")
		}
		i += n
		switch {
		case cp > utf8.MaxRune:
			return "", u.errorf("\\U escape out of range in UNICODE")
		case cp >= 0xd800 && cp <= 0xdfff:
			sb.WriteRune(utf8.RuneError)
		default:
			sb.WriteRune(rune(cp))
		}
	}
	return sb.String(), nil
}

// binLong reads LONG1 and LONG4: little-endian two's complement.
func (u *unpickler) binLong(op byte) error {
	var n uint64
	var err error
	if op == opLong1 {
		n, err = u.uint(1)
	} else {
		n, err = u.uint(4)
		if err == nil && int32(uint32(n)) < 0 {
			return u.errorf("LONG4 with a negative length")
		}
	}
	if err != nil {
		return err
	}
	if n > maxPickleLongBytes {
		return u.tooLongInt(longName(op))
	}
	b, err := u.take(n)
	if err != nil {
		return err
	}
	if len(b) <= 8 {
		var v uint64
		for i := len(b) - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		if len(b) > 0 && len(b) < 8 && b[len(b)-1]&0x80 != 0 {
			v |= ^uint64(0) << (8 * len(b)) // sign extension
		}
		u.push(int64(v))
		return nil
	}
	be := make([]byte, len(b))
	for i, c := range b {
		be[len(b)-1-i] = c
	}
	x := new(big.Int).SetBytes(be)
	if be[0]&0x80 != 0 {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*len(be))))
	}
	if intTooLong(x) {
		return u.tooLongInt(longName(op))
	}
	u.push(intValue(x))
	return nil
}

// tooLongInt is the error for an int over maxPickleIntDigits, which
// pickle.loads reads (LONG1 and LONG4 are binary) but no text form of
// the value (JSON, repr, a dict key made text) can hold: too large, like
// a value over the decoder's other bounds.
func (u *unpickler) tooLongInt(what string) error {
	return fmt.Errorf("%w: sql backend: pickle: offset %d: %s: an int over %d digits (Python's limit for an int written as text)",
		protocol.ErrTooLarge, u.op, what, maxPickleIntDigits)
}

func longName(op byte) string {
	if op == opLong1 {
		return "LONG1"
	}
	return "LONG4"
}

// intTooLong reports whether x has more than maxPickleIntDigits decimal
// digits, as protocol's writers and decoders count them.
func intTooLong(x *big.Int) bool {
	// 2**(bits-1) <= |x| < 2**bits, and 0.30102 < log10(2) < 0.30103.
	switch bits := x.BitLen(); {
	case (bits-1)*30102 >= maxPickleIntDigits*100000:
		return true
	case bits*30103 <= maxPickleIntDigits*100000:
		return false
	}
	return x.CmpAbs(pow10IntDigits()) >= 0
}

// pow10IntDigits is 10**maxPickleIntDigits, the smallest int too long.
var pow10IntDigits = sync.OnceValue(func() *big.Int {
	return new(big.Int).Exp(big.NewInt(10), big.NewInt(maxPickleIntDigits), nil)
})

// intValue is x as protocol carries integers: int64 when it fits.
func intValue(x *big.Int) any {
	if x.IsInt64() {
		return x.Int64()
	}
	return x
}

// textInt reads INT and LONG (protocol 0): decimal text; INT's "00" and
// "01" are False and True.
func (u *unpickler) textInt(op byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	if op == opInt && len(l) == 2 && l[0] == '0' && (l[1] == '0' || l[1] == '1') {
		u.push(l[1] == '1')
		return nil
	}
	if op == opLong && len(l) > 0 && l[len(l)-1] == 'L' {
		l = l[:len(l)-1]
	}
	digits := l
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > maxPickleIntDigits {
		return u.errorf("invalid integer text (empty, or over %d digits)", maxPickleIntDigits)
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return u.errorf("invalid integer text %s", quoted(l))
		}
	}
	if n, err := strconv.ParseInt(string(l), 10, 64); err == nil {
		u.push(n)
		return nil
	}
	x, ok := new(big.Int).SetString(string(l), 10)
	if !ok {
		return u.errorf("invalid integer text %s", quoted(l))
	}
	u.push(intValue(x))
	return nil
}

// textFloat reads FLOAT (protocol 0): repr(float).
func (u *unpickler) textFloat() error {
	l, err := u.line()
	if err != nil {
		return err
	}
	s := string(l)
	if strings.ContainsAny(s, "xX_pP") {
		return u.errorf("invalid float text %s", quoted(l))
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return u.errorf("invalid float text %s", quoted(l))
	}
	if math.IsNaN(f) {
		// Python's NaN, not Go's (whose payload is 1), signed as written.
		f = math.Float64frombits(0x7ff8000000000000)
		if strings.HasPrefix(s, "-") {
			f = math.Copysign(f, -1)
		}
	}
	u.push(f)
	return nil
}

// setItems adds key, value pairs to d. Keys are made text as json.dumps
// makes them; the decoder pays for hashing each key.
func (u *unpickler) setItems(d *pyDict, items []any) error {
	if len(items)%2 != 0 {
		return u.errorf("odd number of items for a dict")
	}
	for i := 0; i < len(items); i += 2 {
		k, err := u.key(items[i])
		if err != nil {
			return err
		}
		if err := u.spend(len(k)); err != nil {
			return err
		}
		if err := u.alloc(entryCost); err != nil {
			return err
		}
		d.m[k] = items[i+1]
	}
	return nil
}

// key is the text of a dict key, as Python's json.dumps writes it.
func (u *unpickler) key(k any) (string, error) {
	switch x := k.(type) {
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case *big.Int:
		if intTooLong(x) {
			return "", u.tooLongInt("int dict key")
		}
		if err := u.spend(x.BitLen()/3 + 1); err != nil {
			return "", err
		}
		return x.String(), nil
	case bool:
		if x {
			return "true", nil
		}
		return "false", nil
	case nil:
		return "null", nil
	case float64:
		switch {
		case math.IsNaN(x):
			return "NaN", nil
		case math.IsInf(x, 1):
			return "Infinity", nil
		case math.IsInf(x, -1):
			return "-Infinity", nil
		}
		return protocol.Repr(x), nil
	}
	return "", u.errorf("dict key of type %s has no JSON form (keys must be str, int, float, bool or None)", kindOf(k))
}

func (u *unpickler) put(op byte) error {
	if err := u.need(1); err != nil {
		return err
	}
	var idx uint64
	var err error
	switch op {
	case opPut:
		idx, err = u.textIndex()
	case opBinPut:
		idx, err = u.uint(1)
	case opLongBinPut:
		idx, err = u.uint(4)
	default:
		idx = uint64(u.nmemo)
	}
	if err != nil {
		return err
	}
	if idx >= maxPickleMemo || idx >= uint64(len(u.data)) {
		return u.errorf("memo index %d out of bounds", idx)
	}
	i := int(idx)
	if i >= len(u.memo) {
		n := min(max(i+1, 2*len(u.memo)), maxPickleMemo, len(u.data))
		if err := u.alloc(slotCost * (n - len(u.memo))); err != nil {
			return err
		}
		u.memo = append(u.memo, make([]any, n-len(u.memo))...)
	}
	v := u.stack[len(u.stack)-1]
	if v == nil {
		v = memoNone{}
	}
	if u.memo[i] == nil {
		u.nmemo++
	}
	u.memo[i] = v
	return nil
}

func (u *unpickler) get(op byte) error {
	var idx uint64
	var err error
	switch op {
	case opGet:
		idx, err = u.textIndex()
	case opBinGet:
		idx, err = u.uint(1)
	default:
		idx, err = u.uint(4)
	}
	if err != nil {
		return err
	}
	if idx >= uint64(len(u.memo)) || u.memo[idx] == nil {
		return u.errorf("memo key %d not found", idx)
	}
	v := u.memo[idx]
	if _, ok := v.(memoNone); ok {
		v = nil
	}
	u.push(v)
	return nil
}

// textIndex reads PUT and GET's decimal argument.
func (u *unpickler) textIndex() (uint64, error) {
	l, err := u.line()
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(l), 10, 32)
	if err != nil {
		return 0, u.errorf("invalid memo index %s", quoted(l))
	}
	return n, nil
}

// global looks a class or function up in the allow-list; anything else is
// where Python's unpickler would import a module.
func (u *unpickler) global(mod, name string) error {
	if u.proto < 3 {
		switch mod {
		case "__builtin__":
			mod = "builtins"
		case "copy_reg":
			mod = "copyreg"
		}
	}
	g, ok := lookupGlobal(mod, name)
	if !ok {
		return u.unsafe("global " + quoted([]byte(mod+"."+name)))
	}
	u.push(g)
	return nil
}

// call is REDUCE of an allow-listed global: it reads the arguments as the
// class would, for the argument shapes Python's pickler writes.
func (u *unpickler) call(g pyGlobal, args []any) (any, error) {
	bad := func() (any, error) {
		kinds := make([]string, len(args))
		for i, a := range args {
			kinds[i] = kindOf(a)
		}
		return nil, u.errorf("%s(%s): not a form the decoder reads", g, strings.Join(kinds, ", "))
	}
	switch g {
	case gDatetime, gDate, gTime:
		if len(args) < 1 || len(args) > 2 || (g == gDate && len(args) != 1) {
			return bad()
		}
		state, ok := args[0].([]byte)
		if !ok {
			return bad()
		}
		var tz *pyTimezone
		if len(args) == 2 {
			switch z := args[1].(type) {
			case nil:
			case pyTimezone:
				tz = &z
			default:
				return nil, u.errorf("%s with tzinfo %s: only datetime.timezone is read", g, kindOf(args[1]))
			}
		}
		return u.datetime(g, state, tz)
	case gTimedelta:
		if len(args) > 3 {
			return bad()
		}
		// Bounds that keep the sum in int64; a timezone needs less than
		// a day anyway.
		var parts [3]int64
		for i, a := range args {
			n, ok := a.(int64)
			if !ok || n > 1e12 || n < -1e12 || (i == 0 && (n > 1e6 || n < -1e6)) {
				return bad()
			}
			parts[i] = n
		}
		return pyTimedelta{us: (parts[0]*86400+parts[1])*1e6 + parts[2]}, nil
	case gTimezone:
		if len(args) < 1 || len(args) > 2 {
			return bad()
		}
		td, ok := args[0].(pyTimedelta)
		if !ok {
			return bad()
		}
		if len(args) == 2 {
			if _, ok := args[1].(string); !ok {
				return bad()
			}
		}
		if td.us <= -86400e6 || td.us >= 86400e6 {
			return nil, u.errorf("datetime.timezone offset of %dµs is not within a day", td.us)
		}
		if td.us%1e6 != 0 {
			return nil, u.errorf("datetime.timezone offset of %dµs is not whole seconds", td.us)
		}
		return pyTimezone{offset: int(td.us / 1e6)}, nil
	case gDecimal:
		if len(args) != 1 {
			return bad()
		}
		s, ok := args[0].(string)
		if !ok {
			return bad()
		}
		if err := u.spend(len(s)); err != nil {
			return nil, err
		}
		d, err := protocol.ParseDecimal(s)
		if err != nil {
			return nil, u.errorf("decimal.Decimal(%s): invalid", quoted([]byte(s)))
		}
		return d, nil
	case gSet, gFrozenSet:
		s := &pySet{frozen: g == gFrozenSet}
		if len(args) > 1 {
			return bad()
		}
		if len(args) == 1 {
			// The items are complete when the set is made; later appends
			// to the list must not reach the set, hence the capped slice.
			switch it := args[0].(type) {
			case *pyList:
				s.items = it.items[:len(it.items):len(it.items)]
			case *pyTuple:
				s.items = it.items[:len(it.items):len(it.items)]
			case *pySet:
				s.items = it.items[:len(it.items):len(it.items)]
			default:
				return bad()
			}
		}
		return s, nil
	case gBytes:
		if len(args) == 0 {
			return []byte{}, nil
		}
		return bad()
	case gByteArray:
		switch {
		case len(args) == 0:
			return []byte{}, nil
		case len(args) == 1:
			if b, ok := args[0].([]byte); ok {
				return b, nil
			}
		case len(args) == 2:
			return u.latin1(args)
		}
		return bad()
	case gCodecsEncode:
		if len(args) != 2 {
			return bad()
		}
		return u.latin1(args)
	case gReconstructor:
		if len(args) != 3 {
			return bad()
		}
		if args[0] == gUUID && args[1] == gObject && args[2] == nil {
			return &pyUUID{}, nil
		}
		return nil, u.unsafe("copyreg._reconstructor of " + kindOf(args[0]))
	}
	return nil, u.unsafe(g.String() + "(...)")
}

// latin1 is _codecs.encode(str, "latin1"), how protocols 0 to 2 pickle
// bytes.
func (u *unpickler) latin1(args []any) (any, error) {
	s, ok1 := args[0].(string)
	enc, ok2 := args[1].(string)
	if !ok1 || !ok2 || (enc != "latin1" && enc != "latin-1") {
		return nil, u.errorf("_codecs.encode: only (str, \"latin1\") is read")
	}
	if err := u.spend(len(s)); err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, u.errorf("_codecs.encode: a character over U+00FF is not Latin-1")
		}
		b = append(b, byte(r))
	}
	return b, nil
}

// datetime reads the state CPython's datetime types pickle: big-endian
// year, month, day, hour, minute, second, 3 bytes of microseconds (the
// fields of each type), the fold bit set on month (datetime) or hour
// (time) for protocols 4 and up, which is dropped.
func (u *unpickler) datetime(g pyGlobal, s []byte, tz *pyTimezone) (any, error) {
	want := 10
	switch g {
	case gDate:
		want = 4
	case gTime:
		want = 6
	}
	if len(s) != want {
		return nil, u.errorf("%s state of %d bytes, want %d", g, len(s), want)
	}
	var d protocol.Date
	var c protocol.TimeOfDay
	clock := s
	if g != gTime {
		d = protocol.Date{Year: int(s[0])<<8 | int(s[1]), Month: time.Month(s[2] & 0x7f), Day: int(s[3])}
		if d.Year < 1 || d.Year > 9999 || d.Month < 1 || d.Month > 12 || d.Day < 1 ||
			d.Day > time.Date(d.Year, d.Month+1, 0, 0, 0, 0, 0, time.UTC).Day() {
			return nil, u.errorf("%s: invalid date %d-%d-%d", g, d.Year, d.Month, d.Day)
		}
		if g == gDate {
			return d, nil
		}
		clock = s[4:]
	}
	c = protocol.TimeOfDay{Hour: int(clock[0] & 0x7f), Minute: int(clock[1]), Second: int(clock[2]),
		Nanosecond: (int(clock[3])<<16 | int(clock[4])<<8 | int(clock[5])) * 1000}
	if c.Hour > 23 || c.Minute > 59 || c.Second > 59 || c.Nanosecond >= 1e9 {
		return nil, u.errorf("%s: invalid time %d:%d:%d.%06d", g, c.Hour, c.Minute, c.Second, c.Nanosecond/1000)
	}
	if g == gTime {
		if tz != nil && tz.offset != 0 {
			return nil, u.errorf("datetime.time with a UTC offset: protocol.TimeOfDay has none")
		}
		return c, nil
	}
	loc := time.UTC
	if tz != nil && tz.offset != 0 {
		loc = time.FixedZone("", tz.offset)
	}
	return time.Date(d.Year, d.Month, d.Day, c.Hour, c.Minute, c.Second, c.Nanosecond, loc), nil
}

// uuidState is BUILD of a uuid.UUID: {"int": n, ["is_safe": v]}, what
// UUID.__getstate__ returns.
func (u *unpickler) uuidState(id *pyUUID, state any) error {
	d, ok := state.(*pyDict)
	if !ok {
		return u.errorf("uuid.UUID state is %s, not a dict", kindOf(state))
	}
	var n *big.Int
	switch x := d.m["int"].(type) {
	case int64:
		n = big.NewInt(x)
	case *big.Int:
		n = x
	default:
		return u.errorf("uuid.UUID state has no int")
	}
	for k, v := range d.m {
		switch k {
		case "int":
		case "is_safe":
			if i, ok := v.(int64); v != nil && (!ok || i < -1 || i > 0) {
				return u.errorf("uuid.UUID state: invalid is_safe")
			}
		default:
			return u.errorf("uuid.UUID state: unknown key %s", quoted([]byte(k)))
		}
	}
	if n.Sign() < 0 || n.BitLen() > 128 {
		return u.errorf("uuid.UUID int out of range")
	}
	n.FillBytes(id.u[:])
	id.built = true
	return nil
}

// resolve turns the decoder's pointer containers into protocol's value
// types. Each container is converted once (the memo may share it), the
// depth of every path is bounded, and so is the size of the value written
// out as a tree, with every shared part repeated: each visit of a
// converted container is charged what it would cost expanded, each
// string its length. Whatever walks the result later (an encoder, a
// repr) then has work bounded by the input's size too, not exponential
// in it (a list holding a list twice, sixty times over, is a short
// pickle).
func (u *unpickler) resolve(v any, depth int) (any, error) {
	w, _, _, err := u.resolveValue(v, depth)
	return w, err
}

// resolved is a converted container: its value, height and expanded
// cost; busy while its items are converted, which finds recursion.
type resolved struct {
	v            any
	height, cost int
	busy         bool
}

func (u *unpickler) charge(n int) error {
	u.work -= n
	if u.work < 0 {
		return errTooMuchWork
	}
	return nil
}

// alloc charges n bytes of memory the decoder is about to allocate.
func (u *unpickler) alloc(n int) error {
	u.mem -= n
	if u.mem < 0 {
		return fmt.Errorf("%w (at offset %d)", errTooMuchMemory, u.op)
	}
	return nil
}

var errTooMuchMemory = fmt.Errorf("%w: sql backend: pickle: decoding takes over %d MiB of memory",
	protocol.ErrTooLarge, maxPickleMemory>>20)

var errTooMuchWork = fmt.Errorf("%w: sql backend: pickle: the value expands, or makes the decoder work, beyond %d times the pickle's size",
	protocol.ErrTooLarge, pickleWorkFactor)

// resolveValue returns the value, its height (levels of containers) and
// its expanded cost: the most bytes it takes written out, as repr or as
// (typed) JSON, with every shared part repeated, so that whatever writes
// the result has output bounded by the work budget.
func (u *unpickler) resolveValue(v any, depth int) (any, int, int, error) {
	var cost int
	switch x := v.(type) {
	case nil:
		cost = len("None")
	case bool:
		cost = len("False")
	case int64:
		cost = len("-9223372036854775808")
	case float64:
		cost = len("-2.2250738585072014e-308")
	case *big.Int:
		cost = x.BitLen()/3 + 2 // log10(2) < 1/3
	case string:
		cost = writtenStrSize(x)
	case []byte:
		// repr writes \xhh for a byte; typed JSON base64 or escaped text
		// in an envelope.
		cost = 4*len(x) + envelopeSize
	case time.Time:
		// datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone(
		// datetime.timedelta(days=-1, seconds=82800))), or its envelope.
		cost = 112
	case protocol.Date, protocol.TimeOfDay:
		cost = 64
	case protocol.Decimal:
		cost = len(x) + envelopeSize
	case *pyUUID:
		if !x.built {
			return nil, 0, 0, errors.New("sql backend: pickle: a uuid.UUID without its state")
		}
		v = x.u
		cost = 80 // {"__type__": "uuid", "__value__": {"hex": "..."}}
	case *pyList, *pyTuple, *pySet, *pyDict:
		return u.resolveContainer(v, depth)
	default:
		return nil, 0, 0, fmt.Errorf("sql backend: pickle: %s is not a value", kindOf(v))
	}
	if err := u.charge(cost); err != nil {
		return nil, 0, 0, err
	}
	return v, 0, cost, nil
}

// envelopeSize is what a kombu typed envelope adds to a value's text:
// {"__type__": "datetime", "__value__": "..."}.
const envelopeSize = 48

// writtenStrSize is the length of s as JSON with ensure_ascii, which is
// at least its repr's: \uXXXX for a control or non-ASCII character, a
// surrogate pair for one beyond U+FFFF.
func writtenStrSize(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			i += size
			if r >= 0x10000 {
				n += 12
			} else {
				n += 6
			}
			continue
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
			n += 2
		case c < 0x20 || c == 0x7f:
			n += 6
		default:
			n++
		}
		i++
	}
	return n
}

func (u *unpickler) resolveContainer(v any, depth int) (any, int, int, error) {
	tooDeep := func() (any, int, int, error) {
		return nil, 0, 0, fmt.Errorf("%w: sql backend: pickle: nesting exceeds %d", protocol.ErrTooDeep, protocol.MaxDepthLimit)
	}
	if depth+1 > protocol.MaxDepthLimit {
		return tooDeep()
	}
	if done, ok := u.done[v]; ok {
		if done.busy {
			return nil, 0, 0, fmt.Errorf("%w: sql backend: pickle: a recursive %s (it contains itself)", protocol.ErrTooDeep, kindOf(v))
		}
		if depth+done.height > protocol.MaxDepthLimit {
			return tooDeep()
		}
		if err := u.charge(done.cost); err != nil {
			return nil, 0, 0, err
		}
		return done.v, done.height, done.cost, nil
	}
	if u.done == nil {
		u.done = map[any]resolved{}
	}
	u.done[v] = resolved{busy: true}
	// Brackets, and the memory of the converted container and its entry
	// in done, charged once since the result shares it.
	height, cost := 0, 2
	n := 0
	switch x := v.(type) {
	case *pyList:
		n = slotCost * len(x.items)
	case *pyTuple:
		n = slotCost * len(x.items)
	case *pySet:
		n = slotCost * len(x.items)
	case *pyDict:
		n = entryCost * len(x.m)
	}
	if err := u.charge(cost); err != nil {
		return nil, 0, 0, err
	}
	if err := u.alloc(3*objectCost + n); err != nil {
		return nil, 0, 0, err
	}
	var out any
	if d, ok := v.(*pyDict); ok {
		m := make(map[string]any, len(d.m))
		for k, it := range d.m {
			w, h, c, err := u.resolveValue(it, depth+1)
			if err != nil {
				return nil, 0, 0, err
			}
			// The key and ": ", ", ".
			kc := writtenStrSize(k) + 4
			if err := u.charge(kc); err != nil {
				return nil, 0, 0, err
			}
			m[k] = w
			height, cost = max(height, h), cost+c+kc
		}
		out = m
	} else {
		var items []any
		switch x := v.(type) {
		case *pyList:
			items = x.items
		case *pyTuple:
			items = x.items
		case *pySet:
			items = x.items
		}
		l := make([]any, len(items))
		for i, it := range items {
			w, h, c, err := u.resolveValue(it, depth+1)
			if err != nil {
				return nil, 0, 0, err
			}
			if err := u.charge(2); err != nil { // ", "
				return nil, 0, 0, err
			}
			l[i] = w
			height, cost = max(height, h), cost+c+2
		}
		out = l
	}
	u.done[v] = resolved{v: out, height: height + 1, cost: cost}
	return out, height + 1, cost, nil
}
