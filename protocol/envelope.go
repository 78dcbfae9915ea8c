package protocol

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// DeliveryInfo is the kombu Redis envelope's properties.delivery_info.
type DeliveryInfo struct {
	Exchange    string
	RoutingKey  string
	Redelivered bool
}

// Envelope is one item of a kombu Redis list (or a message published on a
// kombu fanout channel): the message plus the transport fields kombu adds.
type Envelope struct {
	Message Message
	// BodyEncoding is "base64" (kombu's default) or "" for a raw body.
	BodyEncoding string
	// DeliveryTag is a UUID4 string chosen by the publisher and kept on
	// redelivery.
	DeliveryTag  string
	DeliveryInfo DeliveryInfo
}

// Envelope keys and the property keys Envelope and Properties model
// (kombu/transport/virtual/base.py prepare_message and
// _inplace_augment_message).
const (
	envBody            = "body"
	envContentEncoding = "content-encoding"
	envContentType     = "content-type"
	envHeaders         = "headers"
	envProperties      = "properties"

	propCorrelationID = "correlation_id"
	propReplyTo       = "reply_to"
	propDeliveryMode  = "delivery_mode"
	propPriority      = "priority"
	propExpiration    = "expiration"
	propDeliveryInfo  = "delivery_info"
	propBodyEncoding  = "body_encoding"
	propDeliveryTag   = "delivery_tag"

	// BodyEncodingBase64 is kombu's default Envelope.BodyEncoding.
	BodyEncodingBase64 = "base64"
)

func isEnvelopeProperty(k string) bool {
	switch k {
	case propCorrelationID, propReplyTo, propDeliveryMode, propPriority, propExpiration,
		propDeliveryInfo, propBodyEncoding, propDeliveryTag:
		return true
	}
	return false
}

// EncodeEnvelope encodes e as kombu's Redis JSON envelope, with kombu's key
// order:
//
//	{"body": "<base64>", "content-encoding": ..., "content-type": ...,
//	 "headers": {...}, "properties": {"correlation_id", "reply_to", <Extra>,
//	 "delivery_mode", "expiration", "delivery_info": {"exchange",
//	 "routing_key"[, "redelivered"]}, "priority", "body_encoding",
//	 "delivery_tag"}}
//
// correlation_id, reply_to, expiration and delivery_mode are written only
// when set, priority always (kombu does), redelivered only when true (kombu
// adds it when it restores a message). e.BodyEncoding is "base64" or ""
// (the body is then written as a string and must be valid UTF-8).
// DeliveryTag may not be empty: kombu's consumers key their unacked
// bookkeeping by it. Properties.Extra may not repeat a modelled property.
func EncodeEnvelope(e *Envelope) ([]byte, error) {
	if e == nil {
		return nil, errors.New("protocol: encode envelope: nil envelope")
	}
	if e.DeliveryTag == "" {
		return nil, errors.New("protocol: encode envelope: empty delivery tag")
	}
	m := &e.Message
	var body string
	switch e.BodyEncoding {
	case BodyEncodingBase64:
		body = base64.StdEncoding.EncodeToString(m.Body)
	case "":
		if !utf8.Valid(m.Body) {
			return nil, errors.New("protocol: encode envelope: raw body is not valid UTF-8; use base64")
		}
		body = string(m.Body)
	default:
		return nil, fmt.Errorf("protocol: encode envelope: unsupported body encoding %q", e.BodyEncoding)
	}
	p := &m.Properties
	for k := range p.Extra {
		if isEnvelopeProperty(k) {
			return nil, fmt.Errorf("protocol: encode envelope: property %q is set through a field, not Extra", k)
		}
	}

	props := newOrderedObject(ContentTypeJSON, 256)
	if p.CorrelationID != "" {
		props.add(propCorrelationID, p.CorrelationID)
	}
	if p.ReplyTo != "" {
		props.add(propReplyTo, p.ReplyTo)
	}
	extra := make([]string, 0, len(p.Extra))
	for k := range p.Extra {
		extra = append(extra, k)
	}
	slices.Sort(extra)
	for _, k := range extra {
		props.add(k, p.Extra[k])
	}
	if p.DeliveryMode != 0 {
		props.add(propDeliveryMode, int64(p.DeliveryMode))
	}
	if p.Expiration != "" {
		props.add(propExpiration, p.Expiration)
	}
	di := newOrderedObject(ContentTypeJSON, 64)
	di.add("exchange", e.DeliveryInfo.Exchange)
	di.add("routing_key", e.DeliveryInfo.RoutingKey)
	if e.DeliveryInfo.Redelivered {
		di.add("redelivered", true)
	}
	props.addObject(propDeliveryInfo, di)
	props.add(propPriority, int64(p.Priority))
	if e.BodyEncoding != "" {
		props.add(propBodyEncoding, e.BodyEncoding)
	}
	props.add(propDeliveryTag, e.DeliveryTag)

	headers := m.Headers
	if headers == nil {
		headers = map[string]any{}
	}
	doc := newOrderedObject(ContentTypeJSON, len(body)+512)
	doc.add(envBody, body)
	doc.add(envContentEncoding, nullIfEmpty(m.ContentEncoding))
	doc.add(envContentType, nullIfEmpty(m.ContentType))
	doc.add(envHeaders, headers)
	doc.addObject(envProperties, props)
	data, err := doc.bytes()
	if err != nil {
		return nil, fmt.Errorf("protocol: encode envelope: %w", err)
	}
	return data, nil
}

// envelopeLimit bounds the whole envelope document: the body may be
// MaxBodySize bytes after base64 decoding, so the document may be a third
// larger than that, plus headers and properties.
func envelopeLimit(bodyMax int) int {
	const overhead = 1 << 20
	if bodyMax > (math.MaxInt-overhead)/2 {
		return math.MaxInt
	}
	return 2*bodyMax + overhead
}

// DecodeEnvelope decodes a kombu Redis JSON envelope: the item of a kombu
// Redis list, an entry of the unacked hash, or a message published on a
// kombu fanout channel. The body is base64-decoded (when
// properties.body_encoding is "base64") but not deserialized; pass
// Envelope.Message to [DecodeTask]. Properties this package does not model
// (Celery 5.2 leaks "origin" and "replaced_task_nesting" into them) are
// kept in Message.Properties.Extra; unknown keys of delivery_info are
// ignored.
//
// The body may be at most opts.MaxBodySize bytes after base64 decoding
// (error wrapping ErrTooLarge), the document at most about twice that;
// opts.Accept does not apply (the envelope is always JSON). Malformed
// input fails with a *DecodeError naming the key.
func DecodeEnvelope(data []byte, opts DecodeOptions) (*Envelope, error) {
	limit := opts.maxBodySize()
	docOpts := DecodeOptions{MaxBodySize: envelopeLimit(limit), MaxDepth: opts.MaxDepth}
	if len(data) > docOpts.MaxBodySize {
		return nil, &DecodeError{Field: "envelope", Err: fmt.Errorf("%w: %d bytes", ErrTooLarge, len(data))}
	}
	if e, ok := decodeEnvelopeFast(data, limit, docOpts.maxDepth()); ok {
		return e, nil
	}
	return decodeEnvelopeDoc(data, limit, docOpts)
}

// decodeEnvelopeDoc is DecodeEnvelope by way of the whole document as a
// map: it handles every input, and decides every error.
func decodeEnvelopeDoc(data []byte, limit int, docOpts DecodeOptions) (*Envelope, error) {
	v, err := Unmarshal(ContentTypeJSON, data, docOpts)
	if err != nil {
		return nil, &DecodeError{Field: "envelope", Err: err}
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, fieldTypeError("envelope", "an object", v)
	}
	e := &Envelope{}
	m := &e.Message
	if m.ContentType, err = optionalString(doc, envContentType); err != nil {
		return nil, err
	}
	if m.ContentEncoding, err = optionalString(doc, envContentEncoding); err != nil {
		return nil, err
	}
	switch h := doc[envHeaders].(type) {
	case nil:
	case map[string]any:
		m.Headers = h
	default:
		return nil, fieldTypeError(envHeaders, "an object", h)
	}
	var props map[string]any
	switch p := doc[envProperties].(type) {
	case nil:
	case map[string]any:
		props = p
	default:
		return nil, fieldTypeError(envProperties, "an object", p)
	}
	if err := e.setProperties(props); err != nil {
		return nil, err
	}

	rawBody, ok := doc[envBody].(string)
	if !ok {
		return nil, fieldTypeError(envBody, "a string", doc[envBody])
	}
	if m.Body, err = decodeBody(e.BodyEncoding, []byte(rawBody), limit); err != nil {
		return nil, err
	}
	return e, nil
}

// decodeBody undoes the envelope's body encoding.
func decodeBody(encoding string, raw []byte, limit int) ([]byte, error) {
	var body []byte
	switch encoding {
	case BodyEncodingBase64:
		if base64.StdEncoding.DecodedLen(len(raw)) > limit+3 {
			return nil, &DecodeError{Field: envBody, Err: fmt.Errorf("%w: base64 body of %d bytes exceeds %d decoded", ErrTooLarge, len(raw), limit)}
		}
		// RawStdEncoding's length is the larger: unpadded input fits too.
		body = make([]byte, base64.RawStdEncoding.DecodedLen(len(raw)))
		n, err := base64.StdEncoding.Decode(body, raw)
		if err != nil {
			// kombu's b64decode tolerates missing padding.
			var rawErr error
			if n, rawErr = base64.RawStdEncoding.Decode(body, raw); rawErr != nil {
				return nil, &DecodeError{Field: envBody, Err: err}
			}
		}
		body = body[:n]
	case "":
		body = bytes.Clone(raw)
		if body == nil {
			body = []byte{}
		}
	default:
		return nil, &DecodeError{Field: "properties.body_encoding", Err: fmt.Errorf("unsupported body encoding %q", encoding)}
	}
	if len(body) > limit {
		return nil, &DecodeError{Field: envBody, Err: fmt.Errorf("%w: %d bytes exceed %d", ErrTooLarge, len(body), limit)}
	}
	return body, nil
}

// decodeEnvelopeFast decodes the envelopes kombu writes without building
// the document: the top-level object is walked key by key and the body is
// base64-decoded straight from the input. It takes only what it is sure
// to decode exactly as decodeEnvelopeDoc would (each top-level key once,
// the five kombu keys, a body string without escapes, headers and
// properties that are objects) and reports false for anything else,
// errors included, so that decodeEnvelopeDoc decides those.
func decodeEnvelopeFast(data []byte, limit, maxDepth int) (*Envelope, bool) {
	var scratch decodeScratch
	d := jsonDecoder{data: data, maxDepth: maxDepth, vals: scratch.vals[:0], keys: scratch.keys[:0]}
	d.skipSpace()
	if d.pos >= len(d.data) || d.data[d.pos] != '{' || d.enter() != nil {
		return nil, false
	}
	d.pos++
	e := &Envelope{}
	m := &e.Message
	var body []byte
	var props map[string]any
	var seen uint8
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, false
		}
		k, err := d.key()
		if err != nil {
			return nil, false
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, false
		}
		d.pos++
		d.skipSpace()
		var bit uint8
		switch k {
		case envBody:
			bit = 1
			if body = d.plainString(); body == nil {
				return nil, false
			}
		case envContentType, envContentEncoding:
			bit = 2
			if k == envContentEncoding {
				bit = 4
			}
			v, err := d.value()
			if err != nil {
				return nil, false
			}
			switch v := v.(type) {
			case nil:
			case string:
				if k == envContentType {
					m.ContentType = v
				} else {
					m.ContentEncoding = v
				}
			default:
				return nil, false
			}
		case envHeaders, envProperties:
			bit = 8
			if k == envProperties {
				bit = 16
			}
			if d.pos >= len(d.data) || d.data[d.pos] != '{' {
				return nil, false
			}
			v, err := d.value()
			if err != nil {
				return nil, false
			}
			obj, ok := v.(map[string]any)
			if !ok {
				return nil, false // a typed value, not an object
			}
			if k == envHeaders {
				m.Headers = obj
			} else {
				props = obj
			}
		default:
			return nil, false
		}
		if seen&bit != 0 {
			return nil, false // a repeated key: the last one wins there
		}
		seen |= bit
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, false
		}
		c := d.data[d.pos]
		d.pos++
		if c == '}' {
			break
		}
		if c != ',' {
			return nil, false
		}
	}
	d.skipSpace()
	// The whole document, exactly one body, and not a kombu typed value
	// (which has only __type__ and __value__ keys, never these).
	if d.pos != len(d.data) || seen&1 == 0 {
		return nil, false
	}
	if err := e.setProperties(props); err != nil {
		return nil, false
	}
	var err error
	if m.Body, err = decodeBody(e.BodyEncoding, body, limit); err != nil {
		return nil, false
	}
	return e, true
}

func (e *Envelope) setProperties(props map[string]any) error {
	p := &e.Message.Properties
	// The field names are constants: built per message they would cost an
	// allocation each.
	strs := [...]struct {
		key, field string
		dst        *string
	}{
		{propCorrelationID, "properties." + propCorrelationID, &p.CorrelationID},
		{propReplyTo, "properties." + propReplyTo, &p.ReplyTo},
		{propBodyEncoding, "properties." + propBodyEncoding, &e.BodyEncoding},
		{propDeliveryTag, "properties." + propDeliveryTag, &e.DeliveryTag},
	}
	var err error
	for _, s := range strs {
		if *s.dst, err = stringField(props[s.key], s.field); err != nil {
			return err
		}
	}
	if v := props[propDeliveryMode]; v != nil {
		n, ok := int64Value(v)
		if !ok || n < 0 || n > math.MaxUint8 {
			return fieldTypeError("properties."+propDeliveryMode, "an integer 0..255", v)
		}
		p.DeliveryMode = uint8(n)
	}
	if v := props[propPriority]; v != nil {
		if p.Priority, err = intValue("properties."+propPriority, v); err != nil {
			return err
		}
	}
	switch x := props[propExpiration].(type) {
	case nil:
	case string:
		p.Expiration = x
	default:
		n, ok := int64Value(x)
		if !ok {
			return fieldTypeError("properties."+propExpiration, "a string of milliseconds", x)
		}
		p.Expiration = strconv.FormatInt(n, 10)
	}
	switch di := props[propDeliveryInfo].(type) {
	case nil:
	case map[string]any:
		if e.DeliveryInfo.Exchange, err = stringField(di["exchange"], "properties.delivery_info.exchange"); err != nil {
			return err
		}
		if e.DeliveryInfo.RoutingKey, err = stringField(di["routing_key"], "properties.delivery_info.routing_key"); err != nil {
			return err
		}
		switch r := di["redelivered"].(type) {
		case nil:
		case bool:
			e.DeliveryInfo.Redelivered = r
		default:
			return fieldTypeError("properties.delivery_info.redelivered", "a bool", r)
		}
	default:
		return fieldTypeError("properties."+propDeliveryInfo, "an object", di)
	}
	for k, v := range props {
		if isEnvelopeProperty(k) {
			continue
		}
		if p.Extra == nil {
			p.Extra = make(map[string]any)
		}
		p.Extra[k] = v
	}
	return nil
}
