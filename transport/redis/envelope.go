package redis

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the pure, fuzzed helpers that read and edit kombu's JSON
// envelope and unacked entries at the byte level. Whole-message decoding is
// protocol.DecodeEnvelope's job; these helpers only touch the few fields the
// transport's bookkeeping needs and keep everything else byte-for-byte (or,
// when they must re-encode an object, value-for-value).

var errEnvelope = errors.New("redis: malformed envelope")

// envMeta is what the bookkeeping needs from an envelope.
type envMeta struct {
	Tag         string
	Exchange    string
	RoutingKey  string
	Priority    int
	Redelivered bool
}

// parseMeta reads the delivery tag, delivery_info and priority of an
// envelope. Like kombu's Lua-free path it requires properties.delivery_tag
// to be a string; a missing exchange reads as "" and a missing routing key
// as "" (callers substitute the queue).
func parseMeta(raw []byte) (envMeta, error) {
	var env struct {
		Properties *struct {
			DeliveryTag  any `json:"delivery_tag"`
			Priority     any `json:"priority"`
			DeliveryInfo *struct {
				Exchange    any `json:"exchange"`
				RoutingKey  any `json:"routing_key"`
				Redelivered any `json:"redelivered"`
			} `json:"delivery_info"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return envMeta{}, fmt.Errorf("%w: %v", errEnvelope, err)
	}
	if env.Properties == nil {
		return envMeta{}, fmt.Errorf("%w: no properties", errEnvelope)
	}
	tag, ok := env.Properties.DeliveryTag.(string)
	if !ok || tag == "" {
		return envMeta{}, fmt.Errorf("%w: no delivery_tag", errEnvelope)
	}
	m := envMeta{Tag: tag, Priority: priorityOf(env.Properties.Priority)}
	if di := env.Properties.DeliveryInfo; di != nil {
		m.Exchange, _ = di.Exchange.(string)
		m.RoutingKey, _ = di.RoutingKey.(string)
		m.Redelivered, _ = di.Redelivered.(bool)
	}
	return m, nil
}

// priorityOf converts a decoded priority property as kombu's
// _get_message_priority does: int(value) clamped to 0..9, 0 when invalid.
func priorityOf(v any) int {
	switch p := v.(type) {
	case float64:
		if p != p || p > 1e9 || p < -1e9 {
			return 0
		}
		return clampPriority(int(p))
	case string:
		n, err := strconv.Atoi(p)
		if err != nil {
			return 0
		}
		return clampPriority(n)
	case bool:
		if p {
			return 1
		}
	}
	return 0
}

// editObject decodes a JSON object into its members, keeping each value's
// bytes.
func editObject(raw []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("not an object")
	}
	return m, nil
}

// marshalObject encodes members without HTML escaping, so values come out
// as they went in (modulo whitespace).
func marshalObject(m map[string]json.RawMessage) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

var jsonTrue = json.RawMessage("true")

// markRedelivered sets headers.redelivered and
// properties.delivery_info.redelivered to true, as kombu's
// _do_restore_message does before putting a message back. Members that are
// missing or not objects are left alone (kombu gives up on the first
// KeyError); every other member keeps its value.
func markRedelivered(raw []byte) ([]byte, error) {
	top, err := editObject(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errEnvelope, err)
	}
	if h, err := editObject(top["headers"]); err == nil {
		h["redelivered"] = jsonTrue
		if top["headers"], err = marshalObject(h); err != nil {
			return nil, err
		}
	}
	if p, err := editObject(top["properties"]); err == nil {
		if di, err := editObject(p["delivery_info"]); err == nil {
			di["redelivered"] = jsonTrue
			if p["delivery_info"], err = marshalObject(di); err != nil {
				return nil, err
			}
			if top["properties"], err = marshalObject(p); err != nil {
				return nil, err
			}
		}
	}
	return marshalObject(top)
}

// resetRetries sets headers.retries to 0 (dead-letter replay with a fresh
// retry budget). An envelope without a headers object is returned unchanged.
func resetRetries(raw []byte) ([]byte, error) {
	top, err := editObject(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errEnvelope, err)
	}
	h, err := editObject(top["headers"])
	if err != nil {
		return raw, nil
	}
	if _, ok := h["retries"]; !ok {
		return raw, nil
	}
	h["retries"] = json.RawMessage("0")
	if top["headers"], err = marshalObject(h); err != nil {
		return nil, err
	}
	return marshalObject(top)
}

// unackedValue is kombu's unacked hash value, json.dumps([envelope,
// exchange, routing_key]), with the envelope kept exactly as popped.
func unackedValue(raw []byte, exchange, routingKey string) []byte {
	b := make([]byte, 0, len(raw)+len(exchange)+len(routingKey)+10)
	b = append(b, '[')
	b = append(b, raw...)
	b = append(b, ", "...)
	b = appendPyString(b, exchange)
	b = append(b, ", "...)
	b = appendPyString(b, routingKey)
	return append(b, ']')
}

// splitUnacked splits an unacked hash value into kombu's three parts:
// message, exchange, routing key.
func splitUnacked(v []byte) ([]json.RawMessage, error) {
	var parts []json.RawMessage
	if err := json.Unmarshal(v, &parts); err != nil {
		return nil, fmt.Errorf("redis: malformed unacked entry: %w", err)
	}
	if len(parts) != 3 {
		return nil, fmt.Errorf("redis: malformed unacked entry: %d elements", len(parts))
	}
	return parts, nil
}

// parseUnacked splits an unacked hash value into envelope, exchange and
// routing key. A null exchange or routing key reads as "".
func parseUnacked(v []byte) (env json.RawMessage, exchange, routingKey string, err error) {
	parts, err := splitUnacked(v)
	if err != nil {
		return nil, "", "", err
	}
	if _, err := editObject(parts[0]); err != nil {
		return nil, "", "", fmt.Errorf("redis: malformed unacked entry: envelope: %v", err)
	}
	var ex, rk *string
	if err := json.Unmarshal(parts[1], &ex); err != nil {
		return nil, "", "", fmt.Errorf("redis: malformed unacked entry: exchange: %w", err)
	}
	if err := json.Unmarshal(parts[2], &rk); err != nil {
		return nil, "", "", fmt.Errorf("redis: malformed unacked entry: routing key: %w", err)
	}
	if ex != nil {
		exchange = *ex
	}
	if rk != nil {
		routingKey = *rk
	}
	return parts[0], exchange, routingKey, nil
}

// appendPyString appends s as Python's json.dumps writes a str
// (ensure_ascii: non-ASCII as \uXXXX, surrogate pairs above U+FFFF).
func appendPyString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20 || (r >= 0x7f && r <= 0xffff):
			b = append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			for _, x := range []rune{r1, r2} {
				b = append(b, '\\', 'u', hex[x>>12&0xf], hex[x>>8&0xf], hex[x>>4&0xf], hex[x&0xf])
			}
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}

// deadItem is one element of a dead-letter list.
type deadItem struct {
	// ID is the delivery tag, or a generated id when the envelope had none.
	ID string `json:"id"`
	// Envelope is the kombu envelope object as it was popped; for an
	// undecodable item, a JSON string holding the raw bytes.
	Envelope   json.RawMessage `json:"envelope"`
	Queue      string          `json:"queue"`
	Exchange   string          `json:"exchange"`
	RoutingKey string          `json:"routing_key"`
	Reason     string          `json:"reason"`
	Error      string          `json:"error"`
	TaskID     string          `json:"task_id"`
	TaskName   string          `json:"task_name"`
	// Time is RFC 3339 UTC with nanoseconds, or Unix seconds (a number) in
	// items written by the consume script.
	Time json.RawMessage `json:"time"`
}

// encodeDeadItem serializes a dead-letter item, keeping the envelope's
// bytes exactly (it is appended last, not re-encoded).
func encodeDeadItem(d *deadItem) ([]byte, error) {
	env := d.Envelope
	if !json.Valid(env) {
		return nil, errors.New("redis: dead-letter envelope is not JSON")
	}
	c := *d
	c.Envelope = json.RawMessage("null")
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&c); err != nil {
		return nil, err
	}
	out := bytes.TrimRight(b.Bytes(), "\n")
	// Replace the placeholder member, which the encoder wrote second.
	const ph = `,"envelope":null`
	i := bytes.Index(out, []byte(ph))
	if i < 0 {
		return nil, errors.New("redis: dead-letter item encoding")
	}
	res := make([]byte, 0, len(out)+len(env))
	res = append(res, out[:i]...)
	res = append(res, out[i+len(ph):len(out)-1]...)
	res = append(res, `,"envelope":`...)
	res = append(res, env...)
	return append(res, '}'), nil
}

// decodeDeadItem parses a dead-letter list item.
func decodeDeadItem(raw []byte) (*deadItem, error) {
	var d deadItem
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("redis: malformed dead-letter item: %w", err)
	}
	if d.ID == "" {
		return nil, errors.New("redis: malformed dead-letter item: no id")
	}
	return &d, nil
}

// envelopeBytes returns the envelope of a dead item as bytes to push back
// to a queue: the object itself, or the raw text of an undecodable item.
func (d *deadItem) envelopeBytes() []byte {
	if len(d.Envelope) > 0 && d.Envelope[0] == '"' {
		var s string
		if json.Unmarshal(d.Envelope, &s) == nil {
			return []byte(s)
		}
	}
	return d.Envelope
}
