package protocol

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// pythonInterpreter is Debian's Python with Celery, kombu and msgpack
// (CELERIAC_PYTHON overrides it, as in .ci/setup).
func pythonInterpreter() string {
	if p := os.Getenv("CELERIAC_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

// TestPythonReadsEncodings has real Python decode what the encoders write:
// typed JSON with kombu 5.3's reader, plain JSON with kombu 5.2's, msgpack
// with msgpack.unpackb, zlib-compressed JSON with zlib.decompress. It skips
// when Python is missing, unless CELERIAC_REQUIRE_BROKERS=1 or CI is set
// (then a missing Python fails the test).
func TestPythonReadsEncodings(t *testing.T) {
	py := pythonInterpreter()
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CELERIAC_REQUIRE_BROKERS") == "1" || os.Getenv("CI") != "" {
			t.Fatalf("%s is required here: %v", py, err)
		}
		t.Skipf("%s not found: run .ci/setup (python3-celery) for the Python cross-check", py)
	}
	type pyCase struct {
		Kind string `json:"kind"`
		Data []byte `json:"data"`
	}
	var cases []pyCase
	var wants []any

	typed := newValueGen(10)
	typed.typed = true
	for range 300 {
		v := typed.value(3)
		data, err := AppendJSON(nil, v, JSONOptions{Typed: true})
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, pyCase{"json_typed", data})
		wants = append(wants, v)

		z, err := Compress(CompressionZlib, data)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, pyCase{"zlib_json", z})
		wants = append(wants, v)

		data, err = AppendJSON(nil, v, JSONOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, pyCase{"json_plain", data})
		wants = append(wants, plainJSONValue(v))
	}
	mp := newValueGen(11)
	mp.bytes, mp.fits64 = true, true
	for range 300 {
		v := mp.value(3)
		data, err := AppendMsgpack(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, pyCase{"msgpack", data})
		wants = append(wants, v)
	}

	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), py, "testdata/py_read.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("py_read.py: %v\n%s", err, stderr.Bytes())
	}
	var results []struct {
		Value json.RawMessage
		Error string
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("py_read.py output: %v", err)
	}
	if len(results) != len(cases) {
		t.Fatalf("py_read.py returned %d results for %d cases", len(results), len(cases))
	}
	for i, r := range results {
		if r.Error != "" {
			t.Errorf("case %d (%s): Python refused %q: %s", i, cases[i].Kind, cases[i].Data, r.Error)
			continue
		}
		got := untag(t, r.Value)
		if diff := cmp.Diff(wants[i], got, valueOpts); diff != "" {
			t.Errorf("case %d (%s): Python read %q differently (-want +python):\n%s", i, cases[i].Kind, cases[i].Data, diff)
		}
	}
}

// plainJSONValue is what a plain (untyped) JSON encoding of v decodes to:
// the text forms of the typed values, and bytes as text or as the base64
// envelope kombu 5.2 leaves as a dict.
func plainJSONValue(v any) any {
	switch x := v.(type) {
	case time.Time:
		return FormatTime(x)
	case Date, TimeOfDay, UUID:
		return x.(interface{ String() string }).String()
	case Decimal:
		return string(x)
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		b, _ := AppendJSON(nil, x, JSONOptions{})
		var env map[string]any
		if err := json.Unmarshal(b, &env); err != nil {
			panic(err)
		}
		return env
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = plainJSONValue(el)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			out[k] = plainJSONValue(el)
		}
		return out
	}
	return v
}
