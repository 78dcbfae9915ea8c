package protocol

import (
	"errors"
	"fmt"
)

// orderedObject writes a JSON object or msgpack map whose keys keep the
// order they were added in. Python readers do not care about key order,
// but writing Celery's order makes our documents diff cleanly against
// captures. Values are serialized by Marshal; only the framing is written
// here. The first error sticks: later adds are no-ops and bytes returns it.
type orderedObject struct {
	contentType string
	pairs       [][2][]byte
	err         error
}

func newOrderedObject(contentType string, size int) *orderedObject {
	return &orderedObject{contentType: contentType, pairs: make([][2][]byte, 0, size)}
}

// add appends key: v.
func (o *orderedObject) add(key string, v any) {
	if o.err != nil {
		return
	}
	raw, err := Marshal(o.contentType, v)
	if err != nil {
		o.err = fmt.Errorf("%s: %w", key, err)
		return
	}
	o.addRaw(key, raw)
}

// addObject appends key with a nested ordered object as its value.
func (o *orderedObject) addObject(key string, v *orderedObject) {
	raw, err := v.bytes()
	if err != nil {
		if o.err == nil {
			o.err = fmt.Errorf("%s: %w", key, err)
		}
		return
	}
	o.addRaw(key, raw)
}

// addRaw appends key with a value already serialized with the object's
// content type.
func (o *orderedObject) addRaw(key string, raw []byte) {
	if o.err != nil {
		return
	}
	k, err := Marshal(o.contentType, key)
	if err != nil {
		o.err = err
		return
	}
	o.pairs = append(o.pairs, [2][]byte{k, raw})
}

// bytes returns the serialized object, or the first error of an add.
func (o *orderedObject) bytes() ([]byte, error) {
	if o.err != nil {
		return nil, o.err
	}
	size := 16
	for _, p := range o.pairs {
		size += len(p[0]) + len(p[1]) + 4
	}
	b := make([]byte, 0, size)
	switch o.contentType {
	case ContentTypeJSON:
		// Python's json.dumps separators, as kombu writes them.
		b = append(b, '{')
		for i, p := range o.pairs {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(b, p[0]...)
			b = append(b, ": "...)
			b = append(b, p[1]...)
		}
		return append(b, '}'), nil
	case ContentTypeMsgpack:
		n := len(o.pairs)
		switch {
		case n < 16:
			b = append(b, 0x80|byte(n))
		case n < 1<<16:
			b = append(b, 0xde, byte(n>>8), byte(n))
		default:
			return nil, errors.New("protocol: too many keys")
		}
		for _, p := range o.pairs {
			b = append(b, p[0]...)
			b = append(b, p[1]...)
		}
		return b, nil
	}
	return nil, &ContentTypeError{ContentType: o.contentType}
}
