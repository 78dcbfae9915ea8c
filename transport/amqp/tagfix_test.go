package amqp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// chunkConn is a net.Conn whose Read returns at most the next chunk size of
// bytes from r (cycling through sizes), to exercise frames split across
// reads. Only Read is used.
type chunkConn struct {
	net.Conn
	r     io.Reader
	sizes []int
	i     int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.sizes) > 0 {
		n := c.sizes[c.i%len(c.sizes)]
		c.i++
		if n < len(p) {
			p = p[:n]
		}
	}
	return c.r.Read(p)
}

// fixAll runs data through a tagFixConn reading in the given chunk sizes
// (nil: whatever the reader returns) and returns what it yields.
func fixAll(t testing.TB, data []byte, sizes []int, bufSize int) ([]byte, int) {
	t.Helper()
	c := newTagFixConn(&chunkConn{r: bytes.NewReader(data), sizes: sizes})
	var out []byte
	buf := make([]byte, bufSize)
	for range 10*len(data) + 10 {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, c.f.fixed
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	t.Fatalf("Read made no progress after %d calls", 10*len(data)+10)
	return nil, 0
}

func goldenDeliver(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/pyamqp_deliver_L.bin")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTagFixGolden(t *testing.T) {
	in := goldenDeliver(t)
	out, fixed := fixAll(t, in, nil, 4096)
	if len(out) != len(in) {
		t.Fatalf("output length %d, want %d", len(out), len(in))
	}
	var changed []int
	for i := range in {
		if in[i] != out[i] {
			if in[i] != 'L' || out[i] != 'l' {
				t.Errorf("byte %d changed from %q to %q", i, in[i], out[i])
			}
			changed = append(changed, i)
		}
	}
	// ts, neg, edge, nested.big, nested.list[1], nested.list[2].deep; not
	// the 'L' in the consumer tag, the routing key or the string "L".
	if len(changed) != 6 || fixed != 6 {
		t.Errorf("changed %d bytes (fixer counted %d), want 6", len(changed), fixed)
	}

	// Before the fix, an amqp091-style reader refuses the table; after it,
	// the values come out as int64.
	if _, err := refHeaders(in); err == nil {
		t.Errorf("reference reader accepted the unfixed header table")
	}
	h, err := refHeaders(out)
	if err != nil {
		t.Fatalf("reference reader on the fixed frames: %v", err)
	}
	want := map[string]any{
		"ts":   int64(1700000000000),
		"neg":  int64(-5000000000),
		"edge": int64(math.MinInt32),
		"nested": map[string]any{
			"big":  int64(1 << 40),
			"list": []any{int32(1), int64(3000000000), map[string]any{"deep": int64(-(1 << 62))}},
			"s":    "L",
		},
		"small": int32(7),
	}
	for k, v := range want {
		if diff := cmp.Diff(v, h[k]); diff != "" {
			t.Errorf("header %q mismatch (-want +got):\n%s", k, diff)
		}
	}
}

func TestTagFixChunking(t *testing.T) {
	one := goldenDeliver(t)
	stream := bytes.Join([][]byte{one, heartbeatFrame(), one, one}, nil)
	want, wantFixed := fixAll(t, stream, nil, 1<<16)
	for _, sizes := range [][]int{{1}, {2}, {3}, {7}, {8}, {13}, {100}, {1, 5, 2, 600}, {6, 1}} {
		for _, bufSize := range []int{1, 3, 64, 4096} {
			t.Run(fmt.Sprintf("chunks%v_buf%d", sizes, bufSize), func(t *testing.T) {
				got, fixed := fixAll(t, stream, sizes, bufSize)
				if !bytes.Equal(got, want) {
					t.Errorf("chunked output differs from whole-read output")
				}
				if fixed != wantFixed {
					t.Errorf("fixed %d tags, want %d", fixed, wantFixed)
				}
			})
		}
	}
	if wantFixed != 18 {
		t.Errorf("fixed %d tags in three messages, want 18", wantFixed)
	}
}

func TestTagFixPassThrough(t *testing.T) {
	tableL := table("ts", 'L', u64(1700000000000))
	tests := []struct {
		name      string
		give      []byte
		wantFixed int
	}{
		{"protocol header refusal", []byte("AMQP\x00\x00\x09\x01"), 0},
		{"garbage", []byte{0xff, 'L', 'L'}, 0},
		{"heartbeat", heartbeatFrame(), 0},
		{"method frame with L bytes", frame(frameMethod, []byte("\x00\x3c\x00\x3cLLLL")), 0},
		{"body frame that looks like a header", frame(frameBody, contentHeaderPayload(60, tableL)), 0},
		{"content header, other class", frame(frameHeader, contentHeaderPayload(50, tableL)), 0},
		{"content header without headers flag", frame(frameHeader, contentHeaderPayloadFlags(60, 0x8000, []byte{1, 'x'})), 0},
		{"content header with L", frame(frameHeader, contentHeaderPayload(60, tableL)), 1},
		{"unknown tag stops the walk", frame(frameHeader, contentHeaderPayload(60,
			concatTables(table("u", 'U', []byte{0, 1}), table("ts", 'L', u64(1))))), 0},
		{"table length past the frame", frame(frameHeader, contentHeaderPayload(60, []byte{0, 0, 0xff, 0xff, 2, 't', 's', 'L'})), 0},
		{"truncated L value", frame(frameHeader, contentHeaderPayload(60, []byte{0, 0, 0, 6, 2, 't', 's', 'L', 0, 0})), 0},
		{"nested array and table", frame(frameHeader, contentHeaderPayload(60,
			table("a", 'A', array(value('L', u64(5)), value('F', table("x", 'L', u64(6))), value('V', nil))))), 2},
		{"empty content header payload", frame(frameHeader, nil), 0},
		{"truncated frame at EOF", frame(frameHeader, contentHeaderPayload(60, tableL))[:20], 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fixed := fixAll(t, tt.give, []int{3}, 16)
			if len(got) != len(tt.give) {
				t.Fatalf("length %d, want %d", len(got), len(tt.give))
			}
			if fixed != tt.wantFixed {
				t.Errorf("fixed %d, want %d", fixed, tt.wantFixed)
			}
			diffs := 0
			for i := range got {
				if got[i] != tt.give[i] {
					diffs++
					if tt.give[i] != 'L' || got[i] != 'l' {
						t.Errorf("byte %d: %q → %q", i, tt.give[i], got[i])
					}
				}
			}
			if diffs != tt.wantFixed {
				t.Errorf("%d bytes changed, want %d", diffs, tt.wantFixed)
			}
		})
	}
}

func TestTagFixOversizeHeaderPassesThrough(t *testing.T) {
	// A content-header frame announcing more than maxHeldFrame bytes is not
	// held back (amqp091 refuses it anyway): its bytes flow at once.
	hdr := []byte{frameHeader, 0, 1, 0, 0x20, 0, 0} // size 0x200000
	c := newTagFixConn(&chunkConn{r: io.MultiReader(bytes.NewReader(hdr), bytes.NewReader(make([]byte, 100)))})
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || n == 0 {
		t.Fatalf("Read = %d, %v; want bytes at once", n, err)
	}
}

// FuzzFrameFixer checks the rewriter on arbitrary streams: no panic, output
// as long as the input, only 'L'→'l' changes, the same output however the
// stream is split into reads, and idempotence.
func FuzzFrameFixer(f *testing.F) {
	golden, err := os.ReadFile("testdata/pyamqp_deliver_L.bin")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden, uint8(3), uint16(4096))
	f.Add(append(heartbeatFrame(), golden...), uint8(1), uint16(7))
	f.Add(frame(frameHeader, contentHeaderPayload(60, table("a", 'A', array(value('L', u64(5)), value('F', table("x", 'L', u64(6))))))), uint8(5), uint16(9))
	f.Add([]byte("AMQP\x00\x00\x09\x01"), uint8(2), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8, bufSize uint16) {
		defer fuzzwatch.Watch(t, data, chunk, bufSize)()
		whole, fixed := fixAll(t, data, nil, 1<<16)
		if len(whole) != len(data) {
			t.Fatalf("length %d, want %d", len(whole), len(data))
		}
		diffs := 0
		for i := range data {
			if data[i] != whole[i] {
				diffs++
				if data[i] != 'L' || whole[i] != 'l' {
					t.Fatalf("byte %d: %q → %q", i, data[i], whole[i])
				}
			}
		}
		if diffs != fixed {
			t.Fatalf("%d bytes changed, fixer counted %d", diffs, fixed)
		}
		split, _ := fixAll(t, data, []int{int(chunk%64) + 1, 1}, int(bufSize%8192)+1)
		if !bytes.Equal(split, whole) {
			t.Fatalf("split reads give other output")
		}
		again, refixed := fixAll(t, whole, nil, 1<<16)
		if !bytes.Equal(again, whole) || refixed != 0 {
			t.Fatalf("not idempotent: %d more tags fixed", refixed)
		}
	})
}

// ---- frame builders for tests ----

func frame(typ byte, payload []byte) []byte {
	b := []byte{typ, 0, 1, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[3:], uint32(len(payload)))
	b = append(b, payload...)
	return append(b, frameEnd)
}

func heartbeatFrame() []byte { return []byte{frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd} }

// contentHeaderPayload builds a content-header payload with content type
// "application/json" and the given header table.
func contentHeaderPayload(class uint16, headerTable []byte) []byte {
	props := append([]byte{16}, "application/json"...)
	props = append(props, headerTable...)
	return contentHeaderPayloadFlags(class, flagContentType|flagHeaders, props)
}

func contentHeaderPayloadFlags(class, flags uint16, props []byte) []byte {
	b := make([]byte, 14)
	binary.BigEndian.PutUint16(b, class)
	binary.BigEndian.PutUint64(b[4:], 42)
	binary.BigEndian.PutUint16(b[12:], flags)
	return append(b, props...)
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func value(tag byte, raw []byte) []byte { return append([]byte{tag}, raw...) }

// table builds a field table with one entry; raw is the encoded value after
// the tag (for 'F' and 'A' a complete table or array).
func table(key string, tag byte, raw []byte) []byte {
	entry := append([]byte{byte(len(key))}, key...)
	entry = append(entry, tag)
	entry = append(entry, raw...)
	return withLen(entry)
}

func array(values ...[]byte) []byte { return withLen(bytes.Join(values, nil)) }

func withLen(b []byte) []byte {
	out := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(out, uint32(len(b)))
	return append(out, b...)
}

// concatTables merges one-entry tables into one table.
func concatTables(tables ...[]byte) []byte {
	var body []byte
	for _, t := range tables {
		body = append(body, t[4:]...)
	}
	return withLen(body)
}

// ---- a reference reader with amqp091-go's field types (no 'L') ----

// refHeaders finds the content header of the first basic-class
// content-header frame in stream and decodes its header table the way
// amqp091-go's reader does: the same tags, the same Go types.
func refHeaders(stream []byte) (map[string]any, error) {
	for len(stream) >= 8 {
		size := int(binary.BigEndian.Uint32(stream[3:7]))
		if len(stream) < 8+size {
			break
		}
		if stream[0] == frameHeader {
			p := stream[7 : 7+size]
			pos := 14
			flags := binary.BigEndian.Uint16(p[12:])
			for _, fl := range []uint16{flagContentType, flagContentEncoding} {
				if flags&fl != 0 {
					pos += 1 + int(p[pos])
				}
			}
			r := bytes.NewReader(p[pos:])
			return refTable(r)
		}
		stream = stream[8+size:]
	}
	return nil, errors.New("no content header")
}

func refTable(r *bytes.Reader) (map[string]any, error) {
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	br := bytes.NewReader(body)
	m := map[string]any{}
	for br.Len() > 0 {
		kl, _ := br.ReadByte()
		k := make([]byte, kl)
		if _, err := io.ReadFull(br, k); err != nil {
			return nil, err
		}
		v, err := refField(br)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		m[string(k)] = v
	}
	return m, nil
}

func refField(r *bytes.Reader) (any, error) {
	tag, err := r.ReadByte()
	if err != nil {
		return nil, err
	}
	read := func(v any) (any, error) { return v, binary.Read(r, binary.BigEndian, v) }
	switch tag {
	case 't':
		b, err := r.ReadByte()
		return b != 0, err
	case 'I':
		var v int32
		_, err := read(&v)
		return v, err
	case 'l':
		var v int64
		_, err := read(&v)
		return v, err
	case 'd':
		var v float64
		_, err := read(&v)
		return v, err
	case 'D':
		var v struct {
			Scale uint8
			Value int32
		}
		_, err := read(&v)
		return v, err
	case 'S':
		var n uint32
		if _, err := read(&n); err != nil {
			return nil, err
		}
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return string(b), err
	case 'V':
		return nil, nil
	case 'F':
		return refTable(r)
	case 'A':
		var n uint32
		if _, err := read(&n); err != nil {
			return nil, err
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, err
		}
		br := bytes.NewReader(body)
		out := []any{}
		for br.Len() > 0 {
			v, err := refField(br)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported tag %q", tag)
}
