package protocol

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// BindError reports a decoded value that could not be bound to a Go value,
// and where it was.
type BindError struct {
	// Path locates the value: "arg 1", "arg 0[2].name", "kwargs.order.id",
	// or "" for the value given to Bind itself. Positions count from 0, as
	// in Args.
	Path string
	// Err says what went wrong, for example
	// `cannot bind string "x" to int`.
	Err error
}

// Error returns "protocol: <path>: <cause>".
func (e *BindError) Error() string {
	if e.Path == "" {
		return "protocol: " + e.Err.Error()
	}
	return "protocol: " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *BindError) Unwrap() error { return e.Err }

// Bind stores the decoded value src (one of the package's value types, or
// any Go value [ToValue] accepts) into the Go value dst points to,
// converting as a handler would expect:
//
//   - integer kinds from integers, and from floats with no fraction, with
//     range checks (a *big.Int or any value out of range is an error);
//   - float kinds from floats and integers;
//   - string from a string, from UTF-8 []byte, and from time.Time, Date,
//     TimeOfDay, Decimal and UUID as their Python text (what a Celery 5.2
//     producer sends for them), so a handler works with either kombu
//     version;
//   - bool from a bool;
//   - []T from a list ([]byte also from bytes or a string), [N]T from a
//     list of exactly N elements, map[string]T from an object;
//   - structs from an object: a field takes the key named by its
//     `celery:"name"` tag, else its `json:"name"` tag, else its exact Go
//     name; "-" skips the field; unknown keys are ignored; a field tagged
//     `celery:"name,required"` (or `celery:",required"`) must be present;
//   - pointers: None gives a nil pointer, anything else a new value;
//     slices, maps and interfaces take None as nil; other kinds refuse it;
//   - any (and any interface the value implements) takes the value as it
//     is;
//   - time.Time from a time.Time or an ISO 8601 string ([ParseTime]);
//     Date, TimeOfDay, Decimal and UUID from themselves or their text (and
//     Date from a time.Time, Decimal from a number, UUID from 16 bytes);
//     *big.Int and big.Int from any integer;
//   - types implementing encoding.TextUnmarshaler from a string, and
//     json.Unmarshaler from any value (re-encoded as JSON for it).
//
// Errors are *BindError values that name where and what, such as
// `protocol: [2]: cannot bind string "x" to int`. dst must be a non-nil
// pointer.
func Bind(src any, dst any) error {
	return bindRoot("", src, dst)
}

// BindArgs binds positional arguments into the values dst point to, in
// order, so a handler can write:
//
//	var a, b int
//	if err := protocol.BindArgs(t.Args, &a, &b); err != nil { ... }
//
// There must be exactly one argument for each dst, as a Python function
// without defaults requires: a missing argument is an error naming its
// position, and so is an extra one (slice Args to bind a prefix).
func BindArgs(args []any, dst ...any) error {
	if len(args) < len(dst) {
		return &BindError{
			Path: "arg " + strconv.Itoa(len(args)),
			Err:  fmt.Errorf("missing: got %d positional arguments, want %d", len(args), len(dst)),
		}
	}
	if len(args) > len(dst) {
		return &BindError{
			Path: "arg " + strconv.Itoa(len(dst)),
			Err:  fmt.Errorf("unexpected: got %d positional arguments, want %d", len(args), len(dst)),
		}
	}
	for i, d := range dst {
		if err := bindRoot("arg "+strconv.Itoa(i), args[i], d); err != nil {
			return err
		}
	}
	return nil
}

// BindKwargs binds keyword arguments into the struct or map dst points to,
// with the rules of [Bind]; errors are reported under "kwargs", such as
// `protocol: kwargs.order.id: cannot bind string "x" to int`.
func BindKwargs(kwargs map[string]any, dst any) error {
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	return bindRoot("kwargs", kwargs, dst)
}

func bindRoot(root string, src, dst any) error {
	rv := reflect.ValueOf(dst)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return &BindError{Path: root, Err: fmt.Errorf("destination must be a non-nil pointer, not %T", dst)}
	}
	b := binder{root: root}
	return b.bind(src, rv.Elem())
}

// binder keeps the path to the value being bound; it is rendered only when
// an error occurs.
type binder struct {
	root string
	path []pathSeg
}

type pathSeg struct {
	name  string // a field or map key; empty for an index
	index int
}

func (b *binder) fail(err error) error {
	var sb strings.Builder
	sb.WriteString(b.root)
	for _, s := range b.path {
		if s.name == "" {
			sb.WriteByte('[')
			sb.WriteString(strconv.Itoa(s.index))
			sb.WriteByte(']')
			continue
		}
		if sb.Len() > 0 {
			sb.WriteByte('.')
		}
		sb.WriteString(s.name)
	}
	return &BindError{Path: sb.String(), Err: err}
}

func (b *binder) mismatch(src any, t reflect.Type) error {
	return b.fail(fmt.Errorf("cannot bind %s to %s", describe(src), t))
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	dateType      = reflect.TypeFor[Date]()
	timeOfDayType = reflect.TypeFor[TimeOfDay]()
	decimalType   = reflect.TypeFor[Decimal]()
	uuidType      = reflect.TypeFor[UUID]()
	bigIntType    = reflect.TypeFor[big.Int]()
	textUnmarshal = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonUnmarshal = reflect.TypeFor[json.Unmarshaler]()
)

func (b *binder) bind(src any, dv reflect.Value) error {
	src, err := canonical(src)
	if err != nil {
		return b.fail(err)
	}
	t := dv.Type()
	switch t.Kind() {
	case reflect.Pointer:
		if src == nil {
			dv.SetZero()
			return nil
		}
		if dv.IsNil() {
			dv.Set(reflect.New(t.Elem()))
		}
		return b.bind(src, dv.Elem())
	case reflect.Interface:
		if src == nil {
			dv.SetZero()
			return nil
		}
		sv := reflect.ValueOf(src)
		if !sv.Type().AssignableTo(t) {
			return b.mismatch(src, t)
		}
		dv.Set(sv)
		return nil
	}
	if done, err := b.bindSpecial(src, dv); done {
		return err
	}
	if dv.CanAddr() {
		pt := reflect.PointerTo(t)
		if s, ok := src.(string); ok && pt.Implements(textUnmarshal) {
			if err := dv.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
				return b.fail(fmt.Errorf("cannot bind %s to %s: %w", describe(src), t, err))
			}
			return nil
		}
		if pt.Implements(jsonUnmarshal) {
			data, err := AppendJSON(nil, src, JSONOptions{})
			if err == nil {
				err = dv.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(data)
			}
			if err != nil {
				return b.fail(fmt.Errorf("cannot bind %s to %s: %w", describe(src), t, err))
			}
			return nil
		}
	}
	if src == nil {
		switch t.Kind() {
		case reflect.Slice, reflect.Map:
			dv.SetZero()
			return nil
		}
		return b.mismatch(src, t)
	}
	switch t.Kind() {
	case reflect.Bool:
		if x, ok := src.(bool); ok {
			dv.SetBool(x)
			return nil
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := intOf(src)
		if !ok {
			break
		}
		if !n.IsInt64() || dv.OverflowInt(n.Int64()) {
			return b.fail(fmt.Errorf("cannot bind %s to %s: out of range", describe(src), t))
		}
		dv.SetInt(n.Int64())
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n, ok := intOf(src)
		if !ok {
			break
		}
		if !n.IsUint64() || dv.OverflowUint(n.Uint64()) {
			return b.fail(fmt.Errorf("cannot bind %s to %s: out of range", describe(src), t))
		}
		dv.SetUint(n.Uint64())
		return nil
	case reflect.Float32, reflect.Float64:
		var f float64
		switch x := src.(type) {
		case float64:
			f = x
		case int64:
			f = float64(x)
		case *big.Int:
			f, _ = new(big.Float).SetInt(x).Float64()
		default:
			return b.mismatch(src, t)
		}
		if dv.OverflowFloat(f) {
			return b.fail(fmt.Errorf("cannot bind %s to %s: out of range", describe(src), t))
		}
		dv.SetFloat(f)
		return nil
	case reflect.String:
		if s, ok := textOf(src); ok {
			dv.SetString(s)
			return nil
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			switch x := src.(type) {
			case []byte:
				dv.SetBytes(slices.Clone(x))
				return nil
			case string:
				dv.SetBytes([]byte(x))
				return nil
			}
		}
		list, ok := src.([]any)
		if !ok {
			break
		}
		out := reflect.MakeSlice(t, len(list), len(list))
		for i, el := range list {
			b.path = append(b.path, pathSeg{index: i})
			if err := b.bind(el, out.Index(i)); err != nil {
				return err
			}
			b.path = b.path[:len(b.path)-1]
		}
		dv.Set(out)
		return nil
	case reflect.Array:
		if x, ok := src.([]byte); ok && t.Elem().Kind() == reflect.Uint8 {
			if len(x) != t.Len() {
				return b.fail(fmt.Errorf("cannot bind %s to %s: length differs", describe(src), t))
			}
			reflect.Copy(dv, reflect.ValueOf(x))
			return nil
		}
		list, ok := src.([]any)
		if !ok {
			break
		}
		if len(list) != t.Len() {
			return b.fail(fmt.Errorf("cannot bind %s to %s: length differs", describe(src), t))
		}
		for i, el := range list {
			b.path = append(b.path, pathSeg{index: i})
			if err := b.bind(el, dv.Index(i)); err != nil {
				return err
			}
			b.path = b.path[:len(b.path)-1]
		}
		return nil
	case reflect.Map:
		obj, ok := src.(map[string]any)
		if !ok {
			break
		}
		if t.Key().Kind() != reflect.String {
			return b.fail(fmt.Errorf("cannot bind an object to %s: keys must be strings", t))
		}
		out := reflect.MakeMapWithSize(t, len(obj))
		for _, k := range sortedKeys(obj) {
			b.path = append(b.path, pathSeg{name: k})
			ev := reflect.New(t.Elem()).Elem()
			if err := b.bind(obj[k], ev); err != nil {
				return err
			}
			out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), ev)
			b.path = b.path[:len(b.path)-1]
		}
		dv.Set(out)
		return nil
	case reflect.Struct:
		obj, ok := src.(map[string]any)
		if !ok {
			break
		}
		return b.bindStruct(obj, dv)
	}
	return b.mismatch(src, t)
}

// bindSpecial handles the value types and big.Int, whose kinds (struct,
// string, array) would otherwise be bound field by field.
func (b *binder) bindSpecial(src any, dv reflect.Value) (bool, error) {
	t := dv.Type()
	var out any
	var err error
	switch t {
	case timeType:
		switch x := src.(type) {
		case time.Time:
			out = x
		case string:
			out, err = ParseTime(x)
		}
	case dateType:
		switch x := src.(type) {
		case Date:
			out = x
		case time.Time:
			out = Date{Year: x.Year(), Month: x.Month(), Day: x.Day()}
		case string:
			out, err = ParseDate(x)
		}
	case timeOfDayType:
		switch x := src.(type) {
		case TimeOfDay:
			out = x
		case string:
			out, err = ParseTimeOfDay(x)
		}
	case decimalType:
		switch x := src.(type) {
		case Decimal:
			out = x
		case string:
			out, err = ParseDecimal(x)
		case int64:
			out = Decimal(strconv.FormatInt(x, 10))
		case *big.Int:
			out = Decimal(x.String())
		case float64:
			switch {
			case math.IsNaN(x):
				out = Decimal("NaN")
			case math.IsInf(x, 1):
				out = Decimal("Infinity")
			case math.IsInf(x, -1):
				out = Decimal("-Infinity")
			default:
				out = Decimal(appendPyFloat(nil, x, 64))
			}
		}
	case uuidType:
		switch x := src.(type) {
		case UUID:
			out = x
		case string:
			out, err = ParseUUID(x)
		case []byte:
			if len(x) == 16 {
				out = UUID(x)
			}
		}
	case bigIntType:
		n, ok := intOf(src)
		if ok {
			dv.Addr().Interface().(*big.Int).Set(n)
			return true, nil
		}
	default:
		return false, nil
	}
	if err != nil {
		return true, b.fail(fmt.Errorf("cannot bind %s to %s: %w", describe(src), t, err))
	}
	if out == nil {
		return true, b.mismatch(src, t)
	}
	dv.Set(reflect.ValueOf(out).Convert(t))
	return true, nil
}

func (b *binder) bindStruct(obj map[string]any, dv reflect.Value) error {
	for _, f := range reflect.VisibleFields(dv.Type()) {
		name, required, ok := fieldName(f)
		if !ok {
			continue
		}
		b.path = append(b.path, pathSeg{name: name})
		v, present := obj[name]
		if !present {
			if required {
				return b.fail(errors.New("required but missing"))
			}
			b.path = b.path[:len(b.path)-1]
			continue
		}
		fv, err := fieldByIndex(dv, f.Index)
		if err != nil {
			return b.fail(err)
		}
		if err := b.bind(v, fv); err != nil {
			return err
		}
		b.path = b.path[:len(b.path)-1]
	}
	return nil
}

// fieldName returns the key a struct field binds from, whether it is
// required, and false for fields that take no key.
func fieldName(f reflect.StructField) (name string, required, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	if tag, has := f.Tag.Lookup("celery"); has {
		var opts string
		name, opts, _ = strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			return "", false, false
		}
		for _, o := range strings.Split(opts, ",") {
			required = required || o == "required"
		}
	}
	if name == "" {
		if tag, has := f.Tag.Lookup("json"); has {
			jname, _, _ := strings.Cut(tag, ",")
			if jname == "-" {
				return "", false, false
			}
			name = jname
		}
	}
	if name != "" {
		return name, required, true
	}
	if f.Anonymous {
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			// Its fields are promoted; reflect.VisibleFields lists them.
			return "", false, false
		}
	}
	return f.Name, required, true
}

// fieldByIndex is reflect.Value.FieldByIndex that allocates nil embedded
// struct pointers on the way.
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, error) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				if !v.CanSet() {
					return reflect.Value{}, fmt.Errorf("cannot set embedded pointer to unexported struct %s", v.Type().Elem())
				}
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, nil
}

// canonical turns Go scalars and containers into value types, so binding
// also works on values a caller built by hand.
func canonical(src any) (any, error) {
	switch src.(type) {
	case nil, bool, int64, float64, string, []any, map[string]any, *big.Int, []byte,
		time.Time, Date, TimeOfDay, Decimal, UUID:
		return src, nil
	}
	return toValue(src, 0)
}

// intOf returns an integer value, or a float with no fraction, as a
// big.Int.
func intOf(src any) (*big.Int, bool) {
	switch x := src.(type) {
	case int64:
		return big.NewInt(x), true
	case *big.Int:
		return x, true
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) || x != math.Trunc(x) {
			return nil, false
		}
		n, _ := big.NewFloat(x).Int(nil)
		return n, true
	}
	return nil, false
}

// textOf returns the text a string destination takes from src.
func textOf(src any) (string, bool) {
	switch x := src.(type) {
	case string:
		return x, true
	case []byte:
		if utf8.Valid(x) {
			return string(x), true
		}
	case time.Time:
		return FormatTime(x), true
	case Date:
		return x.String(), true
	case TimeOfDay:
		return x.String(), true
	case Decimal:
		return string(x), true
	case UUID:
		return x.String(), true
	}
	return "", false
}

// describe names a value for an error message: its type in Python's terms
// and a short rendering.
func describe(v any) string {
	const maxLen = 40
	short := func(s string) string {
		if utf8.RuneCountInString(s) <= maxLen {
			return s
		}
		r := []rune(s)
		return string(r[:maxLen]) + "…"
	}
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "bool True"
		}
		return "bool False"
	case int64:
		return "int " + strconv.FormatInt(x, 10)
	case *big.Int:
		return "int " + short(x.String())
	case float64:
		return "float " + string(appendPyFloatRepr(nil, x, 64))
	case string:
		return "string " + strconv.Quote(short(x))
	case []byte:
		return fmt.Sprintf("bytes of length %d", len(x))
	case []any:
		return fmt.Sprintf("list of length %d", len(x))
	case map[string]any:
		return "object"
	case time.Time:
		return "datetime " + FormatTime(x)
	case Date:
		return "date " + x.String()
	case TimeOfDay:
		return "time " + x.String()
	case Decimal:
		return "decimal " + short(string(x))
	case UUID:
		return "uuid " + x.String()
	}
	return fmt.Sprintf("%T", v)
}
