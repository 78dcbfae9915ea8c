package backendtest

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// diffMeta describes how got differs from want, or returns "". Empty and
// nil containers are equal (a decoder cannot tell [] from a nil slice), and
// times are compared as instants. Fields the backend cannot store
// (Features.Unstored) are not compared.
func diffMeta(want, got *protocol.ResultMeta, feat Features) string {
	var d []string
	field := func(name string, w, g any) {
		if feat.unstored(name) {
			return
		}
		if !reflect.DeepEqual(normalize(w), normalize(g)) {
			d = append(d, fmt.Sprintf("%s: got %#v, want %#v", name, g, w))
		}
	}
	field("TaskID", want.TaskID, got.TaskID)
	field("Status", want.Status, got.Status)
	field("Result", want.Result, got.Result)
	field("Traceback", want.Traceback, got.Traceback)
	field("Children", want.Children, got.Children)
	if !want.DateDone.Equal(got.DateDone) {
		d = append(d, fmt.Sprintf("DateDone: got %v, want %v", got.DateDone, want.DateDone))
	}
	field("GroupID", want.GroupID, got.GroupID)
	field("ParentID", want.ParentID, got.ParentID)
	if want.Extended {
		field("Name", want.Name, got.Name)
		field("Args", want.Args, got.Args)
		field("Kwargs", want.Kwargs, got.Kwargs)
		field("Worker", want.Worker, got.Worker)
		field("Retries", want.Retries, got.Retries)
		field("Queue", want.Queue, got.Queue)
	}
	return strings.Join(d, "\n")
}

// diffParts compares chord parts in order.
func diffParts(want, got []backend.ChordPart) string {
	if len(want) != len(got) {
		return fmt.Sprintf("got %d parts, want %d:\n%s", len(got), len(want), partsString(got))
	}
	var d []string
	for i := range want {
		w, g := want[i], got[i]
		if w.TaskID != g.TaskID || w.GroupID != g.GroupID || w.State != g.State ||
			!reflect.DeepEqual(w.GroupIndex, g.GroupIndex) ||
			!reflect.DeepEqual(normalize(w.Result), normalize(g.Result)) {
			d = append(d, fmt.Sprintf("[%d]: got %s, want %s", i, partString(g), partString(w)))
		}
	}
	return strings.Join(d, "\n")
}

func partsString(ps []backend.ChordPart) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = partString(p)
	}
	return strings.Join(s, "\n")
}

func partString(p backend.ChordPart) string {
	idx := "nil"
	if p.GroupIndex != nil {
		idx = fmt.Sprint(*p.GroupIndex)
	}
	r := fmt.Sprintf("%#v", p.Result)
	if e, ok := p.Result.(*protocol.ExceptionInfo); ok && e != nil {
		r = fmt.Sprintf("%#v", *e)
	}
	return fmt.Sprintf("{group %s index %s task %s %s %s}", p.GroupID, idx, p.TaskID, p.State, r)
}

// normalize maps empty containers to nil, recursively.
func normalize(v any) any {
	switch v := v.(type) {
	case []any:
		if len(v) == 0 {
			return nil
		}
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = normalize(x)
		}
		return out
	case map[string]any:
		if len(v) == 0 {
			return nil
		}
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = normalize(x)
		}
		return out
	case *protocol.ExceptionInfo:
		if v == nil {
			return nil
		}
		return protocol.ExceptionInfo{Type: v.Type, Module: v.Module, Message: asSlice(normalize(v.Message))}
	}
	return v
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
