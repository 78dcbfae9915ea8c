package protocol_test

import (
	"errors"
	"testing"

	"github.com/celeriac/celeriac/protocol"
)

func TestDecodeSignature(t *testing.T) {
	tests := []struct {
		name string
		give map[string]any
		want protocol.Signature
	}{
		{
			name: "plain, as Celery serializes it",
			give: map[string]any{"task": "tasks.add", "args": []any{i64(1)}, "kwargs": map[string]any{"b": i64(2)},
				"options": map[string]any{"task_id": "id", "queue": "q"}, "subtask_type": nil, "immutable": true},
			want: protocol.Signature{Task: "tasks.add", Args: []any{i64(1)}, Kwargs: map[string]any{"b": i64(2)},
				Options: map[string]any{"task_id": "id", "queue": "q"}, Immutable: true},
		},
		{
			name: "only a task, extra keys kept",
			give: map[string]any{"task": "t", "chord_size": i64(3), "immutable": nil},
			want: protocol.Signature{Task: "t", Args: []any{}, Kwargs: map[string]any{}, Options: map[string]any{},
				Extra: map[string]any{"chord_size": i64(3)}},
		},
		{
			name: "group",
			give: map[string]any{"task": "celery.group", "args": []any{}, "subtask_type": "group",
				"kwargs": map[string]any{"tasks": []any{map[string]any{"task": "a"}}}, "options": nil},
			want: protocol.Signature{Task: "celery.group", Args: []any{}, SubtaskType: "group",
				Kwargs: map[string]any{"tasks": []any{map[string]any{"task": "a"}}}, Options: map[string]any{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := protocol.DecodeSignature(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if diff := valueDiff(tt.want, got); diff != "" {
				t.Errorf("DecodeSignature() mismatch (-want +got):\n%s", diff)
			}
			again, err := protocol.DecodeSignature(got.Value())
			if err != nil {
				t.Fatal(err)
			}
			if diff := valueDiff(got, again); diff != "" {
				t.Errorf("DecodeSignature(Value()) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeSignatureErrors(t *testing.T) {
	tests := []struct {
		name      string
		give      any
		wantField string
	}{
		{"not an object", []any{}, "signature"},
		{"no task", map[string]any{"args": []any{}}, "signature.task"},
		{"task a number", map[string]any{"task": i64(1)}, "signature.task"},
		{"args an object", map[string]any{"task": "t", "args": map[string]any{}}, "signature.args"},
		{"kwargs a list", map[string]any{"task": "t", "kwargs": []any{}}, "signature.kwargs"},
		{"options a string", map[string]any{"task": "t", "options": "x"}, "signature.options"},
		{"subtask_type a bool", map[string]any{"task": "t", "subtask_type": true}, "signature.subtask_type"},
		{"immutable a string", map[string]any{"task": "t", "immutable": "yes"}, "signature.immutable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := protocol.DecodeSignature(tt.give)
			var de *protocol.DecodeError
			if !errors.As(err, &de) || de.Field != tt.wantField {
				t.Errorf("DecodeSignature() error %v, want a *DecodeError for %q", err, tt.wantField)
			}
		})
	}
}

func TestSignatureValue(t *testing.T) {
	got := protocol.Signature{Task: "t", Extra: map[string]any{"chord_size": i64(1)}}.Value()
	want := map[string]any{"task": "t", "args": []any{}, "kwargs": map[string]any{}, "options": map[string]any{},
		"subtask_type": nil, "immutable": false, "chord_size": i64(1)}
	if diff := valueDiff(want, got); diff != "" {
		t.Errorf("Value() mismatch (-want +got):\n%s", diff)
	}
}

func TestSignatureAccessors(t *testing.T) {
	link := map[string]any{"task": "cb"}
	s := protocol.Signature{Task: "t", Options: map[string]any{
		"task_id": "id", "queue": "q", "group_id": "g", "reply_to": "r", "priority": i64(7),
		"link": link, "link_error": []any{link, link},
	}}
	if s.TaskID() != "id" || s.Queue() != "q" || s.GroupID() != "g" || s.ReplyTo() != "r" {
		t.Errorf("accessors = %q %q %q %q", s.TaskID(), s.Queue(), s.GroupID(), s.ReplyTo())
	}
	if p, ok := s.Priority(); !ok || p != 7 {
		t.Errorf("Priority() = %d, %v", p, ok)
	}
	if p, ok := (protocol.Signature{}).Priority(); ok {
		t.Errorf("Priority() of no options = %d, true", p)
	}
	cb := protocol.Signature{Task: "cb", Args: []any{}, Kwargs: map[string]any{}, Options: map[string]any{}}
	links, err := s.Link()
	if err != nil {
		t.Fatal(err)
	}
	if diff := valueDiff([]protocol.Signature{cb}, links); diff != "" {
		t.Errorf("Link() mismatch (-want +got):\n%s", diff)
	}
	errbacks, err := s.LinkError()
	if err != nil {
		t.Fatal(err)
	}
	if diff := valueDiff([]protocol.Signature{cb, cb}, errbacks); diff != "" {
		t.Errorf("LinkError() mismatch (-want +got):\n%s", diff)
	}
	if l, err := (protocol.Signature{}).Link(); err != nil || l != nil {
		t.Errorf("Link() of no options = %v, %v", l, err)
	}
	if _, err := (protocol.Signature{Options: map[string]any{"link": "x"}}).Link(); err == nil {
		t.Error("Link() of a string succeeded")
	}
}

func TestSignatureCanvas(t *testing.T) {
	a := map[string]any{"task": "a", "args": []any{i64(1)}}
	b := map[string]any{"task": "b"}
	group := protocol.Signature{Task: "celery.group", SubtaskType: "group", Kwargs: map[string]any{"tasks": []any{a, b}}}
	tasks, err := group.Tasks()
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || tasks[0].Task != "a" || tasks[1].Task != "b" {
		t.Errorf("Tasks() = %+v", tasks)
	}
	chord := protocol.Signature{Task: "celery.chord", SubtaskType: "chord", Kwargs: map[string]any{
		"header": group.Value(), "body": b, "kwargs": map[string]any{},
	}}
	header, err := chord.ChordHeader()
	if err != nil {
		t.Fatal(err)
	}
	if members, err := header.Tasks(); err != nil || len(members) != 2 {
		t.Errorf("ChordHeader().Tasks() = %v, %v", members, err)
	}
	if body, err := chord.ChordBody(); err != nil || body.Task != "b" {
		t.Errorf("ChordBody() = %+v, %v", body, err)
	}
	plain := protocol.Signature{Task: "t"}
	if _, err := plain.Tasks(); err == nil {
		t.Error("Tasks() of a plain signature succeeded")
	}
	if _, err := plain.ChordHeader(); err == nil {
		t.Error("ChordHeader() of a plain signature succeeded")
	}
	if _, err := plain.ChordBody(); err == nil {
		t.Error("ChordBody() of a plain signature succeeded")
	}
}

func TestSignatureClone(t *testing.T) {
	s := protocol.Signature{Task: "t", Args: []any{[]any{i64(1)}, []byte("x")},
		Kwargs: map[string]any{"k": map[string]any{"n": i64(1)}}, Options: map[string]any{"task_id": "a"},
		Extra: map[string]any{"e": []any{"v"}}}
	c := s.Clone()
	if diff := valueDiff(s, c); diff != "" {
		t.Fatalf("Clone() mismatch (-want +got):\n%s", diff)
	}
	c.Args[0].([]any)[0] = i64(2)
	c.Args[1].([]byte)[0] = 'y'
	c.Kwargs["k"].(map[string]any)["n"] = i64(2)
	c.Options["task_id"] = "b"
	c.Extra["e"].([]any)[0] = "w"
	if s.Args[0].([]any)[0] != i64(1) || s.Args[1].([]byte)[0] != 'x' || s.Kwargs["k"].(map[string]any)["n"] != i64(1) ||
		s.Options["task_id"] != "a" || s.Extra["e"].([]any)[0] != "v" {
		t.Errorf("changing the clone changed the original: %+v", s)
	}
}
