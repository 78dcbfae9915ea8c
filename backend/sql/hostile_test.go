package sql

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// Inputs from the security review of issue 26, each a regression test
// and a fuzz seed.
var (
	// reconstructorNoArgs is copyreg._reconstructor called with (): it
	// indexed args[0] of the empty tuple and panicked.
	reconstructorNoArgs = []byte("\x80\x02ccopyreg\n_reconstructor\n)R.")
)

// hugeLong4 is a LONG4 of n bytes: an int of about 2.4n digits.
func hugeLong4(n int) []byte {
	p := binary.LittleEndian.AppendUint32([]byte{opProto, 2, opLong4}, uint32(n))
	p = append(p, bytes.Repeat([]byte{0x11}, n)...)
	return append(p, opStop)
}

// sharedDatetimes is a pickle of one datetime, memoized, in a list of
// inner references, which a list holds outer times: inner*outer
// datetimes written out from a few kilobytes.
func sharedDatetimes(inner, outer int) []byte {
	p := []byte("\x80\x02cdatetime\ndatetime\nC\n\x07\xe8\x01\x02\x03\x04\x05\x00\x00\x06\x85Rq\x00\x94(")
	p = append(p, opMark)
	for range inner {
		p = append(p, opBinGet, 0)
	}
	p = append(p, opList, opBinPut, 1, opMark)
	for range outer {
		p = append(p, opBinGet, 1)
	}
	return append(p, opList, opStop)
}

// emptyDicts is a pickle of a list of n empty dicts, one byte each.
func emptyDicts(n int) []byte {
	p := append([]byte{opProto, 2, opMark}, bytes.Repeat([]byte{opEmptyDict}, n)...)
	return append(p, opList, opStop)
}

// hostileSeeds are the review's inputs, at sizes a fuzz seed can have.
func hostileSeeds() [][]byte {
	return [][]byte{reconstructorNoArgs, hugeLong4(4096), sharedDatetimes(200, 50), emptyDicts(4096),
		[]byte("F" + strings.Repeat("1", 4096) + "x\n.")}
}

// writtenBound is the most a value DecodePickle returns takes written out
// as repr or typed JSON (see pickleWorkFactor).
func writtenBound(p []byte) int { return pickleWorkFactor*len(p) + pickleWorkBase }

// checkWrittenBound fails when v, decoded from p, writes out larger than
// the decoder's bound.
func checkWrittenBound(t *testing.T, p []byte, v any) {
	t.Helper()
	b, err := protocol.AppendJSON(nil, v, protocol.JSONOptions{Typed: true})
	if err != nil {
		t.Fatalf("AppendJSON(DecodePickle(%.40x)): %v", p, err)
	}
	if len(b) > writtenBound(p) {
		t.Fatalf("a pickle of %d bytes is %d bytes of typed JSON, over %d", len(p), len(b), writtenBound(p))
	}
	if r := protocol.Repr(v); len(r) > writtenBound(p) {
		t.Fatalf("a pickle of %d bytes is %d bytes of repr, over %d", len(p), len(r), writtenBound(p))
	}
}

// TestDecodePickleReconstructorNoArgs: finding 1, a 29-byte pickle that
// panicked the decoder (and Backend.Get, UnlockChord and the dashboard
// with it), is an error.
func TestDecodePickleReconstructorNoArgs(t *testing.T) {
	v, err := DecodePickle(reconstructorNoArgs)
	if err == nil || v != nil {
		t.Fatalf("DecodePickle = %#v, %v; want an error", v, err)
	}
	for _, args := range []string{")", "N\x85", "NN\x86", "NNNN\x87\x86"} {
		p := []byte("\x80\x02ccopyreg\n_reconstructor\n" + args + "R.")
		if _, err := DecodePickle(p); err == nil {
			t.Errorf("_reconstructor%q: no error", args)
		}
	}
}

// TestDecodePickleRecoversPanics: whatever goes wrong inside the decoder
// is an error wrapping ErrUnsafePickle, never a panic out of
// DecodePickle. A nil memo entry of an impossible kind stands for a bug.
func TestDecodePickleRecoversPanics(t *testing.T) {
	u := unpickler{data: []byte("x")}
	_, err := func() (v any, err error) {
		defer u.recoverPanic(&v, &err)
		panic("a decoder bug")
	}()
	if !errors.Is(err, ErrUnsafePickle) {
		t.Fatalf("err = %v; want one wrapping ErrUnsafePickle", err)
	}
}

// TestDecodePickleHugeLong: finding 2, a LONG4 whose decimal text is
// over Python's 4300 digits (superlinear to write, refused by Python and
// protocol.DecodeJSON when written) is refused, at the limit exactly.
func TestDecodePickleHugeLong(t *testing.T) {
	for _, n := range []int{maxPickleLongBytes + 1, 4 << 20} {
		if _, err := DecodePickle(hugeLong4(n)); err == nil {
			t.Errorf("LONG4 of %d bytes: no error", n)
		}
	}
	ten := new(big.Int).Exp(big.NewInt(10), big.NewInt(maxPickleIntDigits), nil)
	for _, c := range []struct {
		x  *big.Int
		ok bool
	}{
		{new(big.Int).Sub(ten, big.NewInt(1)), true},
		{new(big.Int).Neg(new(big.Int).Sub(ten, big.NewInt(1))), true},
		{ten, false},
		{new(big.Int).Neg(ten), false},
	} {
		// As Python writes it (EncodePickle refuses the longer ones).
		e := pickler{buf: []byte{opProto, 2}}
		e.bigInt(c.x)
		v, err := DecodePickle(append(e.buf, opStop))
		if c.ok != (err == nil) {
			t.Errorf("%d-digit int: %v", len(c.x.String()), err)
		}
		if err == nil {
			if b, err := protocol.AppendJSON(nil, v, protocol.JSONOptions{}); err != nil {
				t.Errorf("AppendJSON of a %d-digit int: %v", len(c.x.String()), err)
			} else if _, err := protocol.DecodeJSON(b, protocol.DecodeOptions{}); err != nil {
				t.Errorf("DecodeJSON of a %d-digit int: %v", len(c.x.String()), err)
			}
		}
	}
	// EncodePickle refuses what DecodePickle would: the stored result
	// must read back.
	if _, err := EncodePickle(ten); !errors.Is(err, protocol.ErrUnencodable) {
		t.Errorf("EncodePickle of a %d-digit int: %v, want ErrUnencodable", maxPickleIntDigits+1, err)
	}
	// Sign extension Python's pickler does not write, within the bound.
	p := binary.LittleEndian.AppendUint32([]byte{opProto, 2, opLong4}, maxPickleLongBytes)
	p = append(append(p, bytes.Repeat([]byte{0xff}, maxPickleLongBytes)...), opStop)
	if v, err := DecodePickle(p); err != nil || v != int64(-1) {
		t.Errorf("-1 in %d bytes = %v, %v", maxPickleLongBytes, v, err)
	}
}

// TestDecodePickleWrittenSize: finding 3, a datetime memoized and shared
// through lists (a 10 KB pickle that was 96 MB of typed JSON) is refused,
// or writes out within 64 times its size: each scalar is charged what it
// takes written, not one unit.
func TestDecodePickleWrittenSize(t *testing.T) {
	for _, p := range [][]byte{sharedDatetimes(4000, 250), sharedDatetimes(200, 50), sharedDatetimes(10, 10)} {
		v, err := DecodePickle(p)
		if err != nil {
			if !errors.Is(err, protocol.ErrTooLarge) {
				t.Errorf("a pickle of %d bytes: %v, want ErrTooLarge", len(p), err)
			}
			continue
		}
		checkWrittenBound(t, p, v)
	}
	if _, err := DecodePickle(sharedDatetimes(4000, 250)); err == nil {
		t.Error("a million shared datetimes: no error")
	}
	// Small sharing is fine.
	if v, err := DecodePickle(sharedDatetimes(10, 10)); err != nil || len(v.([]any)) != 10 {
		t.Errorf("100 shared datetimes: %v", err)
	}
}

// TestDecodePickleMemoryBudget: finding 4, memory the decoder allocates
// (16 MiB of EMPTY_DICT was a 1.98 GB peak) is charged as it is
// allocated, and what it really allocates stays within a small multiple
// of the charge, for every shape of pickle that allocates per byte.
func TestDecodePickleMemoryBudget(t *testing.T) {
	const limit = 16 << 20
	if maxPickleMemory > 256<<20 {
		t.Errorf("maxPickleMemory is %d MiB", maxPickleMemory>>20)
	}
	n := 1 << 20
	var dict []byte
	dict = append(dict, opProto, 2, opEmptyDict, opMark)
	for i := range n / 6 {
		dict = append(dict, opBinInt, byte(i), byte(i>>8), byte(i>>16), 0, opNone)
	}
	dict = append(dict, opSetItems, opStop)
	for name, p := range map[string][]byte{
		"EMPTY_DICT":  emptyDicts(n),
		"EMPTY_LIST":  append(append([]byte{opProto, 2, opMark}, bytes.Repeat([]byte{opEmptyList}, n)...), opList, opStop),
		"NONE":        append(append([]byte{opProto, 2, opMark}, bytes.Repeat([]byte{opNone}, n)...), opList, opStop),
		"MARK":        append(append([]byte{opProto, 2, opNone}, bytes.Repeat([]byte{opMark}, n)...), opStop),
		"MEMOIZE":     append(append([]byte{opProto, 4, opNone}, bytes.Repeat([]byte{opMemoize}, n)...), opStop),
		"DUP":         append(append([]byte{opProto, 2, opEmptyList}, bytes.Repeat([]byte{opDup}, n)...), opStop),
		"SETITEMS":    dict,
		"nested list": nestedLists(protocol.MaxDepthLimit),
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := decodePickle(p, limit)
		runtime.ReadMemStats(&after)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*limit {
			t.Errorf("%s: allocated %d MiB with a budget of %d MiB (%v)", name, alloc>>20, limit>>20, err)
		}
	}
	if _, err := decodePickle(emptyDicts(n), limit); !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("%d EMPTY_DICT with %d MiB: err = %v, want ErrTooLarge", n, limit>>20, err)
	}
}

// TestDecodePickleErrorsQuoteLittle: finding 5, an error quotes at most
// 40 characters of an invalid argument, whichever opcode it is (a 33 MB
// FLOAT line was quoted whole).
func TestDecodePickleErrorsQuoteLittle(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for _, p := range []string{
		"F" + long + "\n.", "F1" + long + "\n.", "I1" + long + "\n.", "L1" + long + "L\n.", "N" + "p1" + long + "\n.", "g1" + long + "\n.",
		"c" + long + "\nx\n.", "cx\n" + long + "\n.", "S'" + long + "\n.", "V\\u" + long + "\n.",
		"\x80\x02cdecimal\nDecimal\nX\x00\x00\x10\x00" + long + "\x85R.",
		"\x80\x02cuuid\nUUID\n)\x81}X\x00\x00\x10\x00" + long + "Nsb.",
	} {
		_, err := DecodePickle([]byte(p))
		if err == nil {
			t.Errorf("%.20q: no error", p)
			continue
		}
		if len(err.Error()) > 300 {
			t.Errorf("%.20q: an error of %d bytes: %.300s", p, len(err.Error()), err)
		}
	}
}

// TestGetResultColumnCap: a result column over maxResultColumn is a
// PickledResult wrapping ErrTooLarge, without reading it.
func TestGetResultColumnCap(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	execSQL(t, "INSERT INTO "+b.s.taskTable+" (id, task_id, status, result) VALUES (nextval("+quoteLiteral(b.s.taskSeq)+"), 'big', 'SUCCESS', convert_to(repeat('N', "+strconv.Itoa(maxResultColumn+1)+"), 'UTF8'))")
	m, err := b.Get(t.Context(), "big")
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := m.Result.(PickledResult); !ok || !errors.Is(r.Err, protocol.ErrTooLarge) || r.Size != maxResultColumn+1 {
		t.Errorf("Result = %#v, want a PickledResult of %d bytes wrapping ErrTooLarge", m.Result, maxResultColumn+1)
	}
	if r, err := b.UnlockChord(t.Context(), "big-group", []string{"big"}, "u"); err != nil || r.Ready {
		t.Errorf("UnlockChord = %+v, %v; want not ready", r, err)
	}
}

// TestGetHostileRows: Get and UnlockChord read rows holding the review's
// inputs without panicking: one the decoder refuses is a PickledResult;
// its chord is not ready here when Python reads it (a Python worker
// completes it) and fails when no worker can; one it reads is the value.
func TestGetHostileRows(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	for i, p := range hostileSeeds() {
		id := "hostile-" + strconv.Itoa(i)
		_, decodeErr := DecodePickle(p)
		execSQL(t, "INSERT INTO "+b.s.taskTable+" (id, task_id, status, result) VALUES (nextval("+quoteLiteral(b.s.taskSeq)+"), '"+id+"', 'SUCCESS', '\\x"+hex.EncodeToString(p)+"')")
		m, err := b.Get(t.Context(), id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
		r, refused := m.Result.(PickledResult)
		if refused != (decodeErr != nil) || refused && (r.Err == nil || r.Size != len(p)) {
			t.Errorf("Get(%s).Result = %.200v; DecodePickle's error is %v", id, m.Result, decodeErr)
		}
		// A chord waits for a Python worker only for a pickle Python reads.
		wantReady := !refused || !pythonReads(r.Err)
		c, err := b.UnlockChord(t.Context(), "hostile-group-"+id, []string{id}, "u")
		if err != nil || c.Ready != wantReady {
			t.Fatalf("UnlockChord(%s): ready %v, %v; want %v (refused: %v)", id, c.Ready, err, wantReady, r.Err)
		}
		if refused && wantReady {
			if p := c.Results[0]; p.TaskID != id || p.State != protocol.StateFailure {
				t.Errorf("UnlockChord(%s): part %+v, want a FAILURE", id, p)
			}
		}
	}
}

// quoteLiteral quotes s for SQL the tests write by hand.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// TestNamesAreBindParameters: the notify channel and the sequence's name
// reach PostgreSQL as bind parameters, so a name with a backslash and a
// quote works on a server with standard_conforming_strings off (where
// quoting a literal by hand doubles only the quote, and the backslash
// escapes it).
func TestNamesAreBindParameters(t *testing.T) {
	ctx := t.Context()
	schema := testSchema(t) + `\'s`
	execSQL(t, "CREATE SCHEMA "+quoteIdent(schema))
	t.Cleanup(func() { execSQL(t, "DROP SCHEMA "+quoteIdent(schema)+" CASCADE") })
	channel := uniqueChannel(t) + `\'c`
	conn, err := pgx.Connect(ctx, transporttest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(transporttest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if u.RawQuery != "" {
		u.RawQuery += "&"
	}
	u.RawQuery += "options=-c%20standard_conforming_strings%3Doff"
	b, err := New(ctx, Config{
		URL:           "db+postgresql+psycopg2" + strings.TrimPrefix(u.String(), "postgres"),
		Schema:        SQLAlchemy,
		TableSchemas:  map[string]string{"task": schema, "group": schema},
		NotifyChannel: channel,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer b.Close()
	storeState(t, b, "bt-bound-1", protocol.StateSuccess)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil || n.Payload != "bt-bound-1" {
		t.Fatalf("notification %+v, %v; want the task id on %q", n, err, channel)
	}
	if m, err := b.Get(ctx, "bt-bound-1"); err != nil || m.Status != protocol.StateSuccess {
		t.Fatalf("Get = %+v, %v", m, err)
	}
}

// TestNoLiteralQuotedByHand guards TestNamesAreBindParameters' class: no
// code of the package quotes a value into SQL as a string literal (a
// doubled single quote is what doing so looks like); values are bind
// parameters, names quoteIdent'ed identifiers.
func TestNoLiteralQuotedByHand(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), `"''"`) {
			t.Errorf("%s doubles single quotes: pass the value as a bind parameter", f)
		}
	}
}
