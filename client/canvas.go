package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
)

// Chain returns chain(steps...): each step is sent when the previous one
// succeeded, with its result prepended to the step's arguments (unless the
// step is immutable). A group followed by another step becomes a chord
// whose body is that step, as in Celery. Apply returns the last step's
// result.
func Chain(steps ...Signature) Signature {
	// Right to left, as Celery's prepare_steps: a group followed by a step
	// becomes chord(group, step), and that chord is the step the group
	// before it is followed by, so chain(g1, g2, s) is
	// chord(g1, chord(g2, s)).
	var rev []Signature
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.SubtaskType == "group" && len(rev) > 0 {
			members, _ := publish.SignatureList(s.Kwargs["tasks"])
			s = Chord(members, rev[len(rev)-1])
			rev = rev[:len(rev)-1]
		}
		rev = append(rev, s)
	}
	tasks := make([]any, 0, len(rev))
	for i := len(rev) - 1; i >= 0; i-- {
		tasks = append(tasks, rev[i].Value())
	}
	return canvas("celery.chain", "chain", map[string]any{"tasks": tasks})
}

// Group returns group(members...): the members run in parallel and
// ApplyGroup returns their results in order.
func Group(members ...Signature) Signature {
	tasks := make([]any, len(members))
	for i := range members {
		tasks[i] = members[i].Value()
	}
	return canvas("celery.group", "group", map[string]any{"tasks": tasks})
}

// Chord returns chord(header)(body): the header's tasks run in parallel,
// and when all have succeeded the body is sent with the list of their
// results (in header order) prepended to its arguments. If one fails, the
// body fails with ChordError. Chords need a result backend that counts
// their parts (backend/redis) or one that Celery's celery.chord_unlock task
// completes (backend/sql), the same on the workers and on this Client.
// Apply returns the body's result.
func Chord(header []Signature, body Signature) Signature {
	return canvas("celery.chord", "chord", map[string]any{
		"header": Group(header...).Value(),
		"body":   body.Value(),
		"kwargs": map[string]any{},
	})
}

func canvas(task, kind string, kwargs map[string]any) Signature {
	return Signature{Task: task, SubtaskType: kind, Args: []any{}, Kwargs: kwargs, Options: map[string]any{}}
}

// Apply sends a signature: a single task, a chain or a chord, and returns
// the result of its last task (the chain's last step, the chord's body), as
// Python's apply_async does. Task ids are assigned before anything is
// sent, so every step can be waited for. Groups go through ApplyGroup.
func (c *Client) Apply(ctx context.Context, s Signature) (*AsyncResult, error) {
	if s.SubtaskType == "group" {
		return nil, errors.New("client: Apply of a group: use ApplyGroup, which returns a GroupResult")
	}
	s, ids, parents, err := c.freeze(s)
	if err != nil {
		return nil, err
	}
	if _, err := c.applier(ctx).Apply(s, nil, publish.Call{}); err != nil {
		return nil, err
	}
	r := c.AsyncResult(ids[len(ids)-1])
	r.parents = parents
	return r, nil
}

// ApplyGroup sends a group and returns its members' results in order.
func (c *Client) ApplyGroup(ctx context.Context, g Signature) (*GroupResult, error) {
	if g.SubtaskType != "group" {
		return nil, fmt.Errorf("client: ApplyGroup of a %q signature: want a group", g.Task)
	}
	g, ids, _, err := c.freeze(g)
	if err != nil {
		return nil, err
	}
	if _, err := c.applier(ctx).Apply(g, nil, publish.Call{}); err != nil {
		return nil, err
	}
	gid, _ := g.Options["task_id"].(string)
	res := c.GroupResult(gid, ids...)
	// Each member's own ancestry (a chain's earlier steps, a chord's
	// header), for the database backends, where Celery's join waits with
	// each member's get(), which follows its parents. The members are
	// frozen already: freezing them again gives the same ids.
	if members, err := publish.SignatureList(g.Kwargs["tasks"]); err == nil && len(members) == len(res.Results) {
		for i, m := range members {
			if _, _, anc, err := c.freeze(m); err == nil {
				res.Results[i].parents = anc
			}
		}
	}
	return res, nil
}

func (c *Client) applier(ctx context.Context) *publish.Applier {
	a := &publish.Applier{
		P: c.p,
		Publish: func(m *protocol.TaskMessage, dest publish.Destination, o *publish.Options) error {
			return c.p.Publish(ctx, m, dest, o.Serializer, o.Compression)
		},
	}
	if ch, ok := backend.ChordsOf(c.be); ok {
		a.SetChordSize = func(gid string, n int) error { return ch.SetChordSize(ctx, gid, n) }
	} else if _, ok := c.be.(backend.ChordUnlocker); ok {
		a.UnlockChords = true
	}
	return a
}

// freeze gives every task of s an id and this client's reply_to, as
// Python's freeze does before sending, and returns the ids of the results
// Apply reports: the last one is the canvas's result; for a group, its
// members' in order. parents are the canvas result's ancestors as Celery
// links them (result.parent), root first: a chord's header group, then
// its body's own; a chain step's, then the step itself, for each step
// before the last.
func (c *Client) freeze(s Signature) (_ Signature, ids []string, parents [][]string, _ error) {
	s = s.Clone()
	if s.Options == nil {
		s.Options = map[string]any{}
	}
	if id, _ := s.Options["task_id"].(string); id == "" {
		s.Options["task_id"] = protocol.NewID()
	}
	if rt := c.p.ReplyTo(); rt != "" && s.Options["reply_to"] == nil {
		s.Options["reply_to"] = rt
	}
	switch s.SubtaskType {
	case "", "signature":
		return s, []string{s.TaskID()}, nil, nil
	case "chain", "group":
		tasks, err := publish.SignatureList(s.Kwargs["tasks"])
		if err != nil || len(tasks) == 0 {
			return s, nil, nil, fmt.Errorf("client: %s without tasks: %v", s.SubtaskType, err)
		}
		vals := make([]any, len(tasks))
		for i, t := range tasks {
			t, got, anc, err := c.freeze(t)
			if err != nil {
				return s, nil, nil, err
			}
			vals[i] = t.Value()
			if s.SubtaskType == "group" {
				if t.SubtaskType == "group" {
					return s, nil, nil, errors.New("client: a group inside a group is not supported")
				}
				ids = append(ids, got[len(got)-1])
				continue
			}
			if i > 0 {
				// prepare_steps: the root of this step's ancestry gets
				// the previous step's result as its parent.
				parents = append(parents, ids)
			}
			parents = append(parents, anc...)
			if t.SubtaskType == "group" {
				ids = got
			} else {
				ids = got[len(got)-1:]
			}
		}
		s.Kwargs["tasks"] = vals
		if s.SubtaskType == "chain" && tasks[len(tasks)-1].SubtaskType == "group" {
			return s, nil, nil, errors.New("client: a chain that ends in a group is not supported; apply the group after the chain")
		}
		if s.SubtaskType == "group" {
			parents = nil
		}
		return s, ids, parents, nil
	case "chord":
		header, err := protocol.DecodeSignature(s.Kwargs["header"])
		if err != nil {
			return s, nil, nil, fmt.Errorf("client: chord header: %w", err)
		}
		body, err := protocol.DecodeSignature(s.Kwargs["body"])
		if err != nil {
			return s, nil, nil, fmt.Errorf("client: chord body: %w", err)
		}
		header, hids, _, err := c.freeze(header)
		if err != nil {
			return s, nil, nil, err
		}
		body, ids, banc, err := c.freeze(body)
		if err != nil {
			return s, nil, nil, err
		}
		s.Kwargs["header"], s.Kwargs["body"] = header.Value(), body.Value()
		// chord.freeze: the first result of the body without a parent gets
		// the header's GroupResult as its parent.
		return s, ids, append([][]string{hids}, banc...), nil
	}
	return s, nil, nil, fmt.Errorf("client: cannot send a %q signature", s.SubtaskType)
}

// OnError adds errbacks to a signature as Python's sig.link_error (or
// on_error) does, canvases included: a task or a chain calls them when it
// (any step of it) fails, a group gives them to each member, a chord to
// its body, which fails with ChordError when a header task fails. For a
// plain task it is the same as the LinkError send option.
func OnError(s Signature, errbacks ...Signature) Signature {
	return publish.LinkError(s, errbacks...)
}
