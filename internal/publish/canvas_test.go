package publish

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
)

func sig(name string, args ...any) protocol.Signature {
	return protocol.Signature{Task: name, Args: args, Kwargs: map[string]any{}, Options: map[string]any{"task_id": name + "-id"}}
}

func chainOf(steps ...protocol.Signature) protocol.Signature {
	tasks := make([]any, len(steps))
	for i := range steps {
		tasks[i] = steps[i].Value()
	}
	return protocol.Signature{Task: "celery.chain", SubtaskType: "chain", Args: []any{}, Kwargs: map[string]any{"tasks": tasks}, Options: map[string]any{}}
}

// TestApplyChainInChordHeader: a chain in a chord's header is one part,
// counted by its last step (Celery's prepare_steps gives the last task
// group_id, group_index and chord); the first step is sent outside the
// group.
func TestApplyChainInChordHeader(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{
		P: New(nil, Config{}),
		Publish: func(m *protocol.TaskMessage, dest Destination, o *Options) error {
			sent = append(sent, m)
			return nil
		},
		SetChordSize: func(string, int) error { return nil },
	}
	body := sig("tsum")
	header := protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": "gid"},
		Kwargs: map[string]any{"tasks": []any{chainOf(sig("add", 1, 1), sig("mul", 10)).Value(), sig("add", 5, 5).Value()}}}
	chord := protocol.Signature{Task: "celery.chord", SubtaskType: "chord", Args: []any{}, Options: map[string]any{},
		Kwargs: map[string]any{"header": header.Value(), "body": body.Value(), "kwargs": map[string]any{}}}
	if _, err := a.Apply(chord, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 2 {
		t.Fatalf("sent %d messages, want 2", len(sent))
	}
	first, other := sent[0], sent[1]
	if first.Name != "add" || first.Group != "" || first.GroupIndex != nil || first.Embed.Chord != nil {
		t.Errorf("the chain's first step is in the group: group %q, index %v, chord %v", first.Group, first.GroupIndex, first.Embed.Chord)
	}
	if len(first.Embed.Chain) != 1 {
		t.Fatalf("the chain's first step carries %d more steps, want 1", len(first.Embed.Chain))
	}
	got := first.Embed.Chain[0].Options
	want := map[string]any{"task_id": "mul-id", "group_id": "gid", "group_index": int64(0), "chord": body.Value()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the chain's last step's options mismatch (-want +got):\n%s", diff)
	}
	if other.Group != "gid" || other.GroupIndex == nil || *other.GroupIndex != 1 || other.Embed.Chord == nil {
		t.Errorf("the second header part: group %q, index %v, chord %v", other.Group, other.GroupIndex, other.Embed.Chord)
	}
}

// TestChordUnlockWaitsForChainsLastStep: on a backend that unlocks chords,
// celery.chord_unlock waits for a header chain's last step, which gets an id
// when it has none.
func TestChordUnlockWaitsForChainsLastStep(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), UnlockChords: true, Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}}
	noID := sig("mul", 10)
	delete(noID.Options, "task_id")
	header := protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": "gid"},
		Kwargs: map[string]any{"tasks": []any{
			chainOf(sig("add", 1, 1), sig("mul", 10)).Value(),
			chainOf(sig("sub", 1, 1), noID).Value(),
			sig("sq", 5).Value(),
		}}}
	chord := protocol.Signature{Task: "celery.chord", SubtaskType: "chord", Args: []any{}, Options: map[string]any{},
		Kwargs: map[string]any{"header": header.Value(), "body": sig("tsum").Value(), "kwargs": map[string]any{}}}
	if _, err := a.Apply(chord, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 4 || sent[3].Name != ChordUnlockTask {
		t.Fatalf("sent %d messages, want 3 header tasks and chord_unlock", len(sent))
	}
	assigned := sent[1].Embed.Chain[0].TaskID()
	if assigned == "" {
		t.Fatalf("the second chain's last step has no id: %v", sent[1].Embed.Chain[0].Options)
	}
	want := []any{
		[]any{[]any{"mul-id", nil}, nil},
		[]any{[]any{assigned, nil}, nil},
		[]any{[]any{"sq-id", nil}, nil},
	}
	if diff := cmp.Diff(want, sent[3].Kwargs["result"]); diff != "" {
		t.Errorf("chord_unlock's results mismatch (-want +got):\n%s", diff)
	}
}
