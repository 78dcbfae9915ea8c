package protocol_test

import (
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/protocol"
)

// naiveUTCDate parses a date_done independently of the package: naive UTC
// from Celery 5.2, with "+00:00" from 5.5.
func naiveUTCDate(tb testing.TB, raw map[string]any) time.Time {
	tb.Helper()
	s, ok := raw["date_done"].(string)
	if !ok {
		tb.Fatalf("date_done = %v", raw["date_done"])
	}
	if d, err := time.Parse("2006-01-02T15:04:05.999999-07:00", s); err == nil {
		return d
	}
	d, err := time.ParseInLocation("2006-01-02T15:04:05.999999", s, time.UTC)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// TestGoldenResults decodes result-meta documents real Celery 5.2.6 and
// 5.5.2 workers stored on the Redis backend (and RPC replies). Values that
// vary between capture runs (task ids, dates, pid, traceback) are taken
// from the raw document; everything else is spelled out.
func TestGoldenResults(t *testing.T) {
	for _, set := range goldenSets {
		t.Run(set.name, func(t *testing.T) { testGoldenResults(t, set) })
	}
}

func testGoldenResults(t *testing.T, set goldenSet) {
	tests := []struct {
		file string
		want func(raw map[string]any) protocol.ResultMeta
	}{
		{"result_success.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateSuccess,
				Result: i64(5), Children: []any{}, DateDone: naiveUTCDate(t, raw)}
		}},
		{"result_failure.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateFailure,
				Result:    &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}, Module: "builtins"},
				Traceback: raw["traceback"].(string), Children: []any{}, DateDone: naiveUTCDate(t, raw)}
		}},
		{"result_failure_custom.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateFailure,
				Result:    &protocol.ExceptionInfo{Type: "GoldenError", Message: []any{"bad", i64(42)}, Module: "golden_tasks"},
				Traceback: raw["traceback"].(string), Children: []any{}, DateDone: naiveUTCDate(t, raw)}
		}},
		{"result_retry.json", func(raw map[string]any) protocol.ResultMeta {
			id := raw["task_id"].(string)
			return protocol.ResultMeta{TaskID: id, Status: protocol.StateRetry,
				Result:    &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"boom 1"}, Module: "builtins"},
				Traceback: raw["traceback"].(string),
				Children:  []any{protocol.ChildTuple(id)}} // the retry it published: itself
		}},
		{"result_revoked_expired.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateRevoked,
				Result:   &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"expired"}, Module: "celery.exceptions"},
				Children: []any{}, DateDone: naiveUTCDate(t, raw)}
		}},
		{"result_started.json", func(raw map[string]any) protocol.ResultMeta {
			pid := int64(raw["result"].(map[string]any)["pid"].(float64))
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateStarted,
				Result:   map[string]any{"pid": pid, "hostname": "golden_a@golden"},
				Children: []any{}}
		}},
		{"result_group_member.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateSuccess,
				Result: i64(2), Children: []any{}, DateDone: naiveUTCDate(t, raw),
				GroupID: raw["group_id"].(string)}
		}},
		{"result_chain_parent.json", func(raw map[string]any) protocol.ResultMeta {
			next := loadManifestOf(t, set).Scenarios["chain_next"].TaskID
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateSuccess,
				Result: i64(3), Children: []any{protocol.ChildTuple(next)}, DateDone: naiveUTCDate(t, raw)}
		}},
		{"result_extended_success.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateSuccess,
				Result: i64(5), Children: []any{}, DateDone: naiveUTCDate(t, raw),
				Extended: true, Name: "golden.add", Args: []any{i64(2)}, Kwargs: map[string]any{"y": i64(3)},
				Worker: "golden_b@golden", Queue: "golden_work"}
		}},
		{"result_extended_failure.json", func(raw map[string]any) protocol.ResultMeta {
			return protocol.ResultMeta{TaskID: raw["task_id"].(string), Status: protocol.StateFailure,
				Result:    &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}, Module: "builtins"},
				Traceback: raw["traceback"].(string), Children: []any{}, DateDone: naiveUTCDate(t, raw),
				Extended: true, Name: "golden.fail", Args: []any{"bad thing"}, Kwargs: map[string]any{},
				Worker: "golden_b@golden", Queue: "golden_work"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data := readGolden(t, set.file(tt.file))
			got, err := protocol.DecodeResult(data, protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeResult: %v", err)
			}
			if diff := valueDiff(tt.want(rawDoc(t, data)), *got); diff != "" {
				t.Errorf("DecodeResult() mismatch (-want +got):\n%s", diff)
			}
			// Re-encoding loses nothing Celery wrote.
			enc, err := protocol.EncodeResult(got, protocol.ContentTypeJSON)
			if err != nil {
				t.Fatalf("EncodeResult: %v", err)
			}
			again, err := protocol.DecodeResult(enc, protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeResult(EncodeResult()): %v\n%s", err, enc)
			}
			if diff := valueDiff(got, again); diff != "" {
				t.Errorf("result round trip mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGoldenResultBytes checks that for flat documents our encoder writes
// exactly the bytes Celery 5.2 wrote: same keys, order, spacing and
// date_done format.
func TestGoldenResultBytes(t *testing.T) {
	for _, f := range []string{"result_success.json", "result_group_member.json", "result_revoked_expired.json"} {
		t.Run(f, func(t *testing.T) {
			data := readGolden(t, f)
			m, err := protocol.DecodeResult(data, protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := protocol.EncodeResult(m, protocol.ContentTypeJSON)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(data) {
				t.Errorf("EncodeResult() =\n%s\nCelery wrote\n%s", got, data)
			}
		})
	}
}

func TestGoldenResultMsgpackAndRPC(t *testing.T) {
	for _, set := range goldenSets {
		t.Run(set.name, func(t *testing.T) { testGoldenResultMsgpackAndRPC(t, set) })
	}
}

func testGoldenResultMsgpackAndRPC(t *testing.T, set goldenSet) {
	got, err := protocol.DecodeResult(readGolden(t, set.file("result_success.msgpack")), protocol.ContentTypeMsgpack, protocol.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != protocol.StateSuccess || got.TaskID == "" || got.DateDone.IsZero() {
		t.Errorf("msgpack meta = %+v", got)
	}
	if diff := valueDiff([]any{[]any{"x", 1.5}, map[string]any{"k": nil}}, got.Result); diff != "" {
		t.Errorf("msgpack result mismatch (-want +got):\n%s", diff)
	}

	for file, want := range map[string]protocol.ResultMeta{
		"result_rpc_success.amqp.json": {Status: protocol.StateSuccess, Result: i64(5), Children: []any{}},
		"result_rpc_failure.amqp.json": {Status: protocol.StateFailure, Children: []any{},
			Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"nope"}, Module: "builtins"}},
	} {
		t.Run(file, func(t *testing.T) {
			raw := rawDoc(t, readGolden(t, set.file(file)))
			props := raw["properties"].(map[string]any)
			if props["delivery_mode"] != 1.0 || props["content_type"] != "application/json" {
				t.Errorf("RPC reply properties %v", props)
			}
			body, err := base64.StdEncoding.DecodeString(raw["body"].(string))
			if err != nil {
				t.Fatal(err)
			}
			got, err := protocol.DecodeResult(body, protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want.TaskID = props["correlation_id"].(string)
			if want.Status == protocol.StateFailure {
				if !strings.HasSuffix(got.Traceback, "ValueError: nope\n") {
					t.Errorf("traceback %q, want Python's ending in ValueError: nope", got.Traceback)
				}
				want.Traceback = got.Traceback
			}
			if diff := valueDiff(want, *got); diff != "" {
				t.Errorf("DecodeResult(RPC reply) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// rpcResult decodes the result in an RPC reply capture.
func rpcResult(t *testing.T, file string) *protocol.ResultMeta {
	t.Helper()
	raw := rawDoc(t, readGolden(t, file))
	body, err := base64.StdEncoding.DecodeString(raw["body"].(string))
	if err != nil {
		t.Fatal(err)
	}
	got, err := protocol.DecodeResult(body, protocol.ContentTypeJSON, protocol.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestGoldenWorkerOracles reads what real 5.2 and 5.5 workers reported
// from inside a task (golden.reqinfo) and checks that the package decodes
// the same messages the same way:
//   - a protocol 1 message with args: the worker's argsrepr/kwargsrepr are
//     None (hybrid_to_proto2 takes them from the v1 body, which has none),
//     and DecodeTask gives "" for both;
//   - an AMQP header py-amqp wrote from bytes that are not UTF-8 reaches
//     the task as bytes, valid UTF-8 as str (transport/amqp turns the
//     first into []byte: TestHeaderBytesNotUTF8 and the capture's test
//     there);
//   - 5.5: a stamped task sees its stamps.
func TestGoldenWorkerOracles(t *testing.T) {
	for _, set := range goldenSets {
		t.Run(set.name+"/proto1", func(t *testing.T) {
			m, err := protocol.DecodeResult(readGolden(t, set.file("result_reqinfo_proto1.json")), protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			info := m.Result.(map[string]any)
			want := map[string]any{"argsrepr": nil, "kwargsrepr": nil}
			if diff := valueDiff(want, info["received"]); diff != "" {
				t.Errorf("worker's received argsrepr/kwargsrepr mismatch (-want +got):\n%s", diff)
			}
			env := loadRedis(t, set.file("protocol1.redis.json"))
			got, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.ArgsRepr != "" || got.KwargsRepr != "" {
				t.Errorf("DecodeTask(v1) argsrepr %q kwargsrepr %q, want none, as the worker derived", got.ArgsRepr, got.KwargsRepr)
			}
		})
		t.Run(set.name+"/bytes_header", func(t *testing.T) {
			info := rpcResult(t, set.file("result_rpc_reqinfo_bytes.amqp.json")).Result.(map[string]any)
			want := map[string]any{
				"x-bin":  []any{"bytes", `b'\xff\x00raw'`},
				"x-utf8": []any{"str", "'ok'"},
			}
			if diff := valueDiff(want, info["x_headers"]); diff != "" {
				t.Errorf("header types the worker saw mismatch (-want +got):\n%s", diff)
			}
		})
		if !set.v55() {
			continue
		}
		t.Run(set.name+"/stamped", func(t *testing.T) {
			m, err := protocol.DecodeResult(readGolden(t, set.file("result_reqinfo_stamped.json")), protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			info := m.Result.(map[string]any)
			sh := info["stamped_headers"].([]any)
			slices.SortFunc(sh, func(a, b any) int { return strings.Compare(a.(string), b.(string)) })
			want := map[string]any{"monitoring_id": "mon-1", "tenant": []any{"acme", i64(7)}}
			if diff := valueDiff(want, info["stamps"]); diff != "" {
				t.Errorf("stamps the task saw mismatch (-want +got):\n%s", diff)
			}
			if diff := valueDiff([]any{"monitoring_id", "tenant"}, sh); diff != "" {
				t.Errorf("stamped_headers the task saw mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEncodeResult(t *testing.T) {
	done := time.Date(2026, 11, 29, 13, 13, 56, 22287000, time.UTC)
	tests := []struct {
		name string
		give protocol.ResultMeta
		want string
	}{
		{
			name: "success, children nil",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess, Result: i64(5), DateDone: done},
			want: `{"status": "SUCCESS", "result": 5, "traceback": null, "children": [], "date_done": "2026-11-29T13:13:56.022287", "task_id": "t1"}`,
		},
		{
			name: "date_done converted to naive UTC, zero microseconds omitted, nanoseconds dropped",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess,
				DateDone: time.Date(2026, 11, 29, 18, 43, 56, 999, time.FixedZone("", 5*3600+1800))},
			want: `{"status": "SUCCESS", "result": null, "traceback": null, "children": [], "date_done": "2026-11-29T13:13:56", "task_id": "t1"}`,
		},
		{
			name: "failure with group and parent",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateFailure,
				Result:    &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad"}, Module: "builtins"},
				Traceback: "Traceback...", DateDone: done, GroupID: "g", ParentID: "p"},
			want: `{"status": "FAILURE", "result": {"exc_type": "ValueError", "exc_message": ["bad"], "exc_module": "builtins"}, "traceback": "Traceback...", "children": [], "date_done": "2026-11-29T13:13:56.022287", "group_id": "g", "parent_id": "p", "task_id": "t1"}`,
		},
		{
			name: "retry with exception value, no args",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateRetry,
				Result: protocol.ExceptionInfo{Type: "Retry", Module: "celery.exceptions"}},
			want: `{"status": "RETRY", "result": {"exc_type": "Retry", "exc_message": [], "exc_module": "celery.exceptions"}, "traceback": null, "children": [], "date_done": null, "task_id": "t1"}`,
		},
		{
			name: "nil exception pointer",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateRetry, Result: (*protocol.ExceptionInfo)(nil)},
			want: `{"status": "RETRY", "result": null, "traceback": null, "children": [], "date_done": null, "task_id": "t1"}`,
		},
		{
			name: "extended",
			give: protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess, Result: "ok", DateDone: done,
				Extended: true, Name: "tasks.add", Worker: "w1@h", Retries: 2, Queue: "celery"},
			want: `{"status": "SUCCESS", "result": "ok", "traceback": null, "children": [], "date_done": "2026-11-29T13:13:56.022287", "name": "tasks.add", "args": [], "kwargs": {}, "worker": "w1@h", "retries": 2, "queue": "celery", "task_id": "t1"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.EncodeResult(&tt.give, protocol.ContentTypeJSON)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("EncodeResult() =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	for name, bad := range map[string]*protocol.ResultMeta{
		"nil":          nil,
		"no status":    {TaskID: "t"},
		"unencodable":  {TaskID: "t", Status: protocol.StateSuccess, Result: make(chan int)},
		"bad exc args": {TaskID: "t", Status: protocol.StateFailure, Result: &protocol.ExceptionInfo{Type: "X", Message: []any{make(chan int)}}},
	} {
		if _, err := protocol.EncodeResult(bad, protocol.ContentTypeJSON); err == nil {
			t.Errorf("EncodeResult(%s) succeeded, want an error", name)
		}
	}
	if _, err := protocol.EncodeResult(&protocol.ResultMeta{Status: protocol.StateSuccess}, protocol.ContentTypePickle); err == nil {
		t.Error("EncodeResult(pickle) succeeded, want an error")
	}
}

func TestDecodeResult(t *testing.T) {
	tests := []struct {
		name string
		give string
		want protocol.ResultMeta
	}{
		{
			// celery 5.6 (captured from an eager run, celery-protocol.md §6.2).
			name: "aware date_done of 5.4+",
			give: `{"status": "SUCCESS", "result": 3, "traceback": null, "children": [], "date_done": "2026-11-29T13:20:19.106587+00:00", "task_id": "t"}`,
			want: protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess, Result: i64(3), Children: []any{},
				DateDone: time.Date(2026, 11, 29, 13, 20, 19, 106587000, time.UTC)},
		},
		{
			name: "5.5 app-timezone date_done",
			give: `{"status": "SUCCESS", "result": null, "date_done": "2026-11-29T18:50:19+05:30", "task_id": "t"}`,
			want: protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess,
				DateDone: time.Date(2026, 11, 29, 13, 20, 19, 0, time.UTC)},
		},
		{
			name: "old string exc_message, no exc_module",
			give: `{"status": "FAILURE", "result": {"exc_type": "ValueError", "exc_message": "bad thing"}, "traceback": "tb", "children": null, "date_done": null, "task_id": "t"}`,
			want: protocol.ResultMeta{TaskID: "t", Status: protocol.StateFailure, Traceback: "tb",
				Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}}},
		},
		{
			name: "missing exc_message",
			give: `{"status": "REVOKED", "result": {"exc_type": "TaskRevokedError", "exc_module": "celery.exceptions"}}`,
			want: protocol.ResultMeta{Status: protocol.StateRevoked,
				Result: &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{""}, Module: "celery.exceptions"}},
		},
		{
			name: "retry without exception",
			give: `{"status": "RETRY", "result": null, "task_id": "t"}`,
			want: protocol.ResultMeta{TaskID: "t", Status: protocol.StateRetry},
		},
		{
			name: "unknown keys (stamps of 5.3+) ignored, partial extended",
			give: `{"status": "SUCCESS", "result": {"a": [1]}, "name": "tasks.x", "stamped_headers": ["s"], "s": "v", "task_id": "t"}`,
			want: protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess,
				Result: map[string]any{"a": []any{i64(1)}}, Extended: true, Name: "tasks.x"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeResult([]byte(tt.give), protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeResult: %v", err)
			}
			if diff := valueDiff(tt.want, *got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("DecodeResult() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeResultErrors(t *testing.T) {
	tests := []struct {
		name      string
		give      string
		ct        string
		wantField string
		wantIs    error
	}{
		{name: "not json", give: `{`, wantField: "result meta"},
		{name: "a list", give: `[]`, wantField: "result meta"},
		{name: "no status", give: `{"result": 1}`, wantField: "status"},
		{name: "numeric status", give: `{"status": 1}`, wantField: "status"},
		{name: "failure result a string", give: `{"status": "FAILURE", "result": "boom"}`, wantField: "result"},
		{name: "exception without type", give: `{"status": "FAILURE", "result": {"exc_message": []}}`, wantField: "result.exc_type"},
		{name: "exc_module a number", give: `{"status": "FAILURE", "result": {"exc_type": "X", "exc_module": 1}}`, wantField: "result.exc_module"},
		{name: "bad date_done", give: `{"status": "SUCCESS", "date_done": "yesterday"}`, wantField: "date_done"},
		{name: "children an object", give: `{"status": "SUCCESS", "children": {}}`, wantField: "children"},
		{name: "traceback a list", give: `{"status": "FAILURE", "traceback": []}`, wantField: "traceback"},
		{name: "retries a string", give: `{"status": "SUCCESS", "retries": "1"}`, wantField: "retries"},
		{name: "args an object", give: `{"status": "SUCCESS", "args": {}}`, wantField: "args"},
		{name: "kwargs a list", give: `{"status": "SUCCESS", "kwargs": []}`, wantField: "kwargs"},
		{name: "task_id a number", give: `{"status": "SUCCESS", "task_id": 1}`, wantField: "task_id"},
		{name: "pickle", give: "\x80\x04N.", ct: protocol.ContentTypePickle, wantIs: protocol.ErrUnsupportedContentType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := tt.ct
			if ct == "" {
				ct = protocol.ContentTypeJSON
			}
			got, err := protocol.DecodeResult([]byte(tt.give), ct, protocol.DecodeOptions{})
			if err == nil {
				t.Fatalf("DecodeResult() = %+v, want an error", got)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("DecodeResult() error %v, want errors.Is %v", err, tt.wantIs)
			}
			var de *protocol.DecodeError
			if tt.wantField != "" && (!errors.As(err, &de) || de.Field != tt.wantField) {
				t.Errorf("DecodeResult() error %v, want a *DecodeError for %q", err, tt.wantField)
			}
		})
	}
}

func TestExceptionInfo(t *testing.T) {
	tests := []struct {
		give protocol.ExceptionInfo
		want string
	}{
		{protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}, Module: "builtins"}, "ValueError: bad thing"},
		{protocol.ExceptionInfo{Type: "GoldenError", Message: []any{"bad", i64(42)}, Module: "golden_tasks"}, "golden_tasks.GoldenError: ('bad', 42)"},
		{protocol.ExceptionInfo{Type: "TimeLimitExceeded", Message: []any{30.0}, Module: "billiard.exceptions"}, "billiard.exceptions.TimeLimitExceeded: 30.0"},
		{protocol.ExceptionInfo{Type: "Ignore", Module: "celery.exceptions"}, "celery.exceptions.Ignore"},
		{protocol.ExceptionInfo{Type: "Synthetic"}, "Synthetic"},
	}
	for _, tt := range tests {
		if got := tt.give.Error(); got != tt.want {
			t.Errorf("(%+v).Error() = %q, want %q", tt.give, got, tt.want)
		}
	}
	// An *ExceptionInfo is an error, so backends can return it as one.
	var err error = &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}
	var ei *protocol.ExceptionInfo
	if !errors.As(err, &ei) || ei.Type != "KeyError" {
		t.Error("errors.As(*ExceptionInfo) failed")
	}
}

func TestDecodeException(t *testing.T) {
	got, err := protocol.DecodeException(map[string]any{"exc_type": "KeyError", "exc_message": []any{"k"}, "exc_module": "builtins"})
	if err != nil {
		t.Fatal(err)
	}
	want := &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}
	if diff := valueDiff(want, got); diff != "" {
		t.Errorf("DecodeException() mismatch (-want +got):\n%s", diff)
	}
	if diff := valueDiff(map[string]any{"exc_type": "KeyError", "exc_message": []any{"k"}, "exc_module": "builtins"}, got.Value()); diff != "" {
		t.Errorf("Value() mismatch (-want +got):\n%s", diff)
	}
	if _, err := protocol.DecodeException("KeyError"); err == nil {
		t.Error("DecodeException(string) succeeded")
	}
}
