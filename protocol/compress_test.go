package protocol

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestDecompressPython(t *testing.T) {
	f := loadPyFixture(t)
	for i, c := range f.Compressed {
		for _, tt := range []struct {
			mime string
			data []byte
		}{
			{CompressionZlib, c.Zlib},
			{"zlib", c.Zlib},
			{CompressionZlib, c.Gzip}, // lenient: a real gzip stream
			{CompressionBzip2, c.Bz2},
			{"bzip2", c.Bz2},
		} {
			got, err := Decompress(tt.mime, tt.data, 0)
			if err != nil {
				t.Fatalf("case %d: Decompress(%q, %x): %v", i, tt.mime, tt.data[:min(8, len(tt.data))], err)
			}
			if !bytes.Equal(got, c.Plain) {
				t.Errorf("case %d: Decompress(%q) = %.40q, want %.40q", i, tt.mime, got, c.Plain)
			}
		}
		// Compress writes a zlib stream with the header Python's
		// zlib.compress writes (default level); the deflate blocks differ
		// between implementations, and TestPythonReadsEncodings has Python
		// decompress them.
		got, err := Compress(CompressionZlib, c.Plain)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:2], c.Zlib[:2]) {
			t.Errorf("case %d: Compress(zlib) header %x, Python's zlib.compress %x", i, got[:2], c.Zlib[:2])
		}
	}
}

func TestDecompressErrors(t *testing.T) {
	bomb, err := Compress(CompressionZlib, bytes.Repeat([]byte{0}, 10<<20))
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := Compress(CompressionZlib, []byte("hello"))
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(bytes.Repeat([]byte("x"), 2000))
	w.Close()
	tests := []struct {
		name    string
		mime    string
		data    []byte
		max     int
		wantErr error
		wantMsg string
	}{
		{"zlib bomb", CompressionZlib, bomb, 1 << 20, ErrTooLarge, "exceeds 1048576"},
		{"gzip over limit", CompressionZlib, gz.Bytes(), 1999, ErrTooLarge, "exceeds 1999"},
		{"exactly at limit is fine", CompressionZlib, ok, 5, nil, ""},
		{"one over", CompressionZlib, ok, 4, ErrTooLarge, "exceeds 4"},
		{"raw over limit", "", []byte("hello"), 4, ErrTooLarge, "exceeds 4"},
		{"corrupt zlib", CompressionZlib, []byte{0x78, 0x9c, 0xff, 0xff}, 0, nil, "zlib"},
		{"not zlib", CompressionZlib, []byte("plain text"), 0, nil, "zlib"},
		{"trailing data", CompressionZlib, append(bytes.Clone(ok), 0), 0, nil, "after the end"},
		{"truncated", CompressionZlib, ok[:len(ok)-2], 0, nil, "unexpected EOF"},
		{"bad checksum", CompressionZlib, append(bytes.Clone(ok[:len(ok)-1]), ok[len(ok)-1]^1), 0, zlib.ErrChecksum, "checksum"},
		{"corrupt bz2", CompressionBzip2, []byte("BZh9garbage"), 0, nil, "bzip2"},
		{"lzma", "application/x-lzma", []byte{1}, 0, ErrUnsupportedCompression, `"application/x-lzma"`},
		{"zstd", "application/zstd", []byte{1}, 0, ErrUnsupportedCompression, "unsupported compression"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decompress(tt.mime, tt.data, tt.max)
			if tt.wantMsg == "" {
				if err != nil {
					t.Fatalf("Decompress: %v", err)
				}
				if string(got) != "hello" {
					t.Fatalf("Decompress = %q", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decompress(%q) = %d bytes, want an error", tt.mime, len(got))
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want errors.Is %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

func TestCompress(t *testing.T) {
	data := []byte(strings.Repeat("celery ", 100))
	for _, mime := range []string{CompressionZlib, "gzip", "zlib", " Application/X-Gzip "} {
		c, err := Compress(mime, data)
		if err != nil {
			t.Fatalf("Compress(%q): %v", mime, err)
		}
		if c[0] != 0x78 {
			t.Errorf("Compress(%q) starts with %x, want a zlib header", mime, c[:2])
		}
		back, err := Decompress(CompressionZlib, c, len(data))
		if err != nil || !bytes.Equal(back, data) {
			t.Errorf("Decompress(Compress(%q)) = %q, %v", mime, back, err)
		}
	}
	if got, err := Compress("", data); err != nil || !bytes.Equal(got, data) {
		t.Errorf("Compress(\"\") = %q, %v; want data unchanged", got, err)
	}
	for _, mime := range []string{CompressionBzip2, "application/x-brotli", "nope"} {
		if _, err := Compress(mime, data); !errors.Is(err, ErrUnsupportedCompression) {
			t.Errorf("Compress(%q) error %v, want ErrUnsupportedCompression", mime, err)
		}
	}
}

func FuzzDecompress(f *testing.F) {
	fx := loadPyFixture(f)
	for _, c := range fx.Compressed {
		f.Add(uint8(0), c.Zlib)
		f.Add(uint8(0), c.Gzip)
		f.Add(uint8(1), c.Bz2)
	}
	mimes := []string{CompressionZlib, CompressionBzip2}
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		defer fuzzwatch.Watch(t, which, data)()
		mime := mimes[int(which)%len(mimes)]
		out, err := Decompress(mime, data, limit)
		if err != nil {
			if out != nil {
				t.Fatalf("Decompress returned %d bytes with error %v", len(out), err)
			}
			return
		}
		if len(out) > limit {
			t.Fatalf("Decompress returned %d bytes, over the %d limit", len(out), limit)
		}
		if mime != CompressionZlib {
			return
		}
		c, err := Compress(mime, out)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decompress(mime, c, limit)
		if err != nil || !bytes.Equal(back, out) {
			t.Fatalf("Decompress(Compress(x)) = %d bytes, %v; want the %d bytes back", len(back), err, len(out))
		}
	})
}
