package protocol

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// ReprMaxSize is Celery's limit for the argsrepr and kwargsrepr headers
// (app.amqp.argsrepr_maxsize and kwargsrepr_maxsize).
const ReprMaxSize = 1024

// Repr renders v as Python's repr() renders the equivalent Python value:
// None, True, False, integers, floats with Python's digits (1.0, 1e+16,
// 1e-05, inf, nan), strings with Python's choice of quote and escapes,
// bytes as b'...', lists, dicts ({'a': 1}, keys sorted since Go maps have
// no order), datetime.datetime(...), datetime.date(...), datetime.time(...),
// Decimal('...') and UUID('...'). Other Go values are converted with
// [ToValue] first; one that cannot be converted renders as
// <unrepresentable T>. In a string that is not valid UTF-8 each bad byte
// is written as U+FFFD, since Python strings cannot hold such bytes.
func Repr(v any) string {
	return string(appendRepr(nil, v, 0, math.MaxInt))
}

// ReprLimit is [Repr] cut to at most limit bytes (at a character
// boundary), for showing a value that may be large: it stops writing once
// the limit is passed instead of building the whole text and clipping it,
// so its output, memory and work are bounded by limit whatever v holds
// (beyond one scan of a dict's keys to sort them), and a value that
// expands when written (one big list shared many times) costs no more
// than a small one. truncated reports that s is a cut prefix of Repr(v);
// the caller shows that (with "…", say). limit <= 0 yields "" and
// truncated true for every value.
func ReprLimit(v any, limit int) (s string, truncated bool) {
	b := appendRepr(nil, v, 0, max(limit, 0))
	b, truncated = clipOutput(b, 0, limit)
	return string(b), truncated
}

// clipOutput cuts b[start:] to limit bytes at a UTF-8 character start and
// reports whether it cut.
func clipOutput(b []byte, start, limit int) ([]byte, bool) {
	limit = max(limit, 0)
	if len(b)-start <= limit {
		return b, false
	}
	n := start + limit
	for n > start && !utf8.RuneStart(b[n]) {
		n--
	}
	return b[:n], true
}

// clipInput cuts text that a writer turns into at least one byte per
// byte (repr, JSON strings, base64) to what can pass room bytes of
// output: more than room bytes, cut at a character start so that what
// is kept is written as it would be uncut.
func clipInput[T string | []byte](s T, room int) T {
	room = max(room, 0)
	if len(s)-8 <= room {
		return s
	}
	n := room + 8
	for n > room+4 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// bigIntTooLong reports whether x has more than maxIntDigits decimal
// digits: Python refuses to write such an int (ValueError: Exceeds the
// limit for integer string conversion), and writing one in decimal takes
// time superlinear in its size.
func bigIntTooLong(x *big.Int) bool {
	// 2**(bits-1) <= |x| < 2**bits, and 0.30102 < log10(2) < 0.30103.
	switch bits := x.BitLen(); {
	case (bits-1)*30102 >= maxIntDigits*100000:
		return true
	case bits*30103 <= maxIntDigits*100000:
		return false
	}
	return x.CmpAbs(pow10MaxIntDigits()) >= 0
}

// pow10MaxIntDigits is 10**maxIntDigits, the smallest int too long.
var pow10MaxIntDigits = sync.OnceValue(func() *big.Int {
	return new(big.Int).Exp(big.NewInt(10), big.NewInt(maxIntDigits), nil)
})

// pyTuple renders as a Python tuple: (1, 2), (1,), ().
type pyTuple []any

// appendRepr writes repr(v) to b; lim is where it may stop: once b is
// longer, nothing more of v is written (the caller clips), math.MaxInt
// for the whole text.
func appendRepr(b []byte, v any, depth, lim int) []byte {
	if len(b) > lim {
		return b
	}
	switch x := v.(type) {
	case nil:
		return append(b, "None"...)
	case bool:
		if x {
			return append(b, "True"...)
		}
		return append(b, "False"...)
	case int64:
		return strconv.AppendInt(b, x, 10)
	case *big.Int:
		if x == nil {
			return append(b, "None"...)
		}
		if bigIntTooLong(x) {
			return fmt.Appendf(b, "<int of %d bits>", x.BitLen())
		}
		return x.Append(b, 10)
	case float64:
		return appendPyFloatRepr(b, x, 64)
	case string:
		return appendPyStr(b, x, lim-len(b))
	case []byte:
		return appendPyBytes(b, x, lim-len(b))
	case []any:
		if depth >= maxEncodeDepth {
			return append(b, "[...]"...)
		}
		b = append(b, '[')
		for i, el := range x {
			if len(b) > lim {
				return b
			}
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendRepr(b, el, depth+1, lim)
		}
		return append(b, ']')
	case pyTuple:
		if depth >= maxEncodeDepth {
			return append(b, "(...)"...)
		}
		b = append(b, '(')
		for i, el := range x {
			if len(b) > lim {
				return b
			}
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendRepr(b, el, depth+1, lim)
		}
		if len(x) == 1 {
			b = append(b, ',')
		}
		return append(b, ')')
	case map[string]any:
		if depth >= maxEncodeDepth {
			return append(b, "{...}"...)
		}
		b = append(b, '{')
		for i, k := range sortedKeys(x) {
			if len(b) > lim {
				return b
			}
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPyStr(b, k, lim-len(b))
			b = append(b, ": "...)
			b = appendRepr(b, x[k], depth+1, lim)
		}
		return append(b, '}')
	case time.Time:
		return appendPyDatetime(b, x)
	case Date:
		b = append(b, "datetime.date("...)
		b = strconv.AppendInt(b, int64(x.Year), 10)
		b = append(b, ", "...)
		b = strconv.AppendInt(b, int64(x.Month), 10)
		b = append(b, ", "...)
		b = strconv.AppendInt(b, int64(x.Day), 10)
		return append(b, ')')
	case TimeOfDay:
		b = append(b, "datetime.time("...)
		b = appendClockArgs(b, x.Hour, x.Minute, x.Second, x.Nanosecond/1000)
		return append(b, ')')
	case Decimal:
		b = append(b, "Decimal("...)
		b = appendPyStr(b, string(x), lim-len(b))
		return append(b, ')')
	case UUID:
		b = append(b, "UUID('"...)
		b = append(b, x.String()...)
		return append(b, "')"...)
	}
	if depth >= maxEncodeDepth {
		return append(b, "..."...)
	}
	nv, err := toValue(v, depth)
	if err != nil {
		return fmt.Appendf(b, "<unrepresentable %T>", v)
	}
	return appendRepr(b, nv, depth+1, lim)
}

func sortedKeys(m map[string]any) []string {
	return sortedKeysInto(make([]string, 0, len(m)), m)
}

// sortedKeysInto appends m's keys to buf and sorts them; a caller with a
// small stack array avoids allocating for small maps.
func sortedKeysInto(buf []string, m map[string]any) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}

// appendClockArgs writes "h, m[, s[, us]]": Python's time and datetime
// reprs drop a zero microsecond and then a zero second.
func appendClockArgs(b []byte, h, m, s, us int) []byte {
	b = strconv.AppendInt(b, int64(h), 10)
	b = append(b, ", "...)
	b = strconv.AppendInt(b, int64(m), 10)
	if s != 0 || us != 0 {
		b = append(b, ", "...)
		b = strconv.AppendInt(b, int64(s), 10)
	}
	if us != 0 {
		b = append(b, ", "...)
		b = strconv.AppendInt(b, int64(us), 10)
	}
	return b
}

// appendPyDatetime writes repr() of the aware datetime with t's offset:
// datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).
func appendPyDatetime(b []byte, t time.Time) []byte {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	b = append(b, "datetime.datetime("...)
	b = strconv.AppendInt(b, int64(y), 10)
	b = append(b, ", "...)
	b = strconv.AppendInt(b, int64(mo), 10)
	b = append(b, ", "...)
	b = strconv.AppendInt(b, int64(d), 10)
	b = append(b, ", "...)
	b = appendClockArgs(b, h, mi, s, t.Nanosecond()/1000)
	b = append(b, ", tzinfo="...)
	_, off := t.Zone()
	if off == 0 {
		b = append(b, "datetime.timezone.utc"...)
	} else {
		// timedelta normalises to days >= -1 and 0 <= seconds < 86400.
		days, secs := 0, off
		if off < 0 {
			days, secs = -1, off+86400
		}
		b = append(b, "datetime.timezone(datetime.timedelta("...)
		if days != 0 {
			b = append(b, "days=-1, "...)
		}
		b = append(b, "seconds="...)
		b = strconv.AppendInt(b, int64(secs), 10)
		b = append(b, "))"...)
	}
	return append(b, ')')
}

// appendPyFloatRepr writes repr(float): inf, -inf and nan included.
func appendPyFloatRepr(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "nan"...)
	case math.IsInf(f, 1):
		return append(b, "inf"...)
	case math.IsInf(f, -1):
		return append(b, "-inf"...)
	}
	return appendPyFloat(b, f, bits)
}

// appendPyFloat writes a finite float as Python's float.__repr__ does: the
// shortest digits that round-trip, in positional form when the decimal
// exponent is in [-4, 16), otherwise in exponent form with at least two
// exponent digits; positional form always has a fraction (1.0).
func appendPyFloat(b []byte, f float64, bits int) []byte {
	var tmp [32]byte
	e := strconv.AppendFloat(tmp[:0], f, 'e', -1, bits) // -d.ddde±dd
	if e[0] == '-' {
		b = append(b, '-')
		e = e[1:]
	}
	ePos := 0
	for e[ePos] != 'e' {
		ePos++
	}
	mant := e[:ePos]
	exp, _ := strconv.Atoi(string(e[ePos+1:]))
	var digits [24]byte
	nd := 0
	for _, c := range mant {
		if c != '.' {
			digits[nd] = c
			nd++
		}
	}
	ds := digits[:nd]
	decpt := exp + 1
	if decpt > -4 && decpt <= 16 {
		switch {
		case decpt <= 0:
			b = append(b, "0."...)
			for i := 0; i < -decpt; i++ {
				b = append(b, '0')
			}
			return append(b, ds...)
		case decpt >= nd:
			b = append(b, ds...)
			for i := nd; i < decpt; i++ {
				b = append(b, '0')
			}
			return append(b, ".0"...)
		default:
			b = append(b, ds[:decpt]...)
			b = append(b, '.')
			return append(b, ds[decpt:]...)
		}
	}
	b = append(b, ds[0])
	if nd > 1 {
		b = append(b, '.')
		b = append(b, ds[1:]...)
	}
	b = append(b, 'e')
	if exp < 0 {
		b = append(b, '-')
		exp = -exp
	} else {
		b = append(b, '+')
	}
	if exp < 10 {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, int64(exp), 10)
}

// appendPyStr writes repr(str): single quotes unless the text has a single
// quote and no double quote; printable characters as they are, others as
// \xhh, \uhhhh or \Uhhhhhhhh. Printability follows Go's unicode tables,
// which match Python's str.isprintable except for characters assigned in
// Unicode versions the two do not share. Only what can pass room bytes of
// output is written, but the quote is chosen from the whole text, so that
// a clipped repr is a prefix of the whole one.
func appendPyStr(b []byte, s string, room int) []byte {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	s = clipInput(s, room)
	b = append(b, quote)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case c == quote || c == '\\':
				b = append(b, '\\', c)
			case c == '\t':
				b = append(b, `\t`...)
			case c == '\n':
				b = append(b, `\n`...)
			case c == '\r':
				b = append(b, `\r`...)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case unicode.IsPrint(r):
			b = utf8.AppendRune(b, r)
		case r <= 0xff:
			b = append(b, '\\', 'x', hexDigits[r>>4], hexDigits[r&0xf])
		case r <= 0xffff:
			b = append(b, '\\', 'u')
			b = appendHexN(b, uint32(r), 4)
		default:
			b = append(b, '\\', 'U')
			b = appendHexN(b, uint32(r), 8)
		}
	}
	return append(b, quote)
}

// appendPyBytes writes repr(bytes): b'...' with printable ASCII as is and
// everything else escaped; clipped and quoted as appendPyStr.
func appendPyBytes(b []byte, s []byte, room int) []byte {
	quote := byte('\'')
	if slices.Contains(s, '\'') && !slices.Contains(s, '"') {
		quote = '"'
	}
	s = clipInput(s, room)
	b = append(b, 'b', quote)
	for _, c := range s {
		switch {
		case c == quote || c == '\\':
			b = append(b, '\\', c)
		case c == '\t':
			b = append(b, `\t`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '\r':
			b = append(b, `\r`...)
		case c < 0x20 || c >= 0x7f:
			b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, quote)
}

func appendHexN(b []byte, v uint32, n int) []byte {
	for i := n - 1; i >= 0; i-- {
		b = append(b, hexDigits[v>>(4*uint(i))&0xf])
	}
	return b
}

// ReprArgs renders positional arguments as Celery does for the argsrepr
// header: the Python tuple of args through celery.utils.saferepr with
// Celery's limit of ReprMaxSize characters: (2, 3), (2,), ().
func ReprArgs(args []any) string {
	return SafeRepr(pyTuple(args), ReprMaxSize)
}

// ReprKwargs renders keyword arguments as Celery does for the kwargsrepr
// header: saferepr of the dict with a limit of ReprMaxSize characters.
func ReprKwargs(kwargs map[string]any) string {
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	return SafeRepr(kwargs, ReprMaxSize)
}

// SafeRepr renders v as Celery's celery.utils.saferepr(v, maxLen) does,
// with its quirks reproduced so that the output matches what a Python
// producer writes into argsrepr and kwargsrepr:
//
//   - containers nested three levels deep are elided as [...], {...};
//   - strings are quoted with single quotes and only ' is escaped (no repr
//     escapes); bytes are shown as their UTF-8 text or, if not UTF-8, as
//     hex;
//   - once maxLen characters (Python code points) have been written, the
//     next token is replaced by ", ..." and only the closing brackets
//     follow; a token that would cross the limit is cut at the last space
//     before it and gets "..." appended.
//
// maxLen <= 0 means no limit. Dict keys are rendered in sorted order.
func SafeRepr(v any, maxLen int) string {
	s := safeRepr{limited: maxLen > 0, left: maxLen}
	s.value(v)
	return string(s.out)
}

// safeRepr reproduces the token stream of celery.utils.saferepr: every
// scalar, bracket, separator and key is one token; the length budget is
// checked before each token.
type safeRepr struct {
	out     []byte
	limited bool
	left    int // characters left, when limited
	level   int
	stopped bool
	// ends holds the closing brackets of the containers entered so far,
	// innermost last; they are written when the budget runs out.
	ends []string
}

const safeReprMaxLevels = 3

// budget reports whether another token may be written, and ends the output
// if not.
func (s *safeRepr) budget() bool {
	if s.stopped {
		return false
	}
	if s.limited && s.left <= 0 {
		s.out = append(s.out, ", ..."...)
		for i := len(s.ends) - 1; i >= 0; i-- {
			s.out = append(s.out, s.ends[i]...)
		}
		s.stopped = true
		return false
	}
	return true
}

func (s *safeRepr) write(text string) {
	s.out = append(s.out, text...)
	if s.limited {
		s.left -= utf8.RuneCountInString(text)
	}
}

// literal writes a bracket or separator token.
func (s *safeRepr) literal(text string) {
	if s.budget() {
		s.write(text)
	}
}

// text writes a scalar token, truncated to the budget.
func (s *safeRepr) text(text string) {
	if s.budget() {
		s.write(s.truncate(text))
	}
}

// truncate is celery.utils.text.truncate(text, left): text of left or more
// characters is cut to left characters, then back to its last space, and
// gets "...".
func (s *safeRepr) truncate(text string) string {
	if !s.limited || utf8.RuneCountInString(text) < s.left {
		return text
	}
	cut := text
	n := 0
	for i := range text {
		if n == s.left {
			cut = text[:i]
			break
		}
		n++
	}
	if sp := strings.LastIndexByte(cut, ' '); sp >= 0 {
		cut = cut[:sp]
	}
	return cut + "..."
}

func (s *safeRepr) value(v any) {
	if s.stopped {
		return
	}
	switch x := v.(type) {
	case string:
		if s.budget() {
			s.write("'" + strings.ReplaceAll(s.truncate(x), "'", `\'`) + "'")
		}
	case []byte:
		if s.budget() {
			s.write(s.bytesText(x))
		}
	case []any:
		s.container("[", "]", len(x), func(i int) { s.value(x[i]) })
	case pyTuple:
		end := ")"
		if len(x) == 1 {
			end = ",)"
		}
		s.container("(", end, len(x), func(i int) { s.value(x[i]) })
	case map[string]any:
		keys := sortedKeys(x)
		s.container("{", "}", len(keys), func(i int) {
			if s.budget() {
				// saferepr renders each key with a nested saferepr call
				// given the budget left.
				limit := s.left
				if !s.limited {
					limit = 0
				}
				s.write(SafeRepr(keys[i], limit))
			}
			s.literal(": ")
			s.value(x[keys[i]])
		})
	case OrderedDict:
		s.container("{", "}", len(x.Keys), func(i int) {
			if s.budget() {
				limit := s.left
				if !s.limited {
					limit = 0
				}
				s.write(SafeRepr(x.Keys[i], limit))
			}
			s.literal(": ")
			s.value(x.Values[x.Keys[i]])
		})
	case nil, bool, int64, *big.Int, float64, time.Time, Date, TimeOfDay, Decimal, UUID:
		s.text(Repr(x))
	default:
		nv, err := toValue(v, 0)
		if err != nil {
			s.text(fmt.Sprintf("<unrepresentable %T>", v))
			return
		}
		s.value(nv)
	}
}

func (s *safeRepr) container(start, end string, n int, elem func(int)) {
	if s.level >= safeReprMaxLevels {
		s.text(start + "..." + end)
		return
	}
	s.ends = append(s.ends, end)
	if s.budget() {
		s.write(start)
	}
	s.level++
	for i := 0; i < n && !s.stopped; i++ {
		elem(i)
		if i < n-1 {
			s.literal(", ")
		}
	}
	s.level--
	s.ends = s.ends[:len(s.ends)-1]
	s.literal(end)
}

// bytesText is saferepr's bytes form: b'<utf-8 text>' or b'<hex>', cut to
// the budget with "..." inside the quotes.
func (s *safeRepr) bytesText(x []byte) string {
	suffix := ""
	if s.limited && len(x) > s.left {
		x = x[:s.left]
		suffix = "..."
	}
	body := ""
	if utf8.Valid(x) {
		body = string(x)
	} else {
		body = fmt.Sprintf("%x", x)
	}
	return "b'" + body + suffix + "'"
}

// ExceptionMessage is str(exception) of a Python exception with these
// arguments: "" for none, the argument itself for one (str of a string is
// the string), and the repr of the argument tuple for more.
func ExceptionMessage(args []any) string {
	switch len(args) {
	case 0:
		return ""
	case 1:
		if s, ok := args[0].(string); ok {
			return s
		}
		return Repr(args[0])
	}
	return Repr(pyTuple(args))
}
