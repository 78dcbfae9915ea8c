package publish

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// TestOptionsRoundTrip: options stored in a signature by ToSignature (a
// Go-built canvas) read back the same with FromSignature (how the worker,
// Python's or celeriac's, applies it).
func TestOptionsRoundTrip(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	idx, yes := 3, true
	cb := protocol.Signature{Task: "cb", Args: []any{}, Kwargs: map[string]any{}, Options: map[string]any{}}
	for _, tc := range []struct {
		name string
		in   Options
	}{
		{"empty", Options{}},
		{"ids", Options{TaskID: "t", ParentID: "p", RootID: "r", GroupID: "g", GroupIndex: &idx}},
		{"routing", Options{Queue: "q", Exchange: "ex", RoutingKey: "rk", Priority: 7, ReplyTo: "rt"}},
		{"times", Options{Countdown: 1500 * time.Millisecond, HasCountdown: true, ETA: now, Expires: now.Add(time.Hour)}},
		{"limits", Options{TimeLimit: 10 * time.Second, SoftTimeLimit: 5 * time.Second, IgnoreResult: &yes, Shadow: "sh"}},
		{"callbacks", Options{Link: []protocol.Signature{cb}, LinkError: []protocol.Signature{cb}, Headers: map[string]any{"h": "v"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]any{}
			tc.in.ToSignature(m)
			got, err := FromSignature(m, now)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.in
			if diff := cmp.Diff(&want, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMessagePrependsUnlessImmutable follows Signature.apply_async: the
// parent's result goes first, except for an immutable signature.
func TestMessagePrependsUnlessImmutable(t *testing.T) {
	p := New(nil, Config{})
	sig := protocol.Signature{Task: "add", Args: []any{int64(1)}, Kwargs: map[string]any{}, Options: map[string]any{"task_id": "x"}}
	for _, tc := range []struct {
		immutable bool
		want      []any
	}{{false, []any{int64(9), int64(1)}}, {true, []any{int64(1)}}} {
		sig.Immutable = tc.immutable
		m, _, _, err := p.Message(sig, []any{int64(9)}, Call{ParentID: "par", RootID: "root"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !cmp.Equal(m.Args, tc.want) || m.ID != "x" || m.ParentID != "par" || m.RootID != "root" {
			t.Errorf("immutable=%v: args %v id %s parent %s root %s", tc.immutable, m.Args, m.ID, m.ParentID, m.RootID)
		}
	}
}

type recorder struct{}

func (r *recorder) Publish(context.Context, *transport.Publishing) error { return nil }

// TestChordUnlock: on a backend that unlocks chords, the header is followed
// by celery.chord_unlock as Celery's fallback_chord_unlock sends it.
func TestChordUnlock(t *testing.T) {
	p := New(&recorder{}, Config{})
	var sent []*protocol.TaskMessage
	var dests []Destination
	a := &Applier{P: p, UnlockChords: true, Publish: func(m *protocol.TaskMessage, d Destination, _ *Options) error {
		sent, dests = append(sent, m), append(dests, d)
		return nil
	}}
	body := protocol.Signature{Task: "tsum", Args: []any{}, Kwargs: map[string]any{}, Options: map[string]any{"task_id": "body", "queue": "bq", "priority": int64(4)}}
	header := protocol.Signature{Task: "celery.group", SubtaskType: "group", Kwargs: map[string]any{"tasks": []any{
		protocol.Signature{Task: "add", Args: []any{int64(1)}, Kwargs: map[string]any{}, Options: map[string]any{"task_id": "h0"}}.Value(),
		protocol.Signature{Task: "add", Args: []any{int64(2)}, Kwargs: map[string]any{}, Options: map[string]any{"task_id": "h1"}}.Value(),
	}}, Options: map[string]any{"task_id": "gid"}}
	chord := protocol.Signature{Task: "celery.chord", SubtaskType: "chord", Kwargs: map[string]any{"header": header.Value(), "body": body.Value()}}
	before := time.Now()
	ids, err := a.Apply(chord, nil, Call{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) != 3 || len(ids) != 3 {
		t.Fatalf("sent %d messages (ids %v), want 2 header tasks and chord_unlock", len(sent), ids)
	}
	for i, m := range sent[:2] {
		if m.Group != "gid" || m.GroupIndex == nil || *m.GroupIndex != i || m.Embed.Chord == nil || m.Embed.Chord.TaskID() != "body" {
			t.Errorf("header %d: group %q index %v chord %v", i, m.Group, m.GroupIndex, m.Embed.Chord)
		}
	}
	u := sent[2]
	wantKw := map[string]any{"interval": nil, "max_retries": nil, "result": []any{
		[]any{[]any{"h0", nil}, nil}, []any{[]any{"h1", nil}, nil},
	}}
	if u.Name != ChordUnlockTask || len(u.Args) != 2 || u.Args[0] != "gid" || !cmp.Equal(u.Kwargs, wantKw) {
		t.Errorf("chord_unlock %s args %v kwargs %v", u.Name, u.Args, u.Kwargs)
	}
	if b, err := protocol.DecodeSignature(u.Args[1]); err != nil || b.TaskID() != "body" {
		t.Errorf("chord_unlock body %v, %v", u.Args[1], err)
	}
	if dests[2].RoutingKey != "bq" || u.Priority != 4 || u.ETA.Before(before.Add(time.Second)) || u.Group != "" || u.Embed.Chord != nil {
		t.Errorf("chord_unlock to %q priority %d eta %v group %q chord %v", dests[2].RoutingKey, u.Priority, u.ETA, u.Group, u.Embed.Chord)
	}

	a.UnlockChords = false
	if _, err := a.Apply(chord, nil, Call{}); err != ErrNoChords {
		t.Errorf("chord without a way to complete it: %v, want ErrNoChords", err)
	}
}

// FuzzFromSignature: options come from the wire (a signature inside a
// message); no input may panic.
func FuzzFromSignature(f *testing.F) {
	f.Add([]byte(`{"task_id":"x","countdown":1.5,"eta":"2026-12-02T10:00:00+00:00","link":[{"task":"a"}],"chain":[{"task":"b","args":[1]}]}`))
	f.Add([]byte(`{"expires":"nope","priority":"high","group_index":1e300,"stamped_headers":["s",1],"chord":{"task":1}}`))
	f.Add([]byte(`{"queue":{"name":"q"},"headers":{"a":[1,{"b":null}]},"link_error":{"task":"e"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		v, err := protocol.DecodeJSON(data, protocol.DecodeOptions{})
		if err != nil {
			return
		}
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		o, err := FromSignature(m, time.Now())
		if err != nil || o == nil {
			return
		}
		out := map[string]any{}
		o.ToSignature(out)
	})
}

// TestNewTracingTypedNil: a nil *sdktrace.TracerProvider in the interface
// (what otelenv.New returns when tracing is off) is tracing off, not a
// provider whose Tracer method panics.
func TestNewTracingTypedNil(t *testing.T) {
	var tp *sdktrace.TracerProvider
	if got := NewTracing(tp, nil); got != nil {
		t.Fatalf("NewTracing(nil *TracerProvider) = %v, want nil", got)
	}
}

// TestCountdownAndETA: as Celery's as_task_v2, a non-zero countdown wins
// over eta, and countdown=0 leaves eta as given (none when none is).
func TestCountdownAndETA(t *testing.T) {
	p := New(nil, Config{})
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	eta := now.Add(time.Hour)
	for _, tc := range []struct {
		name string
		o    Options
		want time.Time
	}{
		{"countdown wins", Options{Countdown: 5 * time.Second, HasCountdown: true, ETA: eta}, now.Add(5 * time.Second)},
		{"countdown 0 keeps eta", Options{HasCountdown: true, ETA: eta}, eta},
		{"countdown 0 alone sends no eta", Options{HasCountdown: true}, time.Time{}},
		{"eta alone", Options{ETA: eta}, eta},
	} {
		m, _ := p.Build("t", nil, nil, &tc.o, now)
		if !m.ETA.Equal(tc.want) {
			t.Errorf("%s: eta %v, want %v", tc.name, m.ETA, tc.want)
		}
	}
}
