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

func chordOf(gid string, body protocol.Signature, header ...protocol.Signature) protocol.Signature {
	tasks := make([]any, len(header))
	for i := range header {
		tasks[i] = header[i].Value()
	}
	g := protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": gid},
		Kwargs: map[string]any{"tasks": tasks}}
	return protocol.Signature{Task: "celery.chord", SubtaskType: "chord", Args: []any{}, Options: map[string]any{},
		Kwargs: map[string]any{"header": g.Value(), "body": body.Value(), "kwargs": map[string]any{}}}
}

// TestChordUnlockNestedAndRouted: on a backend that unlocks chords, a
// chord in a chord's header is the outer part through its body (the outer
// chord_unlock waits for the inner body, which carries the outer group),
// and celery.chord_unlock goes where the body's task is routed, as
// Celery's fallback_chord_unlock routes it by the body's name.
func TestChordUnlockNestedAndRouted(t *testing.T) {
	type out struct {
		m    *protocol.TaskMessage
		dest Destination
	}
	var sent []out
	a := &Applier{P: New(nil, Config{Routes: map[string]string{"tsum": "cd3_b", "inner": "cd3_a"}}), UnlockChords: true,
		Publish: func(m *protocol.TaskMessage, d Destination, _ *Options) error {
			sent = append(sent, out{m, d})
			return nil
		}}
	innerBody := sig("inner")
	chord := chordOf("outer", sig("tsum"), chordOf("gin", innerBody, sig("a"), sig("b")), sig("c"))
	if _, err := a.Apply(chord, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	var unlocks []out
	for _, o := range sent {
		if o.m.Name == ChordUnlockTask {
			unlocks = append(unlocks, o)
		}
	}
	if len(unlocks) != 2 {
		t.Fatalf("sent %d chord_unlock, want 2 (inner, outer)", len(unlocks))
	}
	inner, outer := unlocks[0], unlocks[1]
	if inner.dest.RoutingKey != "cd3_a" || outer.dest.RoutingKey != "cd3_b" {
		t.Errorf("chord_unlock went to %q and %q, want the bodies' routes cd3_a and cd3_b", inner.dest.RoutingKey, outer.dest.RoutingKey)
	}
	want := []any{[]any{[]any{"inner-id", nil}, nil}, []any{[]any{"c-id", nil}, nil}}
	if diff := cmp.Diff(want, outer.m.Kwargs["result"]); diff != "" {
		t.Errorf("outer chord_unlock's results mismatch (-want +got):\n%s", diff)
	}
	body, err := protocol.DecodeSignature(inner.m.Args[1])
	if err != nil {
		t.Fatal(err)
	}
	if body.Options["group_id"] != "outer" || body.Options["group_index"] != int64(0) || body.Options["chord"] == nil {
		t.Errorf("the inner body is not the outer chord's part 0: %v", body.Options)
	}
}

// TestCanvasOptionsPassOn: options set on a chain, group or chord
// signature (Python's chain(...).set(queue=...)) reach its tasks as
// chain.run (the first step), group.apply_async (every member) and
// chord.run (every header task and the body) pass them, over the tasks'
// own; ids and canvas wiring are not passed on.
func TestCanvasOptionsPassOn(t *testing.T) {
	type out struct {
		m    *protocol.TaskMessage
		dest Destination
	}
	var sent []out
	a := &Applier{P: New(nil, Config{}), SetChordSize: func(string, int) error { return nil },
		Publish: func(m *protocol.TaskMessage, d Destination, _ *Options) error {
			sent = append(sent, out{m, d})
			return nil
		}}
	set := func(s protocol.Signature, kv ...any) protocol.Signature {
		s = s.Clone()
		for i := 0; i < len(kv); i += 2 {
			s.Options[kv[i].(string)] = kv[i+1]
		}
		return s
	}

	ch := set(chainOf(set(sig("a"), "queue", "own"), sig("b")), "queue", "cd3_x", "priority", int64(5), "task_id", "chain-id")
	if _, err := a.Apply(ch, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || sent[0].dest.RoutingKey != "cd3_x" || sent[0].m.Priority != 5 || sent[0].m.ID != "a-id" {
		t.Fatalf("chain's first step: %+v to %q, want a-id to cd3_x with priority 5", sent[0].m, sent[0].dest.RoutingKey)
	}
	if q := sent[0].m.Embed.Chain[0].Queue(); q != "" {
		t.Errorf("the chain's second step got queue %q; chain.run passes options to the first step only", q)
	}

	sent = nil
	g := protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": "gid", "queue": "cd3_y"},
		Kwargs: map[string]any{"tasks": []any{sig("a").Value(), set(sig("b"), "queue", "own").Value()}}}
	if _, err := a.Apply(g, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range sent {
		if o.dest.RoutingKey != "cd3_y" {
			t.Errorf("group member %s went to %q, want cd3_y", o.m.Name, o.dest.RoutingKey)
		}
	}

	sent = nil
	cd := set(chordOf("gid2", sig("tsum"), sig("a"), sig("b")), "queue", "cd3_z")
	if _, err := a.Apply(cd, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	for _, o := range sent {
		if o.dest.RoutingKey != "cd3_z" || o.m.Embed.Chord == nil || o.m.Embed.Chord.Queue() != "cd3_z" {
			t.Errorf("chord header task %s went to %q with body %v, want cd3_z for both", o.m.Name, o.dest.RoutingKey, o.m.Embed.Chord)
		}
	}
}

// TestChainBodyContinuesEnclosingChain: a chain that is a chord's body
// carries the rest of the enclosing chain as its chain option (chord.run
// moves it there); applying that body continues with it after its own
// steps.
func TestChainBodyContinuesEnclosingChain(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}}
	body := chainOf(sig("b1"), sig("b2"))
	body.Options["chain"] = []any{sig("after").Value()}
	if _, err := a.Apply(body, []any{int64(1)}, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || len(sent[0].Embed.Chain) != 2 {
		t.Fatalf("sent %d messages; want b1 carrying [b2, after] reversed", len(sent))
	}
	if got := []string{sent[0].Embed.Chain[0].Task, sent[0].Embed.Chain[1].Task}; got[0] != "after" || got[1] != "b2" {
		t.Errorf("b1's chain = %v, want [after b2] (the next step last)", got)
	}
}

// TestChordBodyChordContinuesEnclosingChain: chain(g, chord(h, b), after)
// is chord(g, chord(h, b)) with after as the inner chord's chain option;
// when the worker applies that inner chord, after must follow its body b
// (found by the differential canvas tester: the chain stopped at b).
func TestChordBodyChordContinuesEnclosingChain(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}, SetChordSize: func(string, int) error { return nil }}
	inner := chordOf("g2", sig("b"), sig("h"))
	inner.Options["chain"] = []any{sig("after").Value()}
	if _, err := a.Apply(inner, []any{[]any{int64(1)}}, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || sent[0].Name != "h" || sent[0].Embed.Chord == nil {
		t.Fatalf("sent %v; want the header task h with the chord body", sent)
	}
	body, err := protocol.DecodeSignature(sent[0].Embed.Chord.Value())
	if err != nil {
		t.Fatal(err)
	}
	more, err := SignatureList(body.Options["chain"])
	if err != nil || len(more) != 1 || more[0].Task != "after" {
		t.Errorf("the body's chain option = %v (%v), want [after]", body.Options["chain"], err)
	}
}

// TestChordBodyParentIsTheApplyingTask: a chord applied by a task (the
// next step of a chain after a, as a worker applies it) gives its body a
// as parent_id, and the enclosing root_id, as chord.run's
// body.options.update(options) does: whichever task fires the body later
// (a header task on Redis, chord_unlock on the database backends) sends
// it with that parent. A chain body's first step is not given them
// (chain.run takes parent_id as its own argument).
func TestChordBodyParentIsTheApplyingTask(t *testing.T) {
	for _, tt := range []struct {
		name       string
		body       protocol.Signature
		wantParent any
	}{
		{"task body", sig("b"), "a-id"},
		{"chain body", chainOf(sig("b1"), sig("b2")), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var sent []*protocol.TaskMessage
			a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
				sent = append(sent, m)
				return nil
			}, SetChordSize: func(string, int) error { return nil }}
			if _, err := a.Apply(chordOf("g", tt.body, sig("h")), []any{int64(1)}, Call{ParentID: "a-id", RootID: "root-id"}); err != nil {
				t.Fatal(err)
			}
			if len(sent) != 1 || sent[0].Embed.Chord == nil {
				t.Fatalf("sent %v; want the header task h with the chord body", sent)
			}
			if sent[0].ParentID != "a-id" {
				t.Errorf("header task parent_id = %q, want a-id", sent[0].ParentID)
			}
			body, err := protocol.DecodeSignature(sent[0].Embed.Chord.Value())
			if err != nil {
				t.Fatal(err)
			}
			if body.Options["parent_id"] != "a-id" || body.Options["root_id"] != "root-id" {
				t.Fatalf("the body's options = %v, want parent_id a-id and root_id root-id", body.Options)
			}
			// The header task h completes the chord and sends the body.
			sent = nil
			if _, err := a.Apply(body, []any{[]any{int64(1)}}, Call{ParentID: "h-id", RootID: "root-id"}); err != nil {
				t.Fatal(err)
			}
			want := tt.wantParent
			if want == nil {
				want = "h-id"
			}
			if len(sent) != 1 || sent[0].ParentID != want {
				t.Errorf("the body was sent as %v, want one message with parent_id %v", sent, want)
			}
		})
	}
}

// TestNestedChainSpliced: a chain among a chain's steps is unrolled into
// its steps, as Celery's prepare_steps does, so that embed.chain names
// each step's own task_id (a failure marks them all failed); the inner
// chain's link_error goes to each of its steps.
func TestNestedChainSpliced(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}}
	inner := LinkError(chainOf(sig("b"), chainOf(sig("c"), sig("d"))), sig("eb"))
	if _, err := a.Apply(chainOf(sig("a"), inner, sig("e")), nil, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || sent[0].Name != "a" {
		t.Fatalf("sent %v; want the first step a", sent)
	}
	var got []string
	for _, s := range sent[0].Embed.Chain {
		got = append(got, s.Task+"/"+s.TaskID())
		errbacks, _ := SignatureList(s.Options["link_error"])
		if want := s.Task != "e"; (len(errbacks) == 1) != want {
			t.Errorf("step %s has errbacks %v; want the inner chain's eb: %v", s.Task, errbacks, want)
		}
	}
	if diff := cmp.Diff([]string{"e/e-id", "d/d-id", "c/c-id", "b/b-id"}, got); diff != "" {
		t.Errorf("embed.chain mismatch (-want +got):\n%s", diff)
	}
}

// TestLinkErrorAsCelery: link_error on a canvas lands where Celery's
// link_error methods put it.
func TestLinkErrorAsCelery(t *testing.T) {
	eb := sig("eb")
	tests := []struct {
		name string
		in   protocol.Signature
		// where lists the signatures that must carry eb, by task name.
		check func(t *testing.T, out protocol.Signature)
	}{
		{"task", sig("t"), func(t *testing.T, out protocol.Signature) { wantErrbacks(t, out, "eb") }},
		{"chain keeps it (chain.run gives it to every step)", chainOf(sig("a"), sig("b")), func(t *testing.T, out protocol.Signature) {
			wantErrbacks(t, out, "eb")
			tasks, _ := SignatureList(out.Kwargs["tasks"])
			for _, s := range tasks {
				wantErrbacks(t, s)
			}
		}},
		{"group gives it to each member", groupOf("g", sig("a"), sig("b")), func(t *testing.T, out protocol.Signature) {
			wantErrbacks(t, out)
			tasks, _ := SignatureList(out.Kwargs["tasks"])
			for _, s := range tasks {
				wantErrbacks(t, s, "eb")
			}
		}},
		{"chord gives it to its body only", chordOf("g", sig("body"), sig("h")), func(t *testing.T, out protocol.Signature) {
			wantErrbacks(t, out)
			body, _ := protocol.DecodeSignature(out.Kwargs["body"])
			wantErrbacks(t, body, "eb")
			header, _ := protocol.DecodeSignature(out.Kwargs["header"])
			tasks, _ := SignatureList(header.Kwargs["tasks"])
			for _, s := range tasks {
				wantErrbacks(t, s)
			}
		}},
		{"appends to the errbacks there", func() protocol.Signature {
			s := sig("t")
			s.Options["link_error"] = []any{sig("first").Value()}
			return s
		}(), func(t *testing.T, out protocol.Signature) { wantErrbacks(t, out, "first", "eb") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.in.Clone()
			out := LinkError(tt.in, eb)
			tt.check(t, out)
			if diff := cmp.Diff(before, tt.in); diff != "" {
				t.Errorf("LinkError changed its argument:\n%s", diff)
			}
		})
	}
}

func wantErrbacks(t *testing.T, s protocol.Signature, names ...string) {
	t.Helper()
	ebs, err := SignatureList(s.Options["link_error"])
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ebs {
		got = append(got, e.Task)
	}
	if diff := cmp.Diff(names, got); diff != "" {
		t.Errorf("%s's link_error mismatch (-want +got):\n%s", s.Task, diff)
	}
}

// TestChainLinkErrorToEveryStep: a chain's own link_error reaches every
// step, its link the last, as chain.run does.
func TestChainLinkErrorToEveryStep(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}}
	c := chainOf(sig("a"), sig("b"))
	c.Options["link_error"] = []any{sig("eb").Value()}
	c.Options["link"] = []any{sig("cb").Value()}
	if _, err := a.Apply(c, nil, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || len(sent[0].Embed.Chain) != 1 {
		t.Fatalf("sent %d messages; want a carrying b", len(sent))
	}
	if eb := sent[0].Embed.Errbacks; len(eb) != 1 || eb[0].Task != "eb" || len(sent[0].Embed.Callbacks) != 0 {
		t.Errorf("the first step: errbacks %v, callbacks %v; want [eb] and none", eb, sent[0].Embed.Callbacks)
	}
	b := sent[0].Embed.Chain[0]
	wantErrbacks(t, b, "eb")
	if links, _ := SignatureList(b.Options["link"]); len(links) != 1 || links[0].Task != "cb" {
		t.Errorf("the last step's link = %v, want [cb]", b.Options["link"])
	}
}

func groupOf(gid string, members ...protocol.Signature) protocol.Signature {
	tasks := make([]any, len(members))
	for i := range members {
		tasks[i] = members[i].Value()
	}
	return protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": gid},
		Kwargs: map[string]any{"tasks": tasks}}
}

// TestGroupBodyCarriesEnclosingChain: Celery's chain(group(a, b),
// group(c, e), chain(f, g)) is chord(group(a, b), body=group(c, e))
// followed by f and g, which ride on the body group as its chain option
// (celery/celery#5958). Celery's group.apply_async gives that option to
// every member, so each continues with f then g; a worker that dropped it
// never finished the canvas (the differential canvas tester's "link on a
// chord header member" hang).
func TestGroupBodyCarriesEnclosingChain(t *testing.T) {
	var sent []*protocol.TaskMessage
	a := &Applier{P: New(nil, Config{}), Publish: func(m *protocol.TaskMessage, _ Destination, _ *Options) error {
		sent = append(sent, m)
		return nil
	}}
	member := sig("c")
	member.Immutable = true
	tail := chainOf(sig("e1"), sig("e2"))
	body := protocol.Signature{Task: "celery.group", SubtaskType: "group", Args: []any{}, Options: map[string]any{"task_id": "gid"},
		Kwargs: map[string]any{"tasks": []any{member.Value(), tail.Value()}}}
	body.Options["chain"] = []any{sig("g").Value(), sig("f").Value()}
	if _, err := a.Apply(body, []any{[]any{int64(1), int64(2)}}, Call{}); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 2 {
		t.Fatalf("sent %d messages, want 2", len(sent))
	}
	steps := func(m *protocol.TaskMessage) []string {
		var s []string
		for _, x := range m.Embed.Chain {
			s = append(s, x.Task)
		}
		return s
	}
	if got, want := steps(sent[0]), []string{"g", "f"}; sent[0].Name != "c" || !cmp.Equal(got, want) {
		t.Errorf("first member %s carries %v, want c carrying %v", sent[0].Name, got, want)
	}
	// A chain member runs its own steps before the enclosing chain's.
	if got, want := steps(sent[1]), []string{"g", "f", "e2"}; sent[1].Name != "e1" || !cmp.Equal(got, want) {
		t.Errorf("second member %s carries %v, want e1 carrying %v", sent[1].Name, got, want)
	}
	if sent[0].Group != "gid" {
		t.Errorf("c: group %q, want gid", sent[0].Group)
	}
}
