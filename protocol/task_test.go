package protocol_test

import (
	"bytes"
	"compress/zlib"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

func jsonMsg(headers map[string]any, body string) *protocol.Message {
	return &protocol.Message{
		ContentType:     protocol.ContentTypeJSON,
		ContentEncoding: "utf-8",
		Headers:         headers,
		Body:            []byte(body),
	}
}

// v2h returns the headers of a minimal v2 message plus extra.
func v2h(extra map[string]any) map[string]any {
	h := map[string]any{"lang": "go", "task": "tasks.add", "id": "id-1"}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

const plainSig = `{"task": "tasks.tsum", "args": [], "kwargs": {}, "options": {}, "subtask_type": null, "immutable": false}`

func zlibBytes(tb testing.TB, data []byte) []byte {
	tb.Helper()
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	if _, err := w.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

func TestDecodeTask(t *testing.T) {
	minimal := func(f func(m *protocol.TaskMessage)) protocol.TaskMessage {
		m := protocol.TaskMessage{
			Protocol: 2, ID: "id-1", Name: "tasks.add", Lang: "go",
			Args: []any{i64(5), i64(6)}, Kwargs: map[string]any{},
			ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
		}
		if f != nil {
			f(&m)
		}
		return m
	}
	tests := []struct {
		name string
		give *protocol.Message
		want protocol.TaskMessage
	}{
		{
			// celery-protocol.md §1.8: what a 5.2 worker accepts.
			name: "minimal v2 with null embed",
			give: jsonMsg(v2h(nil), `[[5, 6], {}, null]`),
			want: minimal(nil),
		},
		{
			name: "two-element body",
			give: jsonMsg(v2h(nil), `[[5, 6], {"k": "v"}]`),
			want: minimal(func(m *protocol.TaskMessage) { m.Kwargs = map[string]any{"k": "v"} }),
		},
		{
			name: "null and missing optional headers",
			give: jsonMsg(v2h(map[string]any{
				"shadow": nil, "eta": nil, "expires": nil, "group": nil, "group_index": nil,
				"retries": nil, "timelimit": nil, "root_id": nil, "parent_id": nil,
				"ignore_result": nil, "stamped_headers": nil, "stamps": nil,
				"replaced_task_nesting": nil, "compression": nil,
			}), `[[5, 6], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
			want: minimal(nil),
		},
		{
			name: "unknown headers are kept",
			give: jsonMsg(v2h(map[string]any{
				"redelivered": true, "meth": "x", "x-death": []any{map[string]any{"count": i64(1)}},
				"mystamp": "s1", "stamped_headers": []any{"mystamp"}, "stamps": map[string]any{"mystamp": "s1"},
			}), `[[5, 6], {}, null]`),
			want: minimal(func(m *protocol.TaskMessage) {
				m.Headers = map[string]any{
					"redelivered": true, "meth": "x", "x-death": []any{map[string]any{"count": i64(1)}},
					"mystamp": "s1",
				}
				m.StampedHeaders = []string{"mystamp"}
				m.Stamps = map[string]any{"mystamp": "s1"}
			}),
		},
		{
			name: "every modelled header",
			give: &protocol.Message{
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
				Headers: v2h(map[string]any{
					"shadow": "alias", "eta": "2030-01-01T12:00:00Z", "expires": "2030-01-01T13:00:00.5+01:00",
					"group": "g", "group_index": int32(2), "retries": int32(3), "timelimit": []any{i64(10), 2.5},
					"root_id": "r", "parent_id": "p", "argsrepr": "(5, 6)", "kwargsrepr": "{}",
					"origin": "gen1@h", "ignore_result": true, "replaced_task_nesting": i64(1),
				}),
				Properties: protocol.Properties{CorrelationID: "id-1", ReplyTo: "rq", DeliveryMode: 2, Priority: 7, Expiration: "5000"},
				Body:       []byte(`[[5, 6], {}, null]`),
			},
			want: minimal(func(m *protocol.TaskMessage) {
				m.Shadow, m.Group, m.GroupIndex, m.Retries = "alias", "g", ptr(2), 3
				m.ETA = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
				m.Expires = time.Date(2030, 1, 1, 12, 0, 0, 5e8, time.UTC)
				m.TimeLimit, m.SoftTimeLimit = 10*time.Second, 2500*time.Millisecond
				m.RootID, m.ParentID, m.ArgsRepr, m.KwargsRepr, m.Origin = "r", "p", "(5, 6)", "{}", "gen1@h"
				m.IgnoreResult, m.ReplacedTaskNesting = ptr(true), 1
				m.CorrelationID, m.ReplyTo, m.DeliveryMode, m.Priority, m.Expiration = "id-1", "rq", 2, 7, "5000"
			}),
		},
		{
			name: "timelimit with one side null",
			give: jsonMsg(v2h(map[string]any{"timelimit": []any{nil, i64(5)}}), `[[5, 6], {}, null]`),
			want: minimal(func(m *protocol.TaskMessage) { m.SoftTimeLimit = 5 * time.Second }),
		},
		{
			name: "eta already decoded to a time (AMQP timestamp, typed value)",
			give: jsonMsg(v2h(map[string]any{"eta": time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}), `[[5, 6], {}, null]`),
			want: minimal(func(m *protocol.TaskMessage) { m.ETA = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }),
		},
		{
			name: "embed with callbacks, errbacks, chain and chord",
			give: jsonMsg(v2h(nil), `[[5, 6], {}, {"callbacks": [`+plainSig+`], "errbacks": [], "chain": [`+plainSig+`, {"task": "t2", "args": [1], "kwargs": {"a": 1}, "options": {"task_id": "c2"}, "subtask_type": null, "immutable": true, "chord_size": 2}], "chord": `+plainSig+`}]`),
			want: minimal(func(m *protocol.TaskMessage) {
				tsum := sig("tasks.tsum", nil, nil)
				m.Embed = protocol.Embed{
					Callbacks: []protocol.Signature{tsum},
					Errbacks:  []protocol.Signature{},
					Chain: []protocol.Signature{tsum, {
						Task: "t2", Args: []any{i64(1)}, Kwargs: map[string]any{"a": i64(1)},
						Options: map[string]any{"task_id": "c2"}, Immutable: true,
						Extra: map[string]any{"chord_size": i64(2)},
					}},
					Chord: &tsum,
				}
			}),
		},
		{
			name: "zlib compressed body",
			give: &protocol.Message{
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
				Headers: v2h(map[string]any{"compression": protocol.CompressionZlib}),
				Body:    zlibBytes(t, []byte(`[[5, 6], {}, null]`)),
			},
			want: minimal(func(m *protocol.TaskMessage) { m.Compression = protocol.CompressionZlib }),
		},
		{
			// hybrid_to_proto2: the body's v1 fields fill in, message
			// headers win, chain is always nil.
			name: "hybrid v2 headers with a v1 body",
			give: jsonMsg(map[string]any{"task": "tasks.add", "id": "hdr-id", "x-h": i64(1)},
				`{"task": "ignored", "id": "body-id", "args": [1], "kwargs": {"k": 2}, "retries": 2, "eta": "2030-01-01T00:00:00", "meth": "m", "callbacks": [`+plainSig+`], "chain": [`+plainSig+`], "group_index": 4}`),
			want: protocol.TaskMessage{
				Protocol: 2, ID: "hdr-id", Name: "tasks.add", Retries: 2,
				ETA:         time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
				Args:        []any{i64(1)},
				Kwargs:      map[string]any{"k": i64(2)},
				Embed:       protocol.Embed{Callbacks: []protocol.Signature{sig("tasks.tsum", nil, nil)}},
				Headers:     map[string]any{"x-h": i64(1), "meth": "m"},
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
		{
			// A hand-made minimal v1 body executed fine on 5.2.6.
			name: "minimal v1",
			give: jsonMsg(nil, `{"task": "tasks.add", "id": "v1", "args": [2, 3], "kwargs": {}}`),
			want: protocol.TaskMessage{
				Protocol: 1, ID: "v1", Name: "tasks.add",
				Args: []any{i64(2), i64(3)}, Kwargs: map[string]any{},
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
		{
			name: "v1 compressed",
			give: &protocol.Message{
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
				Headers: map[string]any{"compression": protocol.CompressionZlib},
				Body:    zlibBytes(t, []byte(`{"task": "tasks.add", "id": "v1", "args": [], "kwargs": {}}`)),
			},
			want: protocol.TaskMessage{
				Protocol: 1, ID: "v1", Name: "tasks.add",
				Args: []any{}, Kwargs: map[string]any{}, Compression: protocol.CompressionZlib,
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
		{
			// With args, hybrid_to_proto2 keeps the body's own reprs.
			name: "v1 with argsrepr",
			give: jsonMsg(nil, `{"task": "tasks.add", "id": "v1", "args": [2], "argsrepr": "(2,)", "kwargsrepr": "{}"}`),
			want: protocol.TaskMessage{
				Protocol: 1, ID: "v1", Name: "tasks.add", ArgsRepr: "(2,)", KwargsRepr: "{}",
				Args: []any{i64(2)}, Kwargs: map[string]any{},
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
		{
			// No args key: proto1_to_proto2 computes the reprs, from the
			// tuple body.get('args', ()) gives, and replaces the body's.
			name: "v1 without args",
			give: jsonMsg(nil, `{"task": "tasks.add", "id": "v1", "argsrepr": "x", "kwargs": {"a": 1}}`),
			want: protocol.TaskMessage{
				Protocol: 1, ID: "v1", Name: "tasks.add", ArgsRepr: "()", KwargsRepr: "{'a': 1}",
				Args: []any{}, Kwargs: map[string]any{"a": i64(1)},
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
		{
			name: "v1 with taskset, utc=false, timelimit, chord and message headers",
			give: jsonMsg(map[string]any{"x": "y"}, `{"task": "tasks.add", "id": "v1", "args": [1], "kwargs": {"a": "b"}, "taskset": "ts", "group": "ignored", "utc": false, "eta": "2030-01-01T12:00:00", "timelimit": [10, 5.5], "retries": 1, "errbacks": [`+plainSig+`], "chord": `+plainSig+`, "custom": 1}`),
			want: protocol.TaskMessage{
				Protocol: 1, ID: "v1", Name: "tasks.add", Group: "ts", Retries: 1,
				ETA:       time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC),
				TimeLimit: 10 * time.Second, SoftTimeLimit: 5500 * time.Millisecond,
				Args: []any{i64(1)}, Kwargs: map[string]any{"a": "b"},
				Embed: protocol.Embed{
					Errbacks: []protocol.Signature{sig("tasks.tsum", nil, nil)},
					Chord:    ptr(sig("tasks.tsum", nil, nil)),
				},
				Headers:     map[string]any{"x": "y"},
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeTask(tt.give, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeTask: %v", err)
			}
			if diff := valueDiff(tt.want, *got); diff != "" {
				t.Errorf("DecodeTask() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeTaskErrors(t *testing.T) {
	deep := strings.Repeat("[", 50) + strings.Repeat("]", 50)
	tests := []struct {
		name      string
		give      *protocol.Message
		opts      protocol.DecodeOptions
		wantField string // the *DecodeError field, if any
		wantIs    error  // a sentinel errors.Is must find, if any
	}{
		{name: "nil message", give: nil, wantField: "message"},
		{name: "missing id", give: jsonMsg(map[string]any{"task": "t"}, `[[], {}, null]`), wantField: "id"},
		{name: "empty id", give: jsonMsg(v2h(map[string]any{"id": ""}), `[[], {}, null]`), wantField: "id"},
		{name: "null task", give: jsonMsg(v2h(map[string]any{"task": nil}), `[[], {}, null]`), wantField: "task"},
		{name: "numeric task", give: jsonMsg(v2h(map[string]any{"task": i64(1)}), `[[], {}, null]`), wantField: "task"},
		{name: "bad eta", give: jsonMsg(v2h(map[string]any{"eta": "tomorrow"}), `[[], {}, null]`), wantField: "eta"},
		{name: "eta not a string", give: jsonMsg(v2h(map[string]any{"eta": i64(5)}), `[[], {}, null]`), wantField: "eta"},
		{name: "bad expires", give: jsonMsg(v2h(map[string]any{"expires": "2030-13-01T00:00:00"}), `[[], {}, null]`), wantField: "expires"},
		{name: "args not a list", give: jsonMsg(v2h(nil), `[{"a": 1}, {}, null]`), wantField: "args"},
		{name: "args null", give: jsonMsg(v2h(nil), `[null, {}, null]`), wantField: "args"},
		{name: "kwargs not an object", give: jsonMsg(v2h(nil), `[[1], [2], null]`), wantField: "kwargs"},
		{name: "body a string", give: jsonMsg(v2h(nil), `"hello"`), wantField: "body"},
		{name: "body of 4 elements", give: jsonMsg(v2h(nil), `[[], {}, null, 1]`), wantField: "body"},
		{name: "body of 1 element", give: jsonMsg(v2h(nil), `[[]]`), wantField: "body"},
		{name: "v2 object body without args", give: jsonMsg(v2h(nil), `{"kwargs": {}}`), wantField: "body"},
		{name: "hybrid kwargs not an object", give: jsonMsg(v2h(nil), `{"args": [], "kwargs": []}`), wantField: "kwargs"},
		{name: "invalid json", give: jsonMsg(v2h(nil), `[[1, 2], {}, nul`), wantField: "body"},
		{name: "embed a number", give: jsonMsg(v2h(nil), `[[], {}, 5]`), wantField: "embed"},
		{name: "callbacks an object", give: jsonMsg(v2h(nil), `[[], {}, {"callbacks": {}}]`), wantField: "embed.callbacks"},
		{name: "chain step without task", give: jsonMsg(v2h(nil), `[[], {}, {"chain": [{"args": []}]}]`), wantField: "embed.chain[0].task"},
		{name: "chord args not a list", give: jsonMsg(v2h(nil), `[[], {}, {"chord": {"task": "t", "args": 1}}]`), wantField: "embed.chord.args"},
		{name: "timelimit a string", give: jsonMsg(v2h(map[string]any{"timelimit": "10"}), `[[], {}, null]`), wantField: "timelimit"},
		{name: "timelimit of one element", give: jsonMsg(v2h(map[string]any{"timelimit": []any{i64(1)}}), `[[], {}, null]`), wantField: "timelimit"},
		{name: "negative time limit", give: jsonMsg(v2h(map[string]any{"timelimit": []any{i64(-1), nil}}), `[[], {}, null]`), wantField: "timelimit[0]"},
		{name: "huge soft time limit", give: jsonMsg(v2h(map[string]any{"timelimit": []any{nil, 1e300}}), `[[], {}, null]`), wantField: "timelimit[1]"},
		{name: "group_index a string", give: jsonMsg(v2h(map[string]any{"group_index": "1"}), `[[], {}, null]`), wantField: "group_index"},
		{name: "retries a fraction", give: jsonMsg(v2h(map[string]any{"retries": 1.5}), `[[], {}, null]`), wantField: "retries"},
		{name: "ignore_result a string", give: jsonMsg(v2h(map[string]any{"ignore_result": "yes"}), `[[], {}, null]`), wantField: "ignore_result"},
		{name: "stamped_headers not strings", give: jsonMsg(v2h(map[string]any{"stamped_headers": []any{i64(1)}}), `[[], {}, null]`), wantField: "stamped_headers[0]"},
		{name: "stamps a list", give: jsonMsg(v2h(map[string]any{"stamps": []any{}}), `[[], {}, null]`), wantField: "stamps"},
		{name: "shadow a number", give: jsonMsg(v2h(map[string]any{"shadow": i64(5)}), `[[], {}, null]`), wantField: "shadow"},
		{name: "compression a number", give: jsonMsg(v2h(map[string]any{"compression": i64(5)}), `[[], {}, null]`), wantField: "compression"},
		{name: "unknown compression", give: jsonMsg(v2h(map[string]any{"compression": "application/x-foo"}), `x`), wantField: "body", wantIs: protocol.ErrUnsupportedCompression},
		{name: "unknown charset", give: &protocol.Message{ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-16", Headers: v2h(nil), Body: []byte(`[[], {}, null]`)}, wantField: "content-encoding"},
		{name: "pickle", give: &protocol.Message{ContentType: protocol.ContentTypePickle, ContentEncoding: "binary", Headers: v2h(nil), Body: []byte("\x80\x04N.")}, wantIs: protocol.ErrUnsupportedContentType},
		{name: "unknown content type", give: &protocol.Message{ContentType: "application/x-foo", Headers: v2h(nil), Body: []byte("x")}, wantIs: protocol.ErrUnsupportedContentType},
		{name: "msgpack not accepted", give: &protocol.Message{ContentType: protocol.ContentTypeMsgpack, ContentEncoding: "binary", Headers: v2h(nil), Body: []byte{0x93, 0x90, 0x80, 0xc0}}, opts: protocol.DecodeOptions{Accept: []string{protocol.ContentTypeJSON}}, wantIs: protocol.ErrUnsupportedContentType},
		{name: "raw body too large", give: jsonMsg(v2h(nil), `[[1, 2, 3, 4, 5], {}, null]`), opts: protocol.DecodeOptions{MaxBodySize: 10}, wantField: "body", wantIs: protocol.ErrTooLarge},
		{name: "decompressed body too large", give: &protocol.Message{ContentType: protocol.ContentTypeJSON, Headers: v2h(map[string]any{"compression": protocol.CompressionZlib}), Body: zlibBytes(t, []byte(`[["`+strings.Repeat("a", 1000)+`"], {}, null]`))}, opts: protocol.DecodeOptions{MaxBodySize: 100}, wantField: "body", wantIs: protocol.ErrTooLarge},
		{name: "too deep", give: jsonMsg(v2h(nil), `[`+deep+`, {}, null]`), opts: protocol.DecodeOptions{MaxDepth: 10}, wantField: "body", wantIs: protocol.ErrTooDeep},
		{name: "no task header, list body", give: jsonMsg(nil, `[[1], {}, null]`), wantIs: protocol.ErrNotTaskMessage},
		{name: "no task header, object without task", give: jsonMsg(map[string]any{"x": "y"}, `{"id": "1", "args": []}`), wantIs: protocol.ErrNotTaskMessage},
		{name: "v1 args not a list", give: jsonMsg(nil, `{"task": "t", "id": "1", "args": "x"}`), wantField: "args"},
		{name: "v1 utc not a bool", give: jsonMsg(nil, `{"task": "t", "id": "1", "utc": "yes"}`), wantField: "utc"},
		{name: "v1 empty task", give: jsonMsg(nil, `{"task": "", "id": "1"}`), wantField: "task"},
		{name: "v1 undecodable body", give: jsonMsg(nil, `{`), wantField: "body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeTask(tt.give, tt.opts)
			if err == nil {
				t.Fatalf("DecodeTask() = %+v, want an error", got)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("DecodeTask() error %v, want errors.Is %v", err, tt.wantIs)
			}
			var de *protocol.DecodeError
			switch {
			case tt.wantField != "" && !errors.As(err, &de):
				t.Errorf("DecodeTask() error %v (%T), want a *DecodeError for %q", err, err, tt.wantField)
			case tt.wantField != "" && de.Field != tt.wantField:
				t.Errorf("DecodeTask() error field %q, want %q (%v)", de.Field, tt.wantField, err)
			case tt.wantField == "" && errors.As(err, &de):
				t.Errorf("DecodeTask() error %v is a *DecodeError, want only %v", err, tt.wantIs)
			}
			if !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestDecodeTaskPickleError(t *testing.T) {
	_, err := protocol.DecodeTask(&protocol.Message{
		ContentType: protocol.ContentTypePickle, Headers: v2h(nil), Body: []byte("\x80\x04N."),
	}, protocol.DecodeOptions{Accept: []string{protocol.ContentTypePickle}})
	var ce *protocol.ContentTypeError
	if !errors.As(err, &ce) || ce.ContentType != protocol.ContentTypePickle {
		t.Fatalf("DecodeTask(pickle) error %v, want a *ContentTypeError naming pickle even when accepted", err)
	}
}

func TestEncodeTask(t *testing.T) {
	eta := time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)
	tests := []struct {
		name        string
		give        protocol.TaskMessage
		opts        protocol.EncodeOptions
		wantHeaders map[string]any
		wantProps   protocol.Properties
		wantBody    any
		wantCT      string
		wantCE      string
	}{
		{
			name: "defaults as as_task_v2",
			give: protocol.TaskMessage{ID: "id-1", Name: "tasks.add", Args: []any{i64(2), i64(3)}},
			wantHeaders: map[string]any{
				"lang": "go", "task": "tasks.add", "id": "id-1", "shadow": nil, "eta": nil,
				"expires": nil, "group": nil, "group_index": nil, "retries": i64(0),
				"timelimit": []any{nil, nil}, "root_id": "id-1", "parent_id": nil,
				"argsrepr": "(2, 3)", "kwargsrepr": "{}", "origin": nil, "ignore_result": nil,
			},
			wantProps: protocol.Properties{CorrelationID: "id-1", DeliveryMode: 2},
			wantBody: []any{[]any{i64(2), i64(3)}, map[string]any{},
				map[string]any{"callbacks": nil, "errbacks": nil, "chain": nil, "chord": nil}},
			wantCT: protocol.ContentTypeJSON, wantCE: "utf-8",
		},
		{
			name: "every field",
			give: protocol.TaskMessage{
				Protocol: 1, ID: "id-2", Name: "tasks.echo", Lang: "py", Shadow: "alias",
				ETA: eta, Expires: eta.Add(time.Minute), Group: "g", GroupIndex: ptr(0), Retries: 2,
				TimeLimit: 30 * time.Second, SoftTimeLimit: 20500 * time.Millisecond,
				RootID: "root", ParentID: "parent", ArgsRepr: "(…)", KwargsRepr: "{…}",
				Origin: "w1@host", IgnoreResult: ptr(true), ReplacedTaskNesting: 1,
				StampedHeaders: []string{"s"}, Stamps: map[string]any{"s": "v"},
				Headers: map[string]any{"x-custom": "c", "s": "v"},
				Args:    []any{"a"}, Kwargs: map[string]any{"k": nil},
				Embed: protocol.Embed{
					Callbacks: []protocol.Signature{sig("cb", nil, nil)},
					Errbacks:  []protocol.Signature{},
					Chain:     []protocol.Signature{sig("c2", []any{i64(1)}, map[string]any{"task_id": "t2"})},
					Chord:     ptr(sig("body", nil, nil)),
				},
				CorrelationID: "ignored", ReplyTo: "rq", Priority: 9, DeliveryMode: 1, Expiration: "60000",
				ContentType: "ignored", Compression: "ignored",
			},
			wantHeaders: map[string]any{
				"lang": "py", "task": "tasks.echo", "id": "id-2", "shadow": "alias",
				"eta": "2030-01-02T03:04:05.123456+00:00", "expires": "2030-01-02T03:05:05.123456+00:00",
				"group": "g", "group_index": i64(0), "retries": i64(2), "timelimit": []any{i64(30), 20.5},
				"root_id": "root", "parent_id": "parent", "argsrepr": "(…)", "kwargsrepr": "{…}",
				"origin": "w1@host", "ignore_result": true, "replaced_task_nesting": i64(1),
				"stamped_headers": []any{"s"}, "stamps": map[string]any{"s": "v"},
				"x-custom": "c", "s": "v",
			},
			wantProps: protocol.Properties{CorrelationID: "id-2", ReplyTo: "rq", DeliveryMode: 1, Priority: 9, Expiration: "60000"},
			wantBody: []any{[]any{"a"}, map[string]any{"k": nil}, map[string]any{
				"callbacks": []any{sig("cb", nil, nil).Value()},
				"errbacks":  []any{},
				"chain":     []any{sig("c2", []any{i64(1)}, map[string]any{"task_id": "t2"}).Value()},
				"chord":     sig("body", nil, nil).Value(),
			}},
			wantCT: protocol.ContentTypeJSON, wantCE: "utf-8",
		},
		{
			name: "msgpack, zlib",
			give: protocol.TaskMessage{ID: "id-3", Name: "tasks.add", ArgsRepr: "x", KwargsRepr: "y"},
			opts: protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack, Compression: protocol.CompressionZlib},
			wantHeaders: map[string]any{
				"lang": "go", "task": "tasks.add", "id": "id-3", "shadow": nil, "eta": nil,
				"expires": nil, "group": nil, "group_index": nil, "retries": i64(0),
				"timelimit": []any{nil, nil}, "root_id": "id-3", "parent_id": nil,
				"argsrepr": "x", "kwargsrepr": "y", "origin": nil, "ignore_result": nil,
				"compression": protocol.CompressionZlib,
			},
			wantProps: protocol.Properties{CorrelationID: "id-3", DeliveryMode: 2},
			wantBody: []any{[]any{}, map[string]any{},
				map[string]any{"callbacks": nil, "errbacks": nil, "chain": nil, "chord": nil}},
			wantCT: protocol.ContentTypeMsgpack, wantCE: "binary",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.EncodeTask(&tt.give, tt.opts)
			if err != nil {
				t.Fatalf("EncodeTask: %v", err)
			}
			if got.ContentType != tt.wantCT || got.ContentEncoding != tt.wantCE {
				t.Errorf("content type/encoding %q/%q, want %q/%q", got.ContentType, got.ContentEncoding, tt.wantCT, tt.wantCE)
			}
			if diff := valueDiff(tt.wantHeaders, got.Headers); diff != "" {
				t.Errorf("EncodeTask() headers mismatch (-want +got):\n%s", diff)
			}
			if diff := valueDiff(tt.wantProps, got.Properties); diff != "" {
				t.Errorf("EncodeTask() properties mismatch (-want +got):\n%s", diff)
			}
			body := got.Body
			if tt.opts.Compression != "" {
				if body, err = protocol.Decompress(tt.opts.Compression, body, 1<<20); err != nil {
					t.Fatalf("Decompress: %v", err)
				}
			}
			gotBody, err := protocol.Unmarshal(got.ContentType, body, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("Unmarshal body: %v", err)
			}
			if diff := valueDiff(tt.wantBody, gotBody); diff != "" {
				t.Errorf("EncodeTask() body mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeTaskErrors(t *testing.T) {
	ok := protocol.TaskMessage{ID: "id", Name: "t"}
	tests := []struct {
		name string
		give *protocol.TaskMessage
		opts protocol.EncodeOptions
	}{
		{name: "nil", give: nil},
		{name: "empty id", give: &protocol.TaskMessage{Name: "t"}},
		{name: "empty name", give: &protocol.TaskMessage{ID: "id"}},
		{name: "modelled header in Headers", give: &protocol.TaskMessage{ID: "id", Name: "t", Headers: map[string]any{"retries": i64(1)}}},
		{name: "compression in Headers", give: &protocol.TaskMessage{ID: "id", Name: "t", Headers: map[string]any{"compression": "x"}}},
		{name: "negative time limit", give: &protocol.TaskMessage{ID: "id", Name: "t", SoftTimeLimit: -time.Second}},
		{name: "unknown content type", give: &ok, opts: protocol.EncodeOptions{ContentType: "application/x-foo"}},
		{name: "pickle", give: &ok, opts: protocol.EncodeOptions{ContentType: protocol.ContentTypePickle}},
		{name: "unknown compression", give: &ok, opts: protocol.EncodeOptions{Compression: "application/x-foo"}},
		{name: "unencodable arg", give: &protocol.TaskMessage{ID: "id", Name: "t", Args: []any{make(chan int)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.EncodeTask(tt.give, tt.opts)
			if err == nil {
				t.Fatalf("EncodeTask() = %+v, want an error", got)
			}
			if !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}
