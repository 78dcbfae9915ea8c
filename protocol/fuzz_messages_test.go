package protocol_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// fuzzOpts bound what the fuzz targets accept, so that a hostile input
// cannot make a run slow or large.
func fuzzOpts() protocol.DecodeOptions {
	return protocol.DecodeOptions{MaxBodySize: 1 << 20, MaxDepth: 64}
}

// fuzzCmp compares decoded values: NaN equals NaN (Python writes NaN),
// and times compare at Python's microsecond resolution.
func fuzzCmp() cmp.Options {
	return cmp.Options{
		cmpopts.EquateNaNs(),
		cmp.Comparer(func(a, b time.Time) bool {
			return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
		}),
	}
}

// addTaskSeeds adds every captured message, as the fuzz target's four
// inputs, plus hand-made v1, hybrid and minimal messages.
func addTaskSeeds(f *testing.F) {
	add := func(m *protocol.Message) {
		h := map[string]any{}
		for k, v := range m.Headers {
			h[k] = v
		}
		comp, _ := h["compression"].(string)
		delete(h, "compression")
		hj, err := protocol.Marshal(protocol.ContentTypeJSON, h)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(hj, m.Body, m.ContentType, comp)
	}
	for _, name := range goldenFiles(f, ".redis.json") {
		add(&loadRedis(f, name).Message)
	}
	for _, name := range goldenFiles(f, ".amqp.json") {
		if !strings.HasPrefix(name, "result_") {
			add(loadAMQP(f, name).Message)
		}
	}
	json := protocol.ContentTypeJSON
	f.Add([]byte(`{"lang": "go", "task": "t", "id": "1"}`), []byte(`[[5, 6], {}, null]`), json, "")
	f.Add([]byte(`{"task": "t", "id": "1"}`), []byte(`[[5], {"a": 1}]`), json, "")
	f.Add([]byte(`{"task": "t", "id": "1", "x": 1}`), []byte(`{"args": [1], "kwargs": {}, "eta": "2030-01-01T00:00:00"}`), json, "")
	f.Add([]byte(`{}`), []byte(`{"task": "t", "id": "1", "args": [2, 3], "kwargs": {}, "taskset": "g", "utc": false, "timelimit": [1.5, null]}`), json, "")
	f.Add([]byte(`null`), []byte(`[[], {}, {"chain": [{"task": "a", "options": {"link": {"task": "b"}}}], "chord": {"task": "c"}}]`), json, "")
	f.Add([]byte(`{"task": "t", "id": "1"}`), []byte("\x80\x04N."), protocol.ContentTypePickle, "")
	f.Add([]byte(`{"task": "t", "id": "1", "stamps": {}}`), readGolden(f, "typed_spec56.body.json"), json, "")
}

// FuzzDecodeTask: no input may panic; an accepted message re-encodes
// (same content type and compression) and decodes to the same message,
// modulo EncodeTask's documented defaults.
func FuzzDecodeTask(f *testing.F) {
	addTaskSeeds(f)
	f.Fuzz(func(t *testing.T, headersJSON, body []byte, contentType, compression string) {
		defer fuzzwatch.Watch(t, headersJSON, body, contentType, compression)()
		var headers map[string]any
		if v, err := protocol.Unmarshal(protocol.ContentTypeJSON, headersJSON, fuzzOpts()); err == nil {
			headers, _ = v.(map[string]any)
		}
		if compression != "" {
			if headers == nil {
				headers = map[string]any{}
			}
			headers["compression"] = compression
		}
		msg := &protocol.Message{ContentType: contentType, Headers: headers, Body: body}
		m1, err := protocol.DecodeTask(msg, fuzzOpts())
		if err != nil {
			return
		}
		if m1.ID == "" || m1.Name == "" || m1.Args == nil || m1.Kwargs == nil {
			t.Fatalf("accepted message without id, name, args or kwargs: %+v", m1)
		}
		opts := protocol.EncodeOptions{ContentType: m1.ContentType}
		if m1.Compression == protocol.CompressionZlib {
			opts.Compression = protocol.CompressionZlib
		}
		enc, err := protocol.EncodeTask(m1, opts)
		if err != nil {
			t.Fatalf("EncodeTask(accepted message): %v\n%+v", err, m1)
		}
		m2, err := protocol.DecodeTask(enc, protocol.DecodeOptions{MaxDepth: 1000})
		if err != nil {
			t.Fatalf("DecodeTask(EncodeTask(m)): %v", err)
		}
		// The body goes through the serializer again, which writes typed
		// values (kombu 5.3+ datetimes, decimals...) in their plain form:
		// expect what one serializer round trip gives.
		want := *m1
		want.Args = reserialize(t, m1.ContentType, m1.Args).([]any)
		want.Kwargs = reserialize(t, m1.ContentType, m1.Kwargs).(map[string]any)
		want.Embed = protocol.Embed{
			Callbacks: reserializeSigs(t, m1.ContentType, m1.Embed.Callbacks),
			Errbacks:  reserializeSigs(t, m1.ContentType, m1.Embed.Errbacks),
			Chain:     reserializeSigs(t, m1.ContentType, m1.Embed.Chain),
		}
		if m1.Embed.Chord != nil {
			want.Embed.Chord = &reserializeSigs(t, m1.ContentType, []protocol.Signature{*m1.Embed.Chord})[0]
		}
		want.Protocol = 2
		if want.Lang == "" {
			want.Lang = "go"
		}
		if want.RootID == "" {
			want.RootID = want.ID
		}
		if want.ArgsRepr == "" {
			want.ArgsRepr = m2.ArgsRepr // computed by EncodeTask
		}
		if want.KwargsRepr == "" {
			want.KwargsRepr = m2.KwargsRepr
		}
		want.CorrelationID = want.ID
		want.DeliveryMode = 2
		want.ContentType = enc.ContentType // a kombu name ("json") becomes the MIME type
		want.ContentEncoding = enc.ContentEncoding
		want.Compression = opts.Compression
		if diff := valueDiff(want, *m2, fuzzCmp()); diff != "" {
			t.Errorf("DecodeTask(EncodeTask(m)) mismatch (-want +got):\n%s", diff)
		}
	})
}

// reserialize returns v after one Marshal/Unmarshal round trip with ct.
func reserialize(tb testing.TB, ct string, v any) any {
	tb.Helper()
	data, err := protocol.Marshal(ct, v)
	if err != nil {
		tb.Fatalf("Marshal(%s): %v", ct, err)
	}
	out, err := protocol.Unmarshal(ct, data, protocol.DecodeOptions{MaxDepth: 1000})
	if err != nil {
		tb.Fatalf("Unmarshal(%s): %v", ct, err)
	}
	return out
}

func reserializeSigs(tb testing.TB, ct string, sigs []protocol.Signature) []protocol.Signature {
	tb.Helper()
	if sigs == nil {
		return nil
	}
	out := make([]protocol.Signature, len(sigs))
	for i, s := range sigs {
		d, err := protocol.DecodeSignature(reserialize(tb, ct, s.Value()))
		if err != nil {
			tb.Fatalf("DecodeSignature(reserialized): %v", err)
		}
		out[i] = d
	}
	return out
}

// FuzzDecodeEnvelope: no input may panic; an accepted envelope re-encodes
// and decodes to the same envelope.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, name := range goldenFiles(f, ".redis.json") {
		f.Add(readGolden(f, name))
	}
	f.Add([]byte(`{"body": "W10", "properties": {"body_encoding": "base64", "delivery_info": {"redelivered": true}}}`))
	f.Add([]byte(`{"body": "raw", "headers": null, "properties": {"origin": "x", "expiration": 5}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		e1, err := protocol.DecodeEnvelope(data, fuzzOpts())
		if err != nil {
			return
		}
		if e1.DeliveryTag == "" {
			e1.DeliveryTag = "fuzz" // required by the encoder
		}
		enc, err := protocol.EncodeEnvelope(e1)
		if err != nil {
			t.Fatalf("EncodeEnvelope(accepted envelope): %v\n%+v", err, e1)
		}
		e2, err := protocol.DecodeEnvelope(enc, protocol.DecodeOptions{MaxDepth: 1000})
		if err != nil {
			t.Fatalf("DecodeEnvelope(EncodeEnvelope(e)): %v\n%s", err, enc)
		}
		if e1.Message.Headers == nil {
			e1.Message.Headers = map[string]any{} // written as {}
		}
		e1.Message.Headers = reserialize(t, protocol.ContentTypeJSON, e1.Message.Headers).(map[string]any)
		if e1.Message.Properties.Extra != nil {
			e1.Message.Properties.Extra = reserialize(t, protocol.ContentTypeJSON, e1.Message.Properties.Extra).(map[string]any)
		}
		if diff := valueDiff(e1, e2, fuzzCmp()); diff != "" {
			t.Errorf("DecodeEnvelope(EncodeEnvelope(e)) mismatch (-want +got):\n%s", diff)
		}
	})
}

// FuzzDecodeResult: no input may panic; an accepted document re-encodes
// (same content type) and decodes to the same meta.
func FuzzDecodeResult(f *testing.F) {
	for _, name := range goldenFiles(f, ".json") {
		if strings.HasPrefix(name, "result_") && !strings.HasSuffix(name, ".amqp.json") {
			f.Add(readGolden(f, name), false)
		}
	}
	for _, name := range []string{"result_rpc_success.amqp.json", "result_rpc_failure.amqp.json"} {
		body, err := base64.StdEncoding.DecodeString(rawDoc(f, readGolden(f, name))["body"].(string))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body, false)
	}
	f.Add(readGolden(f, "result_success.msgpack"), true)
	f.Add([]byte(`{"status": "FAILURE", "result": {"exc_type": "E", "exc_message": "old"}, "date_done": "2026-11-29T13:20:19.106587+00:00"}`), false)
	f.Fuzz(func(t *testing.T, data []byte, msgpack bool) {
		defer fuzzwatch.Watch(t, data, msgpack)()
		ct := protocol.ContentTypeJSON
		if msgpack {
			ct = protocol.ContentTypeMsgpack
		}
		m1, err := protocol.DecodeResult(data, ct, fuzzOpts())
		if err != nil {
			return
		}
		enc, err := protocol.EncodeResult(m1, ct)
		if err != nil {
			t.Fatalf("EncodeResult(accepted meta): %v\n%+v", err, m1)
		}
		m2, err := protocol.DecodeResult(enc, ct, protocol.DecodeOptions{MaxDepth: 1000})
		if err != nil {
			t.Fatalf("DecodeResult(EncodeResult(m)): %v\n%q", err, enc)
		}
		want := *m1
		if _, isExc := m1.Result.(*protocol.ExceptionInfo); !isExc {
			want.Result = reserialize(t, ct, m1.Result)
		} else {
			e := *m1.Result.(*protocol.ExceptionInfo)
			e.Message = reserialize(t, ct, e.Message).([]any)
			want.Result = &e
		}
		if m1.Children != nil {
			want.Children = reserialize(t, ct, m1.Children).([]any)
		}
		if m1.Args != nil {
			want.Args = reserialize(t, ct, m1.Args).([]any)
		}
		if m1.Kwargs != nil {
			want.Kwargs = reserialize(t, ct, m1.Kwargs).(map[string]any)
		}
		if diff := valueDiff(want, *m2, fuzzCmp(), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("DecodeResult(EncodeResult(m)) mismatch (-want +got):\n%s", diff)
		}
	})
}

// FuzzDecodeSignature: no input may panic; an accepted signature survives
// Value and a JSON round trip.
func FuzzDecodeSignature(f *testing.F) {
	for _, name := range []string{"link.redis.json", "chain.redis.json", "chord_0.redis.json", "protocol1.redis.json"} {
		env := loadRedis(f, name)
		v, err := protocol.Unmarshal(env.Message.ContentType, env.Message.Body, protocol.DecodeOptions{})
		if err != nil {
			f.Fatal(err)
		}
		var sigs []any
		switch b := v.(type) {
		case []any:
			embed := b[2].(map[string]any)
			for _, k := range []string{"callbacks", "errbacks", "chain"} {
				if l, ok := embed[k].([]any); ok {
					sigs = append(sigs, l...)
				}
			}
			if c := embed["chord"]; c != nil {
				sigs = append(sigs, c)
			}
		case map[string]any:
			sigs = append(sigs, b["callbacks"].([]any)...)
		}
		for _, s := range sigs {
			data, err := protocol.Marshal(protocol.ContentTypeJSON, s)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte(`{"task": "celery.chord", "subtask_type": "chord", "kwargs": {"header": {"task": "celery.group", "subtask_type": "group", "kwargs": {"tasks": [{"task": "a"}]}}, "body": {"task": "b"}}, "chord_size": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		v, err := protocol.Unmarshal(protocol.ContentTypeJSON, data, fuzzOpts())
		if err != nil {
			return
		}
		s1, err := protocol.DecodeSignature(v)
		if err != nil {
			return
		}
		// Accessors must not panic either.
		s1.TaskID()
		s1.Queue()
		s1.Priority()
		_, _ = s1.Link()
		_, _ = s1.LinkError()
		_, _ = s1.Tasks()
		_, _ = s1.ChordHeader()
		_, _ = s1.ChordBody()
		enc, err := protocol.Marshal(protocol.ContentTypeJSON, s1.Value())
		if err != nil {
			t.Fatalf("Marshal(Value()): %v", err)
		}
		v2, err := protocol.Unmarshal(protocol.ContentTypeJSON, enc, protocol.DecodeOptions{MaxDepth: 1000})
		if err != nil {
			t.Fatalf("Unmarshal(Marshal(Value())): %v", err)
		}
		s2, err := protocol.DecodeSignature(v2)
		if err != nil {
			t.Fatalf("DecodeSignature(Value()): %v", err)
		}
		want := reserializeSigs(t, protocol.ContentTypeJSON, []protocol.Signature{s1})[0]
		if diff := valueDiff(want, s2, fuzzCmp()); diff != "" {
			t.Errorf("DecodeSignature(Value()) mismatch (-want +got):\n%s", diff)
		}
	})
}
