package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/protocol"
)

func TestDecodeEnvelope(t *testing.T) {
	tests := []struct {
		name string
		give string
		want protocol.Envelope
	}{
		{
			// celery-protocol.md Appendix A: an entry of the unacked hash
			// after a restore (redelivered flags set).
			name: "restored message",
			give: `{"body": "W1sxMCwgMjBdLCB7fSwgeyJjYWxsYmFja3MiOiBudWxsLCAiZXJyYmFja3MiOiBudWxsLCAiY2hhaW4iOiBudWxsLCAiY2hvcmQiOiBudWxsfV0=", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"task": "tasks.add", "id": "u1", "redelivered": true}, "properties": {"correlation_id": "u1", "reply_to": "rq", "delivery_mode": 2, "delivery_info": {"exchange": "", "routing_key": "exp_celery", "redelivered": true}, "priority": 6, "body_encoding": "base64", "delivery_tag": "3f61f38c"}}`,
			want: protocol.Envelope{
				Message: protocol.Message{
					ContentType: "application/json", ContentEncoding: "utf-8",
					Headers:    map[string]any{"task": "tasks.add", "id": "u1", "redelivered": true},
					Properties: protocol.Properties{CorrelationID: "u1", ReplyTo: "rq", DeliveryMode: 2, Priority: 6},
					Body:       []byte(`[[10, 20], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
				},
				BodyEncoding: "base64", DeliveryTag: "3f61f38c",
				DeliveryInfo: protocol.DeliveryInfo{RoutingKey: "exp_celery", Redelivered: true},
			},
		},
		{
			name: "raw body, event-like properties, leaked options",
			give: `{"body": "{\"x\": 1}", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"hostname": "w1"}, "properties": {"delivery_mode": 1, "delivery_info": {"exchange": "celeryev", "routing_key": "worker.online"}, "priority": 0, "delivery_tag": "t", "origin": "gen1@vm", "replaced_task_nesting": 0, "expiration": 60000}}`,
			want: protocol.Envelope{
				Message: protocol.Message{
					ContentType: "application/json", ContentEncoding: "utf-8",
					Headers: map[string]any{"hostname": "w1"},
					Properties: protocol.Properties{DeliveryMode: 1, Expiration: "60000",
						Extra: map[string]any{"origin": "gen1@vm", "replaced_task_nesting": i64(0)}},
					Body: []byte(`{"x": 1}`),
				},
				DeliveryTag:  "t",
				DeliveryInfo: protocol.DeliveryInfo{Exchange: "celeryev", RoutingKey: "worker.online"},
			},
		},
		{
			name: "unpadded base64 and null fields",
			give: `{"body": "W10", "content-encoding": null, "content-type": null, "headers": null, "properties": {"body_encoding": "base64", "delivery_tag": "t", "priority": null, "delivery_info": null}}`,
			want: protocol.Envelope{
				Message:      protocol.Message{Body: []byte("[]")},
				BodyEncoding: "base64", DeliveryTag: "t",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeEnvelope([]byte(tt.give), protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeEnvelope: %v", err)
			}
			if diff := valueDiff(tt.want, *got); diff != "" {
				t.Errorf("DecodeEnvelope() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeEnvelopeErrors(t *testing.T) {
	big := `{"body": "` + strings.Repeat("QUFB", 100) + `", "properties": {"body_encoding": "base64"}}`
	tests := []struct {
		name      string
		give      string
		opts      protocol.DecodeOptions
		wantField string
		wantIs    error
	}{
		{name: "not json", give: `{"body": `, wantField: "envelope"},
		{name: "not an object", give: `[1]`, wantField: "envelope"},
		{name: "missing body", give: `{"properties": {}}`, wantField: "body"},
		{name: "body a number", give: `{"body": 1}`, wantField: "body"},
		{name: "bad base64", give: `{"body": "!!!", "properties": {"body_encoding": "base64"}}`, wantField: "body"},
		{name: "unknown body encoding", give: `{"body": "x", "properties": {"body_encoding": "rot13"}}`, wantField: "properties.body_encoding"},
		{name: "headers a list", give: `{"body": "", "headers": []}`, wantField: "headers"},
		{name: "properties a string", give: `{"body": "", "properties": "x"}`, wantField: "properties"},
		{name: "priority a string", give: `{"body": "", "properties": {"priority": "5"}}`, wantField: "properties.priority"},
		{name: "delivery_mode out of range", give: `{"body": "", "properties": {"delivery_mode": 300}}`, wantField: "properties.delivery_mode"},
		{name: "delivery_tag a number", give: `{"body": "", "properties": {"delivery_tag": 5}}`, wantField: "properties.delivery_tag"},
		{name: "delivery_info a list", give: `{"body": "", "properties": {"delivery_info": []}}`, wantField: "properties.delivery_info"},
		{name: "routing_key a number", give: `{"body": "", "properties": {"delivery_info": {"routing_key": 1}}}`, wantField: "properties.delivery_info.routing_key"},
		{name: "redelivered a string", give: `{"body": "", "properties": {"delivery_info": {"redelivered": "yes"}}}`, wantField: "properties.delivery_info.redelivered"},
		{name: "content-type a number", give: `{"body": "", "content-type": 1}`, wantField: "content-type"},
		{name: "decoded body too large", give: big, opts: protocol.DecodeOptions{MaxBodySize: 100}, wantField: "body", wantIs: protocol.ErrTooLarge},
		{name: "document too large", give: `{"body": "` + strings.Repeat("a", 3<<20) + `"}`, opts: protocol.DecodeOptions{MaxBodySize: 100}, wantField: "envelope", wantIs: protocol.ErrTooLarge},
		{name: "too deep headers", give: `{"body": "", "headers": {"x": ` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}}`, opts: protocol.DecodeOptions{MaxDepth: 8}, wantField: "envelope", wantIs: protocol.ErrTooDeep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeEnvelope([]byte(tt.give), tt.opts)
			if err == nil {
				t.Fatalf("DecodeEnvelope() = %+v, want an error", got)
			}
			var de *protocol.DecodeError
			if !errors.As(err, &de) || de.Field != tt.wantField {
				t.Errorf("DecodeEnvelope() error %v, want a *DecodeError for %q", err, tt.wantField)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("DecodeEnvelope() error %v, want errors.Is %v", err, tt.wantIs)
			}
		})
	}
}

func TestEncodeEnvelope(t *testing.T) {
	e := &protocol.Envelope{
		Message: protocol.Message{
			ContentType: "application/json", ContentEncoding: "utf-8",
			Headers: map[string]any{"id": "i"},
			Properties: protocol.Properties{
				CorrelationID: "i", ReplyTo: "rq", DeliveryMode: 2, Priority: 3, Expiration: "1000",
				Extra: map[string]any{"origin": "gen1@vm"},
			},
			Body: []byte("[]"),
		},
		BodyEncoding: "base64", DeliveryTag: "tag",
		DeliveryInfo: protocol.DeliveryInfo{RoutingKey: "q", Redelivered: true},
	}
	got, err := protocol.EncodeEnvelope(e)
	if err != nil {
		t.Fatal(err)
	}
	// kombu's key order and spacing; headers and property values come from
	// protocol.Marshal.
	want := `{"body": "W10=", "content-encoding": "utf-8", "content-type": "application/json", "headers": ` +
		string(mustMarshal(t, map[string]any{"id": "i"})) +
		`, "properties": {"correlation_id": "i", "reply_to": "rq", "origin": "gen1@vm", "delivery_mode": 2, "expiration": "1000", ` +
		`"delivery_info": {"exchange": "", "routing_key": "q", "redelivered": true}, "priority": 3, "body_encoding": "base64", "delivery_tag": "tag"}}`
	if string(got) != want {
		t.Errorf("EncodeEnvelope() =\n%s\nwant\n%s", got, want)
	}

	for name, bad := range map[string]*protocol.Envelope{
		"nil":                  nil,
		"no delivery tag":      {BodyEncoding: "base64"},
		"unknown encoding":     {BodyEncoding: "rot13", DeliveryTag: "t"},
		"raw body not utf-8":   {DeliveryTag: "t", Message: protocol.Message{Body: []byte{0xff}}},
		"modelled extra":       {DeliveryTag: "t", Message: protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"priority": i64(1)}}}},
		"unencodable header":   {DeliveryTag: "t", Message: protocol.Message{Headers: map[string]any{"c": make(chan int)}}},
		"unencodable property": {DeliveryTag: "t", Message: protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"c": make(chan int)}}}},
	} {
		if _, err := protocol.EncodeEnvelope(bad); err == nil {
			t.Errorf("EncodeEnvelope(%s) succeeded, want an error", name)
		}
	}
}

func mustMarshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := protocol.Marshal(protocol.ContentTypeJSON, v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestEnvelopeGoldenReencode re-encodes every captured Redis item and
// checks that nothing is lost: decoding our output gives the same
// envelope.
func TestEnvelopeGoldenReencode(t *testing.T) {
	for _, f := range goldenFiles(t, ".redis.json") {
		t.Run(f, func(t *testing.T) {
			env := loadRedis(t, f)
			data, err := protocol.EncodeEnvelope(env)
			if err != nil {
				t.Fatalf("EncodeEnvelope: %v", err)
			}
			got, err := protocol.DecodeEnvelope(data, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeEnvelope(EncodeEnvelope()): %v\n%s", err, data)
			}
			if diff := valueDiff(env, got); diff != "" {
				t.Errorf("envelope round trip mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
