package protocol

import (
	"fmt"
	"slices"
)

// orderedObject writes a JSON object or msgpack map whose keys keep the
// order they were added in. Python readers do not care about key order,
// but writing Celery's order makes our documents diff cleanly against
// captures. Values are serialized by AppendJSON/AppendMsgpack (what
// Marshal uses) straight into one buffer; only the framing is written
// here. The first error sticks: later adds are no-ops and bytes returns
// it.
type orderedObject struct {
	msgpack bool
	buf     []byte
	n       int
	err     error
}

// newOrderedObject starts an object for contentType (a MIME type or kombu
// name), JSON or msgpack. size is a hint for the buffer, in bytes.
func newOrderedObject(contentType string, size int) *orderedObject {
	o := &orderedObject{buf: make([]byte, 0, size)}
	switch contentTypeByName(contentType) {
	case ContentTypeJSON:
		o.buf = append(o.buf, '{')
	case ContentTypeMsgpack:
		// One byte for a fixmap header, patched (or widened) by bytes.
		o.msgpack = true
		o.buf = append(o.buf, 0x80)
	default:
		o.err = &ContentTypeError{ContentType: contentType}
	}
	return o
}

// key writes the separator and key of the next pair.
func (o *orderedObject) key(k string) {
	if o.msgpack {
		o.buf, o.err = AppendMsgpack(o.buf, k)
	} else {
		if o.n > 0 {
			o.buf = append(o.buf, ", "...) // Python's json.dumps separators
		}
		if o.buf, o.err = AppendJSON(o.buf, k, JSONOptions{}); o.err == nil {
			o.buf = append(o.buf, ": "...)
		}
	}
	o.n++
}

// add appends key: v.
func (o *orderedObject) add(key string, v any) {
	if o.err != nil {
		return
	}
	o.key(key)
	if o.err != nil {
		return
	}
	var err error
	if o.msgpack {
		o.buf, err = AppendMsgpack(o.buf, v)
	} else {
		o.buf, err = AppendJSON(o.buf, v, JSONOptions{})
	}
	if err != nil {
		o.err = fmt.Errorf("%s: %w", key, err)
	}
}

// addObject appends key with a nested ordered object (of the same content
// type) as its value.
func (o *orderedObject) addObject(key string, v *orderedObject) {
	raw, err := v.bytes()
	if err != nil {
		if o.err == nil {
			o.err = fmt.Errorf("%s: %w", key, err)
		}
		return
	}
	if o.err != nil {
		return
	}
	o.key(key)
	if o.err == nil {
		o.buf = append(o.buf, raw...)
	}
}

// bytes returns the serialized object, or the first error of an add. The
// object must not be added to afterwards.
func (o *orderedObject) bytes() ([]byte, error) {
	if o.err != nil {
		return nil, o.err
	}
	if !o.msgpack {
		return append(o.buf, '}'), nil
	}
	switch {
	case o.n < 16:
		o.buf[0] = 0x80 | byte(o.n)
	case o.n < 1<<16:
		o.buf[0] = 0xde
		o.buf = slices.Insert(o.buf, 1, byte(o.n>>8), byte(o.n))
	default:
		o.buf[0] = 0xdf
		o.buf = slices.Insert(o.buf, 1, byte(o.n>>24), byte(o.n>>16), byte(o.n>>8), byte(o.n))
	}
	return o.buf, nil
}
