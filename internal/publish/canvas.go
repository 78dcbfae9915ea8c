package publish

import (
	"errors"
	"fmt"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Call holds the options a caller adds when applying a signature, as in
// sig.apply_async((retval,), parent_id=..., root_id=..., chain=...).
type Call struct {
	ParentID string
	RootID   string
	// Chain is set (possibly to an empty, non-nil slice) when the caller
	// passes the remaining chain; HasChain says so.
	Chain    []protocol.Signature
	HasChain bool
	Priority *int
	GroupID  string
	// GroupIndex is set for chord header members.
	GroupIndex *int
	Chord      *protocol.Signature
	// Queue is the queue of the task that applies the signature: where its
	// messages go when nothing routes them.
	Queue string
	// Options are apply_async options that override the signature's own
	// (queue, priority, ...): those set on an enclosing chain, group or
	// chord signature, which Celery's chain.run, group.apply_async and
	// chord.run pass on to the first step, the members, and the header and
	// body.
	Options map[string]any
}

// canvasOnly are the options of a chain, group or chord signature that
// describe the canvas itself and are not passed on to its tasks.
var canvasOnly = map[string]bool{
	"task_id": true, "group_id": true, "group_index": true, "chord": true, "chain": true,
	"parent_id": true, "root_id": true, "link": true, "link_error": true,
	"subtask_type": true, "immutable": true,
}

// passOn returns the options a canvas signature passes on to its tasks:
// its own, overridden by those it was applied with.
func passOn(own, given map[string]any) map[string]any {
	var out map[string]any
	for _, m := range []map[string]any{own, given} {
		for k, v := range m {
			if canvasOnly[k] || v == nil {
				continue
			}
			if out == nil {
				out = map[string]any{}
			}
			out[k] = v
		}
	}
	return out
}

// withOptions returns sig with opts set over its own options, as Celery's
// Signature._merge does for apply_async's options.
func withOptions(sig protocol.Signature, opts map[string]any) protocol.Signature {
	if len(opts) == 0 {
		return sig
	}
	sig = sig.Clone()
	if sig.Options == nil {
		sig.Options = map[string]any{}
	}
	for k, v := range opts {
		sig.Options[k] = v
	}
	return sig
}

// Message turns a plain signature into a task message and its
// destination, following Signature.apply_async: extra args are prepended
// unless the signature is immutable, options from the signature apply, and
// the caller's parent/root ids fill in what the signature leaves unset.
func (p *Producer) Message(sig protocol.Signature, extra []any, c Call, now time.Time) (*protocol.TaskMessage, Destination, *Options, error) {
	if len(c.Options) > 0 {
		sig = withOptions(sig, c.Options)
	}
	o, err := FromSignature(sig.Options, now)
	if err != nil {
		return nil, Destination{}, nil, fmt.Errorf("celeriac: signature %s options: %w", sig.Task, err)
	}
	args := sig.Args
	if !sig.Immutable && len(extra) > 0 {
		args = append(append(make([]any, 0, len(extra)+len(sig.Args)), extra...), sig.Args...)
	}
	if o.ParentID == "" {
		o.ParentID = c.ParentID
	}
	if o.RootID == "" {
		o.RootID = c.RootID
	}
	if c.HasChain {
		o.Chain = c.Chain
	}
	if c.Priority != nil {
		o.Priority = *c.Priority
	}
	if c.GroupID != "" {
		o.GroupID = c.GroupID
		o.GroupIndex = c.GroupIndex
	}
	if c.Chord != nil {
		o.Chord = c.Chord
	}
	o.FallbackQueue = c.Queue
	m, dest := p.Build(sig.Task, args, sig.Kwargs, o, now)
	return m, dest, o, nil
}

// ErrNoChords: the result backend cannot count chord parts, so a chord
// applied with it would never fire its body.
var ErrNoChords = errors.New("celeriac: chords need a result backend that counts chord parts (the Redis backend)")

// Applier applies signatures as Celery's apply_async does: plain
// signatures become one message; group, chain and chord signatures are
// expanded. Its hooks do the I/O, so that the worker can run each step in
// its settle budget.
type Applier struct {
	P *Producer
	// Publish sends one message.
	Publish func(m *protocol.TaskMessage, dest Destination, o *Options) error
	// SetChordSize records a chord's size before its header is sent, for
	// backends that count chord parts (Redis).
	SetChordSize func(groupID string, size int) error
	// UnlockChords is set for backends that do not count chord parts but
	// complete chords with the celery.chord_unlock task (Celery's database
	// backends): after a chord's header, the Applier sends that task, as
	// Celery's fallback_chord_unlock does. With neither hook, chords are
	// refused with ErrNoChords.
	UnlockChords bool
}

// ChordUnlockTask is Celery's built-in task that completes a chord on a
// backend that does not count chord parts.
const ChordUnlockTask = "celery.chord_unlock"

// Apply publishes sig and returns the ids of what it published, in order.
func (a *Applier) Apply(sig protocol.Signature, extra []any, c Call) ([]string, error) {
	switch sig.SubtaskType {
	case "", "signature":
		m, dest, o, err := a.P.Message(sig, extra, c, time.Now())
		if err != nil {
			return nil, err
		}
		if err := a.Publish(m, dest, o); err != nil {
			return nil, err
		}
		return []string{m.ID}, nil
	case "group":
		return a.applyGroup(sig, extra, c)
	case "chain":
		tasks, err := SignatureList(sig.Kwargs["tasks"])
		if err != nil || len(tasks) == 0 {
			return nil, fmt.Errorf("celeriac: chain signature without tasks: %v", err)
		}
		// A chain's own link_error goes to every step and its link to the
		// last, as chain.run's prepare_steps gives them.
		if errbacks, err := SignatureList(sig.Options["link_error"]); err == nil && len(errbacks) > 0 {
			for i := range tasks {
				tasks[i] = LinkError(tasks[i], errbacks...)
			}
		}
		if links, err := SignatureList(sig.Options["link"]); err == nil && len(links) > 0 {
			tasks[len(tasks)-1] = appendListOption(tasks[len(tasks)-1].Clone(), "link", links)
		}
		tasks = spliceChains(tasks)
		// The first step runs now; the rest ride along reversed, as Celery
		// lays out embed.chain.
		rest := make([]protocol.Signature, 0, len(tasks)-1)
		for i := len(tasks) - 1; i >= 1; i-- {
			rest = append(rest, tasks[i])
		}
		if len(tasks) > 1 && !c.HasChain && (c.GroupID != "" || c.Chord != nil) {
			if last, ok := asMember(tasks[len(tasks)-1], c); ok {
				// A chain that is a group member or a chord header part: its
				// last step stands for it (its result is the member's, it
				// counts the chord part), as in Celery's prepare_steps; the
				// first step must not, or the chord fires with the first
				// step's result. A last step that is a chord stands for it
				// through its body.
				rest[0] = last
				c.GroupID, c.GroupIndex, c.Chord = "", nil, nil
			}
		}
		if !c.HasChain {
			// A chain that is a chord's body carries the rest of the
			// enclosing chain as its chain option (chord.run moves it there).
			if more, err := SignatureList(sig.Options["chain"]); err == nil && len(more) > 0 {
				c.Chain, c.HasChain = more, true
			}
		}
		if c.HasChain {
			rest = append(append([]protocol.Signature(nil), c.Chain...), rest...)
		}
		c.Chain, c.HasChain = rest, true
		// chain.run applies the first step with the chain's options.
		c.Options = passOn(sig.Options, c.Options)
		return a.Apply(tasks[0], extra, c)
	case "chord":
		return a.applyChord(sig, extra, c)
	}
	return nil, fmt.Errorf("celeriac: cannot apply a %q signature", sig.SubtaskType)
}

// spliceChains unrolls the chains among a chain's steps into their steps,
// as Celery's prepare_steps does (steps_extend(task.tasks)) and chain |
// chain does when a canvas is built (unchain_tasks, which gives the inner
// chain's link_error to each of its steps): embed.chain then holds no
// chain, so a failed step marks every later step failed (Celery's
// mark_as_failure stores the failure under each chain element's task_id;
// a nested chain's own id is not its last step's, which stood for the
// canvas and never got a state). A nested chain's link goes to its last
// step, as a chain's own does here.
func spliceChains(tasks []protocol.Signature) []protocol.Signature {
	var out []protocol.Signature
	for _, t := range tasks {
		inner, err := SignatureList(t.Kwargs["tasks"])
		if t.SubtaskType != "chain" || err != nil || len(inner) == 0 {
			out = append(out, t)
			continue
		}
		if errbacks, err := SignatureList(t.Options["link_error"]); err == nil && len(errbacks) > 0 {
			for i := range inner {
				inner[i] = LinkError(inner[i], errbacks...)
			}
		}
		if links, err := SignatureList(t.Options["link"]); err == nil && len(links) > 0 {
			inner[len(inner)-1] = appendListOption(inner[len(inner)-1].Clone(), "link", links)
		}
		out = append(out, spliceChains(inner)...)
	}
	return out
}

func (a *Applier) applyGroup(sig protocol.Signature, extra []any, c Call) ([]string, error) {
	tasks, err := SignatureList(sig.Kwargs["tasks"])
	if err != nil {
		return nil, fmt.Errorf("celeriac: group signature: %w", err)
	}
	gid, _ := sig.Options["task_id"].(string)
	if gid == "" {
		gid = protocol.NewID()
	}
	if !c.HasChain {
		// A group that is a chord's body carries the rest of the enclosing
		// chain as its chain option: Celery's chain(group, group, chain(...))
		// builds chord(group, body=group) followed by the rest
		// (celery/celery#5958). group.apply_async merges its own options
		// into every member's, so each member runs the rest on its own;
		// dropping it would leave the canvas without a result.
		if more, err := SignatureList(sig.Options["chain"]); err == nil && len(more) > 0 {
			c.Chain, c.HasChain = more, true
		}
	}
	c.Options = passOn(sig.Options, c.Options)
	var ids []string
	for _, t := range tasks {
		cc := c
		cc.GroupID = gid
		cc.GroupIndex = nil
		got, err := a.Apply(t, extra, cc)
		ids = append(ids, got...)
		if err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// unlock sends celery.chord_unlock(group_id, body, interval=None,
// max_retries=None, result=[((id, None), None), ...]) one second from now,
// to the body's queue or route with the body's priority, as Celery's
// fallback_chord_unlock does.
func (a *Applier) unlock(gid string, ids []string, body protocol.Signature, c Call) ([]string, error) {
	tuples := make([]any, len(ids))
	for i, id := range ids {
		tuples[i] = []any{[]any{id, nil}, nil}
	}
	sig := protocol.Signature{
		Task: ChordUnlockTask,
		Args: []any{gid, body.Value()},
		Kwargs: map[string]any{
			"interval": nil, "max_retries": nil, "result": tuples,
		},
		Options: map[string]any{"countdown": 1.0},
	}
	// The body's queue, else where the body's task is routed: Celery's
	// fallback_chord_unlock asks the router for the body's name, so that
	// chord_unlock runs where the body's workers are, not on a default
	// queue nobody may consume.
	if q := body.Queue(); q != "" {
		sig.Options["queue"] = q
	} else if q := a.P.cfg.Routes[body.Task]; q != "" {
		sig.Options["queue"] = q
	}
	if p, ok := body.Priority(); ok {
		sig.Options["priority"] = int64(p)
	}
	c.Chain, c.HasChain, c.GroupID, c.GroupIndex, c.Chord, c.Options = nil, false, "", nil, nil, nil
	return a.Apply(sig, nil, c)
}

func (a *Applier) applyChord(sig protocol.Signature, extra []any, c Call) ([]string, error) {
	header, err := protocol.DecodeSignature(sig.Kwargs["header"])
	if err != nil {
		return nil, fmt.Errorf("celeriac: chord header: %w", err)
	}
	body, err := protocol.DecodeSignature(sig.Kwargs["body"])
	if err != nil {
		return nil, fmt.Errorf("celeriac: chord body: %w", err)
	}
	tasks, err := SignatureList(header.Kwargs["tasks"])
	if err != nil {
		return nil, fmt.Errorf("celeriac: chord header tasks: %w", err)
	}
	if !c.HasChain {
		// A chord that is a chord's body (chord(g, chord(h, b)), what
		// chain(g, chord(h, b), ...) becomes) carries the rest of the
		// enclosing chain as its chain option, which goes on to its body.
		if more, err := SignatureList(sig.Options["chain"]); err == nil && len(more) > 0 {
			c.Chain, c.HasChain = more, true
		}
	}
	// chord.run: the chord's options (and those it is applied with) go
	// over the body's and to every header task.
	c.Options = passOn(sig.Options, c.Options)
	body = withOptions(body, c.Options)
	if body.Options == nil {
		body.Options = map[string]any{}
	}
	if id, _ := body.Options["task_id"].(string); id == "" {
		body.Options["task_id"] = protocol.NewID()
	}
	// chord.run's body.options.update(options) also gives the body the
	// parent_id and root_id the chord is applied with: a chord applied by
	// a task (the next chain step, a callback) makes that task the body's
	// parent, whichever task later sends the body (the header task whose
	// on_chord_part_return completes the chord, or chord_unlock: both send
	// it with body.delay, where the body's own parent_id wins over the
	// current task's). A chain body drops them again, as chain.run takes
	// parent_id as its own argument: its first step's parent is the task
	// that sends it. Same in Celery 5.2.6, 5.5 and 5.6.
	if c.ParentID != "" {
		body.Options["parent_id"] = c.ParentID
	}
	if c.RootID != "" {
		body.Options["root_id"] = c.RootID
	}
	gid, _ := header.Options["task_id"].(string)
	if gid == "" {
		gid = protocol.NewID()
	}
	if c.GroupID != "" || c.Chord != nil {
		// A chord that is itself a group member or a chord part: its body
		// is, as Celery's chord.freeze gives the body the group id, index
		// and chord it is given. The header belongs to this chord only.
		if b, ok := asMember(body, c); ok {
			body = b
		}
		c.GroupID, c.GroupIndex, c.Chord = "", nil, nil
	}
	if c.HasChain {
		// The rest of a chain follows the body, not each header task
		// (Celery's chord.run moves the chain option onto the body).
		if len(c.Chain) > 0 {
			body = body.Clone()
			body.Options["chain"] = signatureValues(c.Chain)
		}
		c.Chain, c.HasChain = nil, false
	}
	switch {
	case a.SetChordSize != nil:
		if err := a.SetChordSize(gid, len(tasks)); err != nil {
			return nil, fmt.Errorf("celeriac: chord size: %w", err)
		}
	case !a.UnlockChords:
		return nil, ErrNoChords
	}
	// ids are what was published; parts the results chord_unlock waits
	// for, one per header member: a chain's is its last step's.
	var ids, parts []string
	for i, t := range tasks {
		idx := i
		cc := c
		cc.GroupID, cc.GroupIndex, cc.Chord = gid, &idx, &body
		t, part := withPartID(t)
		got, err := a.Apply(t, extra, cc)
		ids = append(ids, got...)
		if err != nil {
			return ids, err
		}
		if part == "" && len(got) > 0 {
			part = got[0]
		}
		parts = append(parts, part)
	}
	if a.SetChordSize == nil {
		got, err := a.unlock(gid, parts, body, c)
		ids = append(ids, got...)
		if err != nil {
			return ids, err
		}
	}
	return ids, nil
}

// inGroup returns a copy of s whose options make it the group member (and
// chord part) that c describes, for whoever applies it later.
func inGroup(s protocol.Signature, c Call) protocol.Signature {
	s = s.Clone()
	if s.Options == nil {
		s.Options = map[string]any{}
	}
	if c.GroupID != "" {
		s.Options["group_id"] = c.GroupID
	}
	if c.GroupIndex != nil {
		s.Options["group_index"] = int64(*c.GroupIndex)
	}
	if c.Chord != nil {
		s.Options["chord"] = c.Chord.Value()
	}
	return s
}

// asMember returns a copy of s in which the task that stands for s as a
// group member (s itself, a chain's last step, a chord's body, nested)
// carries the membership c describes; false when none does (a group).
func asMember(s protocol.Signature, c Call) (protocol.Signature, bool) {
	switch s.SubtaskType {
	case "", "signature":
		return inGroup(s, c), true
	case "chain":
		tasks, err := SignatureList(s.Kwargs["tasks"])
		if err != nil || len(tasks) == 0 {
			return s, false
		}
		last, ok := asMember(tasks[len(tasks)-1], c)
		if !ok {
			return s, false
		}
		s = s.Clone()
		vals := signatureValues(tasks)
		vals[len(vals)-1] = last.Value()
		s.Kwargs["tasks"] = vals
		return s, true
	case "chord":
		body, err := protocol.DecodeSignature(s.Kwargs["body"])
		if err != nil {
			return s, false
		}
		b, ok := asMember(body, c)
		if !ok {
			return s, false
		}
		s = s.Clone()
		s.Kwargs["body"] = b.Value()
		return s, true
	}
	return s, false
}

// withPartID gives the task that stands for s as a chord part (a chain's
// last step, a chord's body, nested) an id when it has none, as Celery's
// freeze does, and returns it. A plain signature is returned as it is,
// with ""; so is what has no such task (a group).
func withPartID(s protocol.Signature) (protocol.Signature, string) {
	var key string
	switch s.SubtaskType {
	case "chain":
		key = "tasks"
	case "chord":
		key = "body"
	default:
		return s, ""
	}
	var inner protocol.Signature
	var tasks []protocol.Signature
	if key == "tasks" {
		var err error
		tasks, err = SignatureList(s.Kwargs["tasks"])
		if err != nil || len(tasks) == 0 {
			return s, ""
		}
		inner = tasks[len(tasks)-1]
	} else {
		var err error
		if inner, err = protocol.DecodeSignature(s.Kwargs["body"]); err != nil {
			return s, ""
		}
	}
	var id string
	if inner.SubtaskType == "" || inner.SubtaskType == "signature" {
		if id = inner.TaskID(); id == "" {
			inner = inner.Clone()
			if inner.Options == nil {
				inner.Options = map[string]any{}
			}
			id = protocol.NewID()
			inner.Options["task_id"] = id
		}
	} else if inner, id = withPartID(inner); id == "" {
		return s, ""
	}
	s = s.Clone()
	if key == "tasks" {
		vals := signatureValues(tasks)
		vals[len(vals)-1] = inner.Value()
		s.Kwargs["tasks"] = vals
	} else {
		s.Kwargs["body"] = inner.Value()
	}
	return s, id
}
