package protocol

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// FuzzEnvelopeFastPath is differential: whatever the fast envelope decoder
// accepts, the document decoder accepts too, with the same result. The
// fast path may decline anything; it may never differ.
func FuzzEnvelopeFastPath(f *testing.F) {
	dir := filepath.Join("testdata", "golden")
	ents, err := os.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".redis.json") {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, s := range []string{
		`{"body": "", "headers": {}, "properties": {"body_encoding": "base64", "delivery_tag": "t"}}`,
		`{"body": "YWJj", "body": "ZGVm", "properties": {"body_encoding": "base64", "delivery_tag": "t"}}`,
		`{"body": "abc", "properties": {"body_encoding": "base64", "delivery_tag": "t"}}`,
		`{"body": "raw text", "content-type": "text/plain", "properties": {"delivery_tag": "t", "x": [1]}}`,
		`{"body": "e30=", "headers": {"__type__": "uuid", "__value__": "x"}, "properties": {"body_encoding": "base64"}}`,
		`{"__type__": "bytes", "__value__": "e30="}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		const limit = 1 << 16
		docOpts := DecodeOptions{MaxBodySize: envelopeLimit(limit), MaxDepth: 64}
		fast, ok := decodeEnvelopeFast(data, limit, docOpts.maxDepth())
		if !ok {
			return
		}
		doc, err := decodeEnvelopeDoc(data, limit, docOpts)
		if err != nil {
			t.Fatalf("fast path accepted what the document decoder refuses (%v): %q", err, data)
		}
		if !reflect.DeepEqual(fast, doc) {
			t.Fatalf("fast path differs:\nfast %#v\ndoc  %#v\ninput %q", fast, doc, data)
		}
	})
}

// TestEnvelopeFastPathTakesKombuEnvelopes: the fast path is the one taken
// for what Python's kombu writes, else it would be dead code.
func TestEnvelopeFastPathTakesKombuEnvelopes(t *testing.T) {
	dir := filepath.Join("testdata", "golden")
	names, err := filepath.Glob(filepath.Join(dir, "*.redis.json"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no golden Redis envelopes: %v", err)
	}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := decodeEnvelopeFast(b, DefaultMaxBodySize, DefaultMaxDepth); !ok {
			t.Errorf("%s: the fast path declined a kombu envelope", filepath.Base(name))
		}
	}
}
