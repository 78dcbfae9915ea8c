package protocol

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// contentTypeByName resolves a content type given as a MIME type or as
// kombu's serializer name (accept_content may use either), ignoring case
// and MIME parameters. It returns "" for a type it does not know.
func contentTypeByName(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if i := strings.IndexByte(name, ';'); i >= 0 {
		name = strings.TrimSpace(name[:i])
	}
	switch name {
	case ContentTypeJSON, "json":
		return ContentTypeJSON
	case ContentTypeMsgpack, "msgpack":
		return ContentTypeMsgpack
	case ContentTypeYAML, "yaml":
		return ContentTypeYAML
	case ContentTypePickle, "pickle":
		return ContentTypePickle
	case ContentTypeData, "":
		return ContentTypeData
	case ContentTypeText, contentTypeAppText:
		return ContentTypeText
	}
	return ""
}

// contentTypeAppText is the other text type kombu always trusts.
const contentTypeAppText = "application/text"

// accepts reports whether opts allow deserializing ct (already resolved).
// Raw data and text are always allowed, as in kombu, and pickle never.
func (o DecodeOptions) accepts(ct string) bool {
	switch ct {
	case ContentTypeData, ContentTypeText:
		return true
	case ContentTypePickle, "":
		return false
	}
	if len(o.Accept) == 0 {
		return ct == ContentTypeJSON || ct == ContentTypeMsgpack
	}
	for _, a := range o.Accept {
		if contentTypeByName(a) == ct {
			return true
		}
	}
	return false
}

// Marshal serializes v with the serializer for contentType:
//
//   - application/json (or "" or "json"): [AppendJSON] with plain values
//     that every Celery client reads;
//   - application/x-msgpack ("msgpack"): [AppendMsgpack];
//   - application/data: v must be []byte or string, written as is;
//   - text/plain and application/text: v must be a string or []byte.
//
// Pickle, YAML and unknown types fail with a *ContentTypeError (which
// wraps ErrUnsupportedContentType).
func Marshal(contentType string, v any) ([]byte, error) {
	ct := contentTypeByName(contentType)
	if strings.TrimSpace(contentType) == "" {
		ct = ContentTypeJSON
	}
	switch ct {
	case ContentTypeJSON:
		return AppendJSON(nil, v, JSONOptions{})
	case ContentTypeMsgpack:
		return AppendMsgpack(nil, v)
	case ContentTypeData, ContentTypeText:
		switch x := v.(type) {
		case []byte:
			return bytes.Clone(x), nil
		case string:
			return []byte(x), nil
		}
		return nil, fmt.Errorf("protocol: content type %q carries a string or []byte, not %T", contentType, v)
	}
	return nil, &ContentTypeError{ContentType: contentType}
}

// Unmarshal deserializes data with the serializer for contentType, into
// the package's value types:
//
//   - application/json: [DecodeJSON];
//   - application/x-msgpack: [DecodeMsgpack];
//   - application/data (and an empty content type, which kombu reads as
//     application/data): a copy of data as []byte;
//   - text/plain and application/text: data as a string, which must be
//     UTF-8.
//
// Raw data and text are always accepted, as kombu trusts them. Any other
// type must be listed in opts.Accept (by MIME type or kombu name; empty
// means JSON and msgpack) or the result is a *ContentTypeError. Pickle is
// refused even when listed: unpickling runs arbitrary code. YAML is
// refused as well: a safe YAML loader would need a new dependency, and
// kombu's default accept list never includes it. Unknown types are
// *ContentTypeError too. The size bound opts.MaxBodySize applies to every
// type.
func Unmarshal(contentType string, data []byte, opts DecodeOptions) (any, error) {
	ct := contentTypeByName(contentType)
	if !opts.accepts(ct) || ct == ContentTypeYAML {
		return nil, &ContentTypeError{ContentType: contentType}
	}
	switch ct {
	case ContentTypeJSON:
		return DecodeJSON(data, opts)
	case ContentTypeMsgpack:
		return DecodeMsgpack(data, opts)
	}
	if len(data) > opts.maxBodySize() {
		return nil, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrTooLarge, len(data), opts.maxBodySize())
	}
	if ct == ContentTypeText {
		if !utf8.Valid(data) {
			return nil, fmt.Errorf("protocol: %s body is not valid UTF-8", contentType)
		}
		return string(data), nil
	}
	return append([]byte{}, data...), nil
}
