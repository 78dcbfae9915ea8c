package redis

import (
	"math/big"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// Members as Celery 5.2.6 writes them into <gid>.j (json.dumps), captured
// with MONITOR during a chord run, plus edge cases.
var memberSeeds = []string{
	`[1, "813f6e1f-3b0c-4a57-9d3b-0b1c4c1b7c2e", "SUCCESS", 2]`,
	`[1, "a1", "FAILURE", {"exc_type": "ValueError", "exc_message": ["bad thing"], "exc_module": "builtins"}]`,
	`[1, "a2", "REVOKED", {"exc_type": "TaskRevokedError", "exc_message": "old style", "exc_module": "celery.exceptions"}]`,
	`[1, "a3", "SUCCESS", {"nested": [1, 2.5, null, "\u00e9", 123456789012345678901234567890]}]`,
	`[1, "a4", "FAILURE", "not a dict"]`,
	`[1, "", "SUCCESS", 1]`,
	`[1, "a5"]`,
	`{"task_id": "x"}`,
	`[[[[[[[[[[[[]]]]]]]]]]]]`,
	"",
}

func FuzzDecodeMember(f *testing.F) {
	for _, s := range memberSeeds {
		f.Add([]byte(s), false)
	}
	one := 1
	for _, p := range []backend.ChordPart{
		{TaskID: "t", State: protocol.StateSuccess, Result: map[string]any{"k": []any{int64(1), "x"}}},
		{TaskID: "t", GroupIndex: &one, State: protocol.StateFailure, Result: &protocol.ExceptionInfo{Type: "E", Message: []any{"m"}, Module: "m"}},
	} {
		for _, mp := range []bool{false, true} {
			ct := protocol.ContentTypeJSON
			if mp {
				ct = protocol.ContentTypeMsgpack
			}
			if b, err := encodeMember(ct, p); err == nil {
				f.Add(b, mp)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, msgpack bool) {
		defer fuzzwatch.Watch(t, data, msgpack)()
		ct := protocol.ContentTypeJSON
		if msgpack {
			ct = protocol.ContentTypeMsgpack
		}
		p, err := decodeMember(ct, data)
		if err != nil {
			return
		}
		if p.TaskID == "" || p.State == "" {
			t.Fatalf("accepted a member without task id or state: %q", data)
		}
		// What was accepted encodes and decodes to the same part.
		enc, err := encodeMember(ct, p)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", p, err)
		}
		again, err := decodeMember(ct, enc)
		if err != nil {
			t.Fatalf("decode of re-encoded %q: %v", enc, err)
		}
		if d := cmp.Diff(p, again, bigIntEqual, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}

// bigIntEqual compares the *big.Int values decoders return for integers
// beyond int64.
var bigIntEqual = cmp.Comparer(func(a, b *big.Int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cmp(b) == 0
})

func FuzzParseScore(f *testing.F) {
	for _, s := range []string{"0", "12", "inf", "+inf", "-inf", "1.5", "1e300", "nan", "", "2147483648", "-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		defer fuzzwatch.Watch(t, s)()
		i, err := parseScore(s)
		if err != nil || i == nil {
			return
		}
		if got, err := parseScore(itoa(*i)); err != nil || got == nil || *got != *i {
			t.Fatalf("score %q -> %d does not round-trip", s, *i)
		}
	})
}

func itoa(i int) string {
	b, _ := protocol.Marshal(protocol.ContentTypeJSON, int64(i))
	return string(b)
}

func TestDecodeMember(t *testing.T) {
	tests := []struct {
		give    string
		want    backend.ChordPart
		wantErr bool
	}{
		{give: memberSeeds[0], want: backend.ChordPart{TaskID: "813f6e1f-3b0c-4a57-9d3b-0b1c4c1b7c2e", State: protocol.StateSuccess, Result: int64(2)}},
		{give: memberSeeds[1], want: backend.ChordPart{TaskID: "a1", State: protocol.StateFailure, Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}, Module: "builtins"}}},
		{give: memberSeeds[2], want: backend.ChordPart{TaskID: "a2", State: protocol.StateRevoked, Result: &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"old style"}, Module: "celery.exceptions"}}},
		{give: `[1, "a", "RETRY", {"exc_type": "Retry", "exc_message": null}]`, want: backend.ChordPart{TaskID: "a", State: protocol.StateRetry, Result: &protocol.ExceptionInfo{Type: "Retry", Message: []any{nil}}}}, // Python: Retry(None)
		{give: memberSeeds[4], want: backend.ChordPart{TaskID: "a4", State: protocol.StateFailure, Result: "not a dict"}},
		{give: memberSeeds[5], wantErr: true},
		{give: memberSeeds[6], wantErr: true},
		{give: memberSeeds[7], wantErr: true},
		{give: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			got, err := decodeMember(protocol.ContentTypeJSON, []byte(tt.give))
			if (err != nil) != tt.wantErr {
				t.Fatalf("decodeMember err = %v, wantErr %v", err, tt.wantErr)
			}
			if d := cmp.Diff(tt.want, got); err == nil && d != "" {
				t.Errorf("decodeMember mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseChordReply(t *testing.T) {
	ok := `[1, "t", "SUCCESS", 1]`
	tests := []struct {
		name      string
		give      []any
		wantReady bool
		wantErr   bool
		// wantTasks are the task ids of the results; "!" is a synthetic
		// ChordError part.
		wantTasks []string
	}{
		{name: "incomplete", give: []any{int64(0), int64(3)}},
		{name: "complete", give: []any{int64(1), int64(1), int64(0), []any{ok}, []any{"0"}}, wantReady: true, wantTasks: []string{"t"}},
		{name: "list mode", give: []any{int64(1), int64(2), int64(0), []any{ok, `[1, "u", "SUCCESS", 2]`}, []any{}}, wantReady: true, wantTasks: []string{"t", "u"}},
		{name: "complex header", give: []any{int64(1), int64(1), int64(1), []any{ok}, []any{"inf"}}, wantReady: true, wantTasks: []string{"!", "t"}},
		{name: "bad member", give: []any{int64(1), int64(2), int64(0), []any{"nope", ok}, []any{"0", "1"}}, wantReady: true, wantTasks: []string{"!", "t"}},
		{name: "bad score keeps the part", give: []any{int64(1), int64(1), int64(0), []any{ok}, []any{"0.5"}}, wantReady: true, wantTasks: []string{"t"}},
		{name: "short", give: []any{int64(1)}, wantErr: true},
		{name: "ready but truncated", give: []any{int64(1), int64(1)}, wantReady: true, wantTasks: []string{"!"}},
		{name: "scores mismatch", give: []any{int64(1), int64(2), int64(0), []any{ok, ok}, []any{"0"}}, wantReady: true, wantTasks: []string{"!"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := parseChordReply(protocol.ContentTypeJSON, "g", tt.give)
			if (err != nil) != tt.wantErr || res.Ready != tt.wantReady {
				t.Fatalf("parseChordReply = %+v, %v", res, err)
			}
			var tasks []string
			for _, p := range res.Results {
				if p.GroupID != "g" {
					t.Errorf("part without its group id: %+v", p)
				}
				if p.TaskID == "" {
					if e, ok := p.Result.(*protocol.ExceptionInfo); !ok || e.Type != "ChordError" || p.State != protocol.StateFailure {
						t.Errorf("synthetic part %+v is not a failed ChordError", p)
					}
					tasks = append(tasks, "!")
					continue
				}
				tasks = append(tasks, p.TaskID)
			}
			if d := cmp.Diff(tt.wantTasks, tasks); d != "" {
				t.Errorf("parts (-want +got):\n%s", d)
			}
		})
	}
}
