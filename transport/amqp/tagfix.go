package amqp

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"sync"
)

// py-amqp (Celery's AMQP client) writes integers outside the int32 range into
// header tables with the field tag 'L' and a signed 64-bit big-endian value.
// amqp091-go's table reader has no case for 'L': the content header of such a
// message fails to parse, which is fatal for the whole connection, and the
// broker redelivers the message to the next consumer, forever. amqp091-go
// reads 'l' as the same signed 64-bit value, so rewriting the tag byte, and
// nothing else, before amqp091-go sees the frame makes those messages
// readable without forking the library.
//
// The rewrite happens in a net.Conn wrapper installed through amqp091.Config's
// Dial hook. It parses the server's byte stream into frames, touches only
// content-header frames of the basic class, walks their header table
// (including nested tables and arrays) and changes tag bytes 'L' to 'l'. Every
// other byte passes through unchanged, frames keep their length, and a stream
// that does not parse as AMQP frames passes through untouched from that point
// on (amqp091-go then reports the error itself).

// AMQP frame types and constants (AMQP 0-9-1 §4.2.3).
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE

	frameHeaderSize = 7 // type(1) channel(2) size(4)

	classBasic = 60

	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
	flagContinuation    = 0x0001

	// maxHeldFrame bounds how much of a content-header frame is held back
	// while waiting for the rest of it. RabbitMQ's frame_max defaults to
	// 128 KiB; a larger content-header frame passes through unmodified (and
	// amqp091-go refuses it anyway, being larger than the negotiated size).
	maxHeldFrame = 1 << 20

	// maxTableDepth bounds the nesting of tables and arrays that are walked.
	// amqp091-go refuses more than 32 levels; deeper data is left as is.
	maxTableDepth = 64
)

// frameFixer is the pure state machine behind tagFixConn. It holds no buffer:
// the caller re-feeds the bytes of a frame that is not complete yet.
type frameFixer struct {
	// skip counts the bytes of the current frame (payload and frame-end) that
	// still pass through unmodified.
	skip uint64
	// broken is set once the stream stops looking like AMQP frames (the
	// protocol-header reply of a server refusing our version, or garbage);
	// from then on everything passes through.
	broken bool
	// fixed counts the tags rewritten, for logging and tests.
	fixed int
}

// feed examines b, which starts at the first byte not yet released to the
// reader, rewrites the content-header frames it holds completely (in place)
// and returns how many leading bytes of b are final. The remaining bytes are
// the beginning of a frame header or of a content-header frame that is not
// complete yet: the caller must feed them again, followed by more input.
// feed never changes the length of its input.
func (f *frameFixer) feed(b []byte) int {
	i := 0
	for i < len(b) {
		if f.broken {
			return len(b)
		}
		if f.skip > 0 {
			n := uint64(len(b) - i)
			if n > f.skip {
				n = f.skip
			}
			i += int(n)
			f.skip -= n
			continue
		}
		switch b[i] {
		case frameMethod, frameHeader, frameBody, frameHeartbeat:
		default:
			f.broken = true
			return len(b)
		}
		if len(b)-i < frameHeaderSize {
			return i
		}
		size := uint64(binary.BigEndian.Uint32(b[i+3 : i+7]))
		total := frameHeaderSize + size + 1
		if b[i] != frameHeader || total > maxHeldFrame {
			f.skip = total
			continue
		}
		if uint64(len(b)-i) < total {
			return i
		}
		f.fixed += fixContentHeader(b[i+frameHeaderSize : i+frameHeaderSize+int(size)])
		i += int(total)
	}
	return i
}

// fixContentHeader rewrites the header table of a basic-class content-header
// payload and returns how many tags it changed. Anything it cannot parse is
// left alone.
func fixContentHeader(p []byte) int {
	// class-id(2) weight(2) body-size(8) property-flags(2, repeated while the
	// continuation bit is set), then the properties in flag order.
	if len(p) < 14 || binary.BigEndian.Uint16(p) != classBasic {
		return 0
	}
	flags := binary.BigEndian.Uint16(p[12:])
	pos := 14
	for w := flags; w&flagContinuation != 0; {
		if len(p)-pos < 2 {
			return 0
		}
		w = binary.BigEndian.Uint16(p[pos:])
		pos += 2
	}
	if flags&flagHeaders == 0 {
		return 0
	}
	for _, flag := range []uint16{flagContentType, flagContentEncoding} {
		if flags&flag == 0 {
			continue
		}
		if pos >= len(p) {
			return 0
		}
		pos += 1 + int(p[pos])
	}
	if pos > len(p) {
		return 0
	}
	fixed, _ := fixTable(p[pos:], 0)
	return fixed
}

// fixTable walks a field table (a 4-byte length, then name/value pairs)
// starting at b[0]. It returns the tags changed and whether the table was
// walked completely.
func fixTable(b []byte, depth int) (int, bool) {
	if len(b) < 4 || depth > maxTableDepth {
		return 0, false
	}
	n := uint64(binary.BigEndian.Uint32(b))
	if n > uint64(len(b)-4) {
		return 0, false
	}
	body := b[4 : 4+n]
	fixed := 0
	for pos := 0; pos < len(body); {
		keyLen := int(body[pos])
		pos += 1 + keyLen
		if pos >= len(body) {
			return fixed, false
		}
		f, size, ok := fixValue(body[pos:], depth)
		fixed += f
		if !ok {
			return fixed, false
		}
		pos += size
	}
	return fixed, true
}

// fixArray walks a field array (a 4-byte length, then tagged values).
func fixArray(b []byte, depth int) (int, bool) {
	if len(b) < 4 || depth > maxTableDepth {
		return 0, false
	}
	n := uint64(binary.BigEndian.Uint32(b))
	if n > uint64(len(b)-4) {
		return 0, false
	}
	body := b[4 : 4+n]
	fixed := 0
	for pos := 0; pos < len(body); {
		f, size, ok := fixValue(body[pos:], depth)
		fixed += f
		if !ok {
			return fixed, false
		}
		pos += size
	}
	return fixed, true
}

// fixValue handles one tagged value at b[0]: it rewrites an 'L' tag and walks
// nested containers. It returns the tags changed, the size of the value
// including its tag, and false when the value cannot be sized (an unknown
// tag or a truncated value), which stops the walk of the enclosing
// container: later values are left as they are.
//
// Sizes follow RabbitMQ and amqp091-go (the 0-9-1 errata): 's' is a signed
// 16-bit integer, not py-amqp's short string, which py-amqp never writes.
func fixValue(b []byte, depth int) (fixed int, size int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	var width int
	switch b[0] {
	case 'V':
		width = 0
	case 't', 'b', 'B':
		width = 1
	case 's', 'u':
		width = 2
	case 'I', 'i', 'f':
		width = 4
	case 'D':
		width = 5
	case 'l', 'd', 'T':
		width = 8
	case 'L':
		if len(b) < 9 {
			return 0, 0, false
		}
		b[0] = 'l'
		return 1, 9, true
	case 'S', 'x':
		if len(b) < 5 {
			return 0, 0, false
		}
		width = 4 + int(binary.BigEndian.Uint32(b[1:]))
		if width < 4 { // overflow on 32-bit platforms
			return 0, 0, false
		}
	case 'F', 'A':
		if len(b) < 5 {
			return 0, 0, false
		}
		n := uint64(binary.BigEndian.Uint32(b[1:]))
		if n > uint64(len(b)-5) {
			return 0, 0, false
		}
		walk := fixTable
		if b[0] == 'A' {
			walk = fixArray
		}
		fixed, ok := walk(b[1:], depth+1)
		return fixed, 5 + int(n), ok
	default:
		return 0, 0, false
	}
	if len(b)-1 < width {
		return 0, 0, false
	}
	return 0, 1 + width, true
}

// tagFixConn is a net.Conn whose reads pass through a frameFixer. Writes and
// deadlines go straight to the wrapped connection (amqp091-go sets read
// deadlines for heartbeats through the embedded method).
type tagFixConn struct {
	net.Conn

	mu sync.Mutex // serialises Read; amqp091-go reads from one goroutine
	f  frameFixer
	// buf holds bytes read from the connection and not returned yet:
	// buf[off:ready] are final, buf[ready:] begin a frame that is not
	// complete yet and is fed again once more bytes arrive.
	buf        []byte
	off, ready int
	err        error // sticky read error, returned once buf is drained
}

func newTagFixConn(c net.Conn) *tagFixConn { return &tagFixConn{Conn: c} }

// Read implements io.Reader over the rewritten stream.
func (c *tagFixConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if c.off < c.ready {
			n := copy(p, c.buf[c.off:c.ready])
			c.off += n
			return n, nil
		}
		if c.err != nil {
			if c.off < len(c.buf) {
				// The stream ended inside a frame: hand out the rest
				// unmodified, so that the reader sees the same truncation.
				n := copy(p, c.buf[c.off:])
				c.off += n
				c.ready = c.off
				return n, nil
			}
			return 0, c.err
		}
		if c.off == len(c.buf) {
			// Nothing held. Fast path: read straight into p and keep back
			// only an incomplete frame at its end.
			c.buf, c.off, c.ready = c.buf[:0], 0, 0
			n, err := c.Conn.Read(p)
			c.err = err
			if n == 0 {
				continue
			}
			k := c.f.feed(p[:n])
			c.buf = append(c.buf, p[k:n]...)
			if k > 0 {
				return k, nil
			}
			continue
		}
		// An incomplete frame is held: move it to the front, then append.
		if c.off > 0 {
			m := copy(c.buf, c.buf[c.off:])
			c.buf, c.off, c.ready = c.buf[:m], 0, 0
		}
		if cap(c.buf)-len(c.buf) < 4096 {
			grown := make([]byte, len(c.buf), 2*cap(c.buf)+4096)
			copy(grown, c.buf)
			c.buf = grown
		}
		start := len(c.buf)
		n, err := c.Conn.Read(c.buf[start:cap(c.buf)])
		c.err = err
		c.buf = c.buf[:start+n]
		if n > 0 {
			c.ready = c.f.feed(c.buf)
		}
	}
}

// ConnectionState returns the TLS state of the wrapped connection (zero when
// it is not TLS), so that amqp091's Connection.ConnectionState still works.
func (c *tagFixConn) ConnectionState() tls.ConnectionState {
	if tc, ok := c.Conn.(interface{ ConnectionState() tls.ConnectionState }); ok {
		return tc.ConnectionState()
	}
	return tls.ConnectionState{}
}

var _ io.Reader = (*tagFixConn)(nil)
