package protocol

import (
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"strings"
)

type compression int

const (
	compressionNone compression = iota
	compressionZlib
	compressionBzip2
)

// compressionByName resolves a compression header (a MIME type) or one of
// kombu's aliases for it.
func compressionByName(name string) (compression, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "":
		return compressionNone, nil
	case CompressionZlib, "gzip", "zlib":
		return compressionZlib, nil
	case CompressionBzip2, "bzip2", "bzip", "bz2":
		return compressionBzip2, nil
	}
	return 0, fmt.Errorf("%w: %q", ErrUnsupportedCompression, name)
}

// Compress compresses data with the compression named by its MIME type, as
// kombu does before setting the compression header. application/x-gzip
// (or kombu's aliases gzip and zlib) writes a zlib stream (RFC 1950) at
// zlib's default level, exactly what Python's zlib.compress writes. An
// empty name returns data unchanged. Every other name, bzip2 included (the
// standard library has no bzip2 encoder), fails with an error wrapping
// ErrUnsupportedCompression.
func Compress(mime string, data []byte) ([]byte, error) {
	c, err := compressionByName(mime)
	if err != nil {
		return nil, err
	}
	switch c {
	case compressionNone:
		return data, nil
	case compressionZlib:
		var buf bytes.Buffer
		buf.Grow(len(data)/2 + 64)
		w := zlib.NewWriter(&buf)
		if _, err := w.Write(data); err != nil {
			return nil, fmt.Errorf("protocol: zlib: %w", err)
		}
		if err := w.Close(); err != nil {
			return nil, fmt.Errorf("protocol: zlib: %w", err)
		}
		return buf.Bytes(), nil
	}
	return nil, fmt.Errorf("%w: %q (decode only)", ErrUnsupportedCompression, mime)
}

// Decompress decompresses a body according to its compression header:
//
//   - application/x-gzip (aliases gzip, zlib) is a zlib stream (RFC 1950),
//     which is what kombu writes despite the name; a real gzip stream
//     (magic 1f 8b) is accepted too;
//   - application/x-bz2 (aliases bzip2, bzip, bz2) is a bzip2 stream;
//   - an empty name returns data unchanged.
//
// The output may not exceed maxSize bytes (maxSize <= 0 means
// DefaultMaxBodySize): a larger output, such as a decompression bomb, fails
// with an error wrapping ErrTooLarge without ever holding more than
// maxSize+1 bytes. Corrupt input and data after the end of the stream are
// errors. An unknown name fails with an error wrapping
// ErrUnsupportedCompression.
func Decompress(mime string, data []byte, maxSize int) ([]byte, error) {
	c, err := compressionByName(mime)
	if err != nil {
		return nil, err
	}
	if maxSize <= 0 {
		maxSize = DefaultMaxBodySize
	}
	src := bytes.NewReader(data)
	var r io.Reader
	var name string
	switch c {
	case compressionNone:
		if len(data) > maxSize {
			return nil, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrTooLarge, len(data), maxSize)
		}
		return data, nil
	case compressionZlib:
		if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
			name = "gzip"
			zr, err := gzip.NewReader(src)
			if err != nil {
				return nil, fmt.Errorf("protocol: gzip: %w", err)
			}
			r = zr
		} else {
			name = "zlib"
			zr, err := zlib.NewReader(src)
			if err != nil {
				return nil, fmt.Errorf("protocol: zlib: %w", err)
			}
			r = zr
		}
	case compressionBzip2:
		name = "bzip2"
		r = bzip2.NewReader(src)
	}
	var out bytes.Buffer
	out.Grow(min(maxSize, 4*len(data)+512))
	n, err := out.ReadFrom(io.LimitReader(r, int64(maxSize)+1))
	if err != nil {
		return nil, fmt.Errorf("protocol: %s: %w", name, err)
	}
	if n > int64(maxSize) {
		return nil, fmt.Errorf("%w: decompressed body exceeds %d bytes", ErrTooLarge, maxSize)
	}
	if name == "zlib" && src.Len() > 0 {
		return nil, fmt.Errorf("protocol: zlib: %d bytes after the end of the stream", src.Len())
	}
	return out.Bytes(), nil
}
