package amqp

import (
	"errors"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestFromTable(t *testing.T) {
	ts := time.Unix(1700000000, 0)
	give := amqp091.Table{
		"b": true, "u8": uint8(200), "i8": int8(-3), "i16": int16(-300), "u16": uint16(60000),
		"i32": int32(-70000), "u32": uint32(4000000000), "i64": int64(1700000000000),
		"f32": float32(0.5), "f64": 0.25, "s": "x", "bytes": []byte("raw"), "void": nil,
		"dec": amqp091.Decimal{Scale: 2, Value: 1234}, "ts": ts,
		"arr":    []any{int32(1), "two", amqp091.Table{"k": int16(3)}},
		"nested": amqp091.Table{"deep": amqp091.Table{"x": []any{}}},
	}
	want := map[string]any{
		"b": true, "u8": int64(200), "i8": int64(-3), "i16": int64(-300), "u16": int64(60000),
		"i32": int64(-70000), "u32": int64(4000000000), "i64": int64(1700000000000),
		"f32": 0.5, "f64": 0.25, "s": "x", "bytes": []byte("raw"), "void": nil,
		"dec": protocol.Decimal("12.34"), "ts": ts.UTC(),
		"arr":    []any{int64(1), "two", map[string]any{"k": int64(3)}},
		"nested": map[string]any{"deep": map[string]any{"x": []any{}}},
	}
	got, err := fromTable(give)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fromTable() mismatch (-want +got):\n%s", diff)
	}
	if h, err := fromTable(nil); h != nil || err != nil {
		t.Errorf("fromTable(nil) = %v, %v; want nil, nil", h, err)
	}
	if _, err := fromTable(amqp091.Table{"x": struct{}{}}); err == nil {
		t.Error("fromTable accepted an unknown Go type")
	}
}

func TestToTable(t *testing.T) {
	ts := time.Date(2026, 11, 29, 13, 0, 0, 999, time.FixedZone("x", 3600))
	give := map[string]any{
		"small": int64(7), "big": int64(1700000000000), "neg": int64(-5000000000),
		"edge": int64(math.MinInt32), "int": 3, "u64": uint64(5), "bigint": big.NewInt(42),
		"f": 1.5, "f32": float32(0.5), "f32digits": float32(0.1), "s": "x", "b": false, "nil": nil, "bytes": []byte{1},
		"dec": protocol.Decimal("-0.005"), "ts": ts,
		"list":  []any{int64(1), []any{"a"}, map[string]any{"k": int64(1) << 40}},
		"strs":  []string{"a", "b"},
		"smap":  map[string]string{"k": "v"},
		"table": map[string]any{"x": nil},
	}
	want := amqp091.Table{
		"small": int32(7), "big": int64(1700000000000), "neg": int64(-5000000000),
		"edge": int32(math.MinInt32), "int": int32(3), "u64": int32(5), "bigint": int32(42),
		"f": 1.5, "f32": 0.5, "f32digits": 0.1, "s": "x", "b": false, "nil": nil, "bytes": []byte{1},
		"dec": amqp091.Decimal{Scale: 3, Value: -5}, "ts": time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		"list":  []any{int32(1), []any{"a"}, amqp091.Table{"k": int64(1) << 40}},
		"strs":  []any{"a", "b"},
		"smap":  amqp091.Table{"k": "v"},
		"table": amqp091.Table{"x": nil},
	}
	got, err := toTable(give)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("toTable() mismatch (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("amqp091 refuses the table: %v", err)
	}
}

func TestToTableErrors(t *testing.T) {
	huge := new(big.Int).Lsh(big.NewInt(1), 70)
	deep := map[string]any{}
	cur := deep
	for range maxValueDepth + 2 {
		next := map[string]any{}
		cur["d"] = next
		cur = next
	}
	tests := []struct {
		name string
		give map[string]any
		want string
	}{
		{"big int", map[string]any{"x": huge}, "does not fit int64"},
		{"uint64 overflow", map[string]any{"x": uint64(math.MaxUint64)}, "does not fit int64"},
		{"date", map[string]any{"x": protocol.Date{Year: 2026, Month: 1, Day: 2}}, "no AMQP field type"},
		{"uuid", map[string]any{"x": protocol.UUID{}}, "no AMQP field type"},
		{"decimal too long", map[string]any{"x": protocol.Decimal("12345678901.5")}, "does not fit"},
		{"decimal nan", map[string]any{"x": protocol.Decimal("NaN")}, "does not fit"},
		{"in a list", map[string]any{"x": []any{1, struct{}{}}}, "[1]"},
		{"too deep", deep, "nested too deeply"},
		{"long key", map[string]any{strings.Repeat("k", 256): 1}, "longer than 255"},
		// RabbitMQ closes the connection over these (TestPublishBrokerClosesConnection).
		{"nan", map[string]any{"x": math.NaN()}, "NaN is not a finite number"},
		{"float32 nan", map[string]any{"x": float32(math.NaN())}, "NaN is not a finite number"},
		{"inf", map[string]any{"x": math.Inf(1)}, "+Inf is not a finite number"},
		{"float32 -inf", map[string]any{"x": float32(math.Inf(-1))}, "-Inf is not a finite number"},
		{"nan in a list", map[string]any{"x": []any{1.5, math.NaN()}}, "[1]"},
		{"inf in a table", map[string]any{"x": map[string]any{"f": math.Inf(1)}}, `header "f"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := toTable(tt.give)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("toTable() error = %v, want one containing %q", err, tt.want)
			}
			// The same value fails the same way each time: not worth a retry.
			if !errors.Is(err, protocol.ErrUnencodable) {
				t.Errorf("toTable() error = %v, want one wrapping protocol.ErrUnencodable", err)
			}
		})
	}
}

func TestDecimal(t *testing.T) {
	tests := []struct {
		text string
		dec  amqp091.Decimal
		back string // decimalText of dec, when it differs from text
	}{
		{"12.34", amqp091.Decimal{Scale: 2, Value: 1234}, ""},
		{"-0.005", amqp091.Decimal{Scale: 3, Value: -5}, ""},
		{"0", amqp091.Decimal{Scale: 0, Value: 0}, ""},
		{"7", amqp091.Decimal{Scale: 0, Value: 7}, ""},
		{"1E+2", amqp091.Decimal{Scale: 0, Value: 100}, "100"},
		{"1.5e-3", amqp091.Decimal{Scale: 4, Value: 15}, "0.0015"},
		{"+2147483647", amqp091.Decimal{Scale: 0, Value: math.MaxInt32}, "2147483647"},
		{"-2147483648", amqp091.Decimal{Scale: 0, Value: math.MinInt32}, ""},
		{"000.10", amqp091.Decimal{Scale: 2, Value: 10}, "0.10"},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			got, err := decimalField(protocol.Decimal(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.dec {
				t.Errorf("decimalField(%q) = %+v, want %+v", tt.text, got, tt.dec)
			}
			back := tt.back
			if back == "" {
				back = strings.TrimPrefix(tt.text, "+")
			}
			if s := decimalText(got); string(s) != back {
				t.Errorf("decimalText(%+v) = %q, want %q", got, s, back)
			}
		})
	}
	for _, bad := range []string{"", "-", ".", "1.2.3", "2147483648", "1e10", "abc", "1e-300", "Infinity"} {
		if d, err := decimalField(protocol.Decimal(bad)); err == nil {
			t.Errorf("decimalField(%q) = %+v, want an error", bad, d)
		}
	}
}

func TestMessageRoundTrip(t *testing.T) {
	ts := time.Unix(1700000000, 0).UTC()
	m := protocol.Message{
		ContentType:     protocol.ContentTypeJSON,
		ContentEncoding: "utf-8",
		Headers:         map[string]any{"task": "tasks.add", "id": "abc", "retries": int64(0), "timelimit": []any{nil, nil}},
		Body:            []byte(`[[2, 3], {}, {}]`),
		Properties: protocol.Properties{
			CorrelationID: "abc", ReplyTo: "oid", DeliveryMode: 2, Priority: 7, Expiration: "60000",
			Extra: map[string]any{"message_id": "m1", "timestamp": ts, "type": "t", "user_id": "guest",
				"app_id": "celeriac", "origin": "dropped on AMQP"},
		},
	}
	pub, err := publishingFromMessage(&m)
	if err != nil {
		t.Fatal(err)
	}
	d := amqp091.Delivery{
		Headers: pub.Headers, ContentType: pub.ContentType, ContentEncoding: pub.ContentEncoding,
		DeliveryMode: pub.DeliveryMode, Priority: pub.Priority, CorrelationId: pub.CorrelationId,
		ReplyTo: pub.ReplyTo, Expiration: pub.Expiration, MessageId: pub.MessageId, Timestamp: pub.Timestamp,
		Type: pub.Type, UserId: pub.UserId, AppId: pub.AppId, Body: pub.Body,
	}
	got, err := messageFromDelivery(&d)
	if err != nil {
		t.Fatal(err)
	}
	want := m
	want.Properties.Extra = map[string]any{"message_id": "m1", "timestamp": ts, "type": "t", "user_id": "guest", "app_id": "celeriac"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}
}

func TestPublishingErrors(t *testing.T) {
	tests := []struct {
		name string
		give protocol.Message
		want string
	}{
		{"priority", protocol.Message{Properties: protocol.Properties{Priority: 256}}, "outside 0..255"},
		{"negative priority", protocol.Message{Properties: protocol.Properties{Priority: -1}}, "outside 0..255"},
		{"message_id type", protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"message_id": 5}}}, "must be a string"},
		{"timestamp type", protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"timestamp": "now"}}}, "timestamp"},
		{"long shortstr", protocol.Message{ContentType: strings.Repeat("x", 256)}, "longer than 255"},
		{"header", protocol.Message{Headers: map[string]any{"x": protocol.TimeOfDay{}}}, "no AMQP field type"},
		{"nan header", protocol.Message{Headers: map[string]any{"x": math.NaN()}}, `amqp: header "x": protocol: cannot encode value: NaN`},
		{"timestamp nan", protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"timestamp": math.NaN()}}}, "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := publishingFromMessage(&tt.give)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, protocol.ErrUnencodable) {
				t.Errorf("error = %v, want one wrapping protocol.ErrUnencodable", err)
			}
		})
	}
}

// TestHeaderBytesNotUTF8 follows py-amqp: Python bytes go out as a long
// string ('S'), and an 'S' that is not valid UTF-8 is read back as bytes. So
// such a string reaches handlers as []byte, and a []byte that is not valid
// UTF-8 is written as 'S' again (the bytes and the tag it arrived with),
// while valid UTF-8 bytes stay 'x' (an 'S' would reach Python as str).
func TestHeaderBytesNotUTF8(t *testing.T) {
	raw := "\xff\x00raw\xc3"
	got, err := fromTable(amqp091.Table{"bin": raw, "text": "héllo", "arr": []any{raw}, "t": amqp091.Table{"bin": raw}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"bin": []byte(raw), "text": "héllo", "arr": []any{[]byte(raw)}, "t": map[string]any{"bin": []byte(raw)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fromTable() mismatch (-want +got):\n%s", diff)
	}
	back, err := toTable(map[string]any{"bin": []byte(raw), "utf8": []byte("ok"), "arr": []any{[]byte(raw)}})
	if err != nil {
		t.Fatal(err)
	}
	wantBack := amqp091.Table{"bin": raw, "utf8": []byte("ok"), "arr": []any{raw}}
	if diff := cmp.Diff(wantBack, back); diff != "" {
		t.Errorf("toTable() mismatch (-want +got):\n%s", diff)
	}
}

// FuzzHeaderConversion builds an amqp091 table from the fuzz input (a small
// program of value constructors), converts it to protocol values and back:
// no panic, the result passes amqp091's validation, and a second round trip
// is stable (the conversion reaches a fixed point after one normalisation).
func FuzzHeaderConversion(f *testing.F) {
	f.Add([]byte("s\x05hellol\x01\x02\x03\x04\x05\x06\x07\x08F\x02I\x00\x00\x00\x07]A\x02tVD\x02\x00\x00\x04\xd2"))
	f.Add([]byte("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"))
	f.Add([]byte("T\x00\x00\x00\x00\x65\x53\xf1\x00b\x80B\xffu\xff\xffi\xff\xff\xff\xfff\x3f\x80\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		g := &tableGen{data: data}
		tbl := g.table(0)
		m, err := fromTable(tbl)
		if err != nil {
			if errors.Is(err, errValueDepth) {
				return
			}
			t.Fatalf("fromTable: %v", err)
		}
		back, err := toTable(m)
		if err != nil {
			// Decimals whose text form re-parses out of range, and NaN or
			// infinite floats (which RabbitMQ never delivers: it cannot
			// parse them), are the only expected refusals; any other is a
			// bug.
			if strings.Contains(err.Error(), "decimal") || strings.Contains(err.Error(), "is not a finite number") {
				return
			}
			t.Fatalf("toTable(fromTable(x)): %v", err)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("amqp091 refuses the converted table: %v", err)
		}
		// The dead-letter reader must cope with any x-death content.
		if _, err := deadMessage(&amqp091.Delivery{Headers: amqp091.Table{"x-death": []any{tbl, tbl["a"]}, "id": tbl["b"]}}, "q"); err != nil &&
			!errors.Is(err, errValueDepth) {
			t.Fatalf("deadMessage: %v", err)
		}
		m2, err := fromTable(back)
		if err != nil {
			t.Fatalf("second fromTable: %v", err)
		}
		// cmp compares nested slices by edit distance, in time and memory
		// exponential in the nesting (a 66-byte input took 538 MiB, even
		// with cmp.Equal): compare plainly, and diff only what differs.
		if !equalNaN(m, m2) {
			t.Fatalf("round trip not stable (-first +second):\n%s", cmp.Diff(m, m2, cmpopts.EquateNaNs()))
		}
	})
}

// tableGen turns bytes into amqp091 values: each byte picks a constructor,
// following bytes give its payload.
// equalNaN is reflect.DeepEqual with NaN equal to NaN, in time linear in
// the values.
func equalNaN(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equalNaN(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalNaN(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	case float32:
		y, ok := b.(float32)
		return ok && (x == y || math.IsNaN(float64(x)) && math.IsNaN(float64(y)))
	}
	return reflect.DeepEqual(a, b)
}

type tableGen struct {
	data []byte
	pos  int
}

func (g *tableGen) next() (byte, bool) {
	if g.pos >= len(g.data) {
		return 0, false
	}
	b := g.data[g.pos]
	g.pos++
	return b, true
}

func (g *tableGen) u64(n int) uint64 {
	var v uint64
	for range n {
		b, _ := g.next()
		v = v<<8 | uint64(b)
	}
	return v
}

func (g *tableGen) table(depth int) amqp091.Table {
	t := amqp091.Table{}
	for i := 0; g.pos < len(g.data) && i < 16; i++ {
		v, ok := g.value(depth)
		if !ok {
			break
		}
		t[string(rune('a'+i))] = v
	}
	return t
}

func (g *tableGen) value(depth int) (any, bool) {
	c, ok := g.next()
	if !ok {
		return nil, false
	}
	switch c {
	case 't':
		b, _ := g.next()
		return b&1 == 1, true
	case 'b':
		return int8(g.u64(1)), true
	case 'B':
		return uint8(g.u64(1)), true
	case 's':
		n, _ := g.next()
		n %= 16
		end := min(g.pos+int(n), len(g.data))
		s := string(g.data[g.pos:end])
		g.pos = end
		return s, true
	case 'x':
		n, _ := g.next()
		n %= 16
		end := min(g.pos+int(n), len(g.data))
		b := append([]byte{}, g.data[g.pos:end]...)
		g.pos = end
		return b, true
	case 'u':
		return uint16(g.u64(2)), true
	case 'U':
		return int16(g.u64(2)), true
	case 'I':
		return int32(g.u64(4)), true
	case 'i':
		return uint32(g.u64(4)), true
	case 'l':
		return int64(g.u64(8)), true
	case 'f':
		return math.Float32frombits(uint32(g.u64(4))), true
	case 'd':
		return math.Float64frombits(g.u64(8)), true
	case 'D':
		return amqp091.Decimal{Scale: uint8(g.u64(1)), Value: int32(g.u64(4))}, true
	case 'T':
		return time.Unix(int64(g.u64(8))%(1<<40), 0), true
	case 'V':
		return nil, true
	case 'F':
		if depth > 80 {
			return nil, false
		}
		return g.table(depth + 1), true
	case 'A':
		if depth > 80 {
			return nil, false
		}
		var a []any
		for range 8 {
			v, ok := g.value(depth + 1)
			if !ok {
				break
			}
			a = append(a, v)
		}
		return a, true
	case ']':
		return nil, false
	}
	return "", true
}
