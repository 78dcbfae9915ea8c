package redis

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func fuzzSeeds(f *testing.F) {
	f.Add([]byte(pyEnvelope("3f61f38c-4769-4e0a-b61f-d3fefc2fda30", "exp_celery", 6, 1)))
	f.Add([]byte(`{"body": "e30=", "headers": null, "properties": {"delivery_info": {"exchange": "", "routing_key": "q", "redelivered": true}, "delivery_tag": "t", "priority": 5}}`))
	f.Add([]byte(`{"properties": {"delivery_tag": 1, "priority": "x"}}`))
	f.Add([]byte(`[{"body": "", "properties": {}}, "", "exp_celery"]`))
	f.Add([]byte(`{"id":"t","envelope":{"a":1},"queue":"q","time":1795958084.5}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]`))
	f.Add([]byte("\xff\xfe"))
	f.Add([]byte(`{"headers": {"retries": 3}}`))
}

// FuzzEnvelopeHelpers checks that no envelope or unacked entry, however
// broken, makes the bookkeeping helpers panic, and that what they accept
// round-trips.
func FuzzEnvelopeHelpers(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		if m, err := parseMeta(data); err == nil {
			if m.Tag == "" || m.Priority < 0 || m.Priority > 9 {
				t.Fatalf("parseMeta accepted %q as %+v", data, m)
			}
			// The unacked entry built from an accepted envelope parses back.
			v := unackedValue(data, m.Exchange, m.RoutingKey)
			env, ex, rk, err := parseUnacked(v)
			if err != nil {
				t.Fatalf("parseUnacked(unackedValue(%q)): %v", data, err)
			}
			if !bytes.Equal(env, data) || ex != m.Exchange || rk != m.RoutingKey {
				t.Fatalf("unacked round trip: %q %q %q", env, ex, rk)
			}
		}
		if out, err := markRedelivered(data); err == nil {
			if !json.Valid(out) {
				t.Fatalf("markRedelivered produced invalid JSON %q", out)
			}
			var top map[string]json.RawMessage
			json.Unmarshal(out, &top)
			var h map[string]any
			if json.Unmarshal(top["headers"], &h) == nil && h != nil && h["redelivered"] != true {
				t.Fatalf("headers.redelivered not set in %q", out)
			}
			// Idempotent: a second restore changes nothing.
			again, err := markRedelivered(out)
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("markRedelivered not idempotent: %q -> %q", out, again)
			}
		}
		if out, err := resetRetries(data); err == nil && !json.Valid(out) && json.Valid(data) {
			t.Fatalf("resetRetries produced invalid JSON %q", out)
		}
		parseUnacked(data)
		if d, err := decodeDeadItem(data); err == nil {
			d.envelopeBytes()
			parseDeadTime(d.Time)
			if json.Valid(d.Envelope) {
				if _, err := encodeDeadItem(d); err != nil {
					t.Fatalf("encodeDeadItem of a decoded item: %v", err)
				}
			}
		}
		s := string(appendPyString(nil, string(data)))
		var back string
		if err := json.Unmarshal([]byte(s), &back); err != nil {
			t.Fatalf("appendPyString(%q) = %s: %v", data, s, err)
		}
	})
}
