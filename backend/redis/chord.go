package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// SetChordSize writes <gid>.s like Celery's client does before it publishes
// the last header task: SETEX (SET without expiry) of the decimal size, and
// PUBLISH of the same value on the key's channel.
func (b *Backend) SetChordSize(ctx context.Context, groupID string, size int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if groupID == "" {
		return errors.New("redis backend: SetChordSize: empty group id")
	}
	if size <= 0 {
		return fmt.Errorf("redis backend: SetChordSize %s: chord size %d is not positive", groupID, size)
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	key, val := b.groupKey(groupID, ".s"), strconv.Itoa(size)
	_, err := b.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		if b.s.expires > 0 {
			p.SetEx(ctx, key, val, secondsDuration(b.s.expires))
		} else {
			p.Set(ctx, key, val, 0)
		}
		p.Publish(ctx, key, val)
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis backend: set chord size of %s: %w", groupID, err)
	}
	return nil
}

// ChordPartReturn does what Celery's on_chord_part_return does, with the
// same keys and encoding, in one atomic script: it adds the part to
// <gid>.j (score group_index, or +inf without one), counts the parts, reads
// <gid>.t and <gid>.s, renews their TTLs and, when the count equals size + .t,
// reads all parts and deletes the three keys. Exactly one call per chord
// returns Ready, also when Python workers return other parts of the same
// chord concurrently. Results are in Redis's order: by group_index, parts
// without one last.
//
// A FAILURE or REVOKED part is returned with its *protocol.ExceptionInfo as
// Result; deciding that the chord failed (Celery's ChordError) is the
// caller's business. Once the script completed the chord its keys are gone,
// so problems found afterwards cannot be retried and are reported as failed
// parts instead of an error: a part that does not decode, and a header the
// Python client saved because it contains groups (celery-taskset-meta-<gid>
// exists; Celery restores the nested result structure from it, which this
// package does not do). Such a part has State FAILURE and a ChordError
// exception, so a caller that fails the chord on failed parts settles it.
func (b *Backend) ChordPartReturn(ctx context.Context, p backend.ChordPart) (backend.ChordResult, error) {
	if err := ctx.Err(); err != nil {
		return backend.ChordResult{}, err
	}
	if p.GroupID == "" || p.TaskID == "" {
		return backend.ChordResult{}, errors.New("redis backend: ChordPartReturn: group id and task id are required")
	}
	member, err := encodeMember(b.s.contentType, p)
	if err != nil {
		return backend.ChordResult{}, fmt.Errorf("redis backend: chord part %s: %w", p.TaskID, err)
	}
	if len(member) > maxValueSize {
		return backend.ChordResult{}, fmt.Errorf("redis backend: chord part %s is %d bytes, over Redis's 512 MB limit", p.TaskID, len(member))
	}
	score := "+inf"
	if p.GroupIndex != nil {
		score = strconv.Itoa(*p.GroupIndex)
	}
	list := "0"
	if b.s.unordered {
		list = "1"
	}
	if err := b.enter(); err != nil {
		return backend.ChordResult{}, err
	}
	defer b.inflight.Done()
	keys := []string{
		b.groupKey(p.GroupID, ".j"), b.groupKey(p.GroupID, ".t"),
		b.groupKey(p.GroupID, ".s"), b.groupKey(p.GroupID, ""),
	}
	reply, err := b.chordScript.Run(ctx, b.client, keys, member, score, b.s.expires, list).Slice()
	if err != nil {
		return backend.ChordResult{}, fmt.Errorf("redis backend: chord part %s of %s: %w", p.TaskID, p.GroupID, err)
	}
	res, err := parseChordReply(b.s.contentType, p.GroupID, reply)
	if err != nil {
		return backend.ChordResult{}, fmt.Errorf("redis backend: chord %s: %w", p.GroupID, err)
	}
	for _, part := range res.Results {
		if e, ok := part.Result.(*protocol.ExceptionInfo); ok && part.TaskID == "" && e.Type == "ChordError" {
			b.s.log.Warn("redis backend: chord completed with a part it cannot use",
				zap.String("group_id", p.GroupID), zap.Any("error", e.Message))
		}
	}
	return res, nil
}

// parseChordReply reads the chord script's reply. Once the script reports
// the chord complete, members that do not decode and a complex header
// become failed parts (see ChordPartReturn); the error is only for a reply
// of the wrong shape.
func parseChordReply(contentType, groupID string, reply []any) (backend.ChordResult, error) {
	var res backend.ChordResult
	if len(reply) < 2 {
		return res, fmt.Errorf("unexpected chord script reply %v", reply)
	}
	if ready, _ := reply[0].(int64); ready != 1 {
		return res, nil
	}
	var members, scores []any
	complex := int64(0)
	if len(reply) == 5 {
		complex, _ = reply[2].(int64)
		members, _ = reply[3].([]any)
		scores, _ = reply[4].([]any)
	}
	if len(reply) != 5 || (len(scores) != 0 && len(scores) != len(members)) {
		// The keys are deleted: the chord can only be failed now.
		res.Ready = true
		res.Results = []backend.ChordPart{chordFailure(groupID, "unexpected reply from the chord script")}
		return res, nil
	}
	res.Ready = true
	res.Results = make([]backend.ChordPart, 0, len(members)+1)
	if complex == 1 {
		res.Results = append(res.Results, chordFailure(groupID,
			"the chord header contains groups; celeriac cannot restore their nested results"))
	}
	for i, m := range members {
		s, _ := m.(string)
		part, err := decodeMember(contentType, []byte(s))
		if err != nil {
			part = chordFailure(groupID, fmt.Sprintf("chord part %d does not decode: %v", i, err))
		}
		part.GroupID = groupID
		if len(scores) > 0 {
			sc, _ := scores[i].(string)
			if idx, err := parseScore(sc); err == nil {
				part.GroupIndex = idx
			}
		}
		res.Results = append(res.Results, part)
	}
	return res, nil
}

// chordFailure is a synthetic failed part standing for a problem with the
// chord itself; its TaskID is empty.
func chordFailure(groupID, msg string) backend.ChordPart {
	return backend.ChordPart{GroupID: groupID, State: protocol.StateFailure,
		Result: &protocol.ExceptionInfo{Type: "ChordError", Message: []any{msg}, Module: "celery.exceptions"}}
}

// parseScore turns a ZRANGE score back into a group index: "inf" for parts
// Celery added without one.
func parseScore(s string) (*int, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, fmt.Errorf("bad score %q", s)
	}
	if math.IsInf(f, 1) {
		return nil, nil
	}
	if f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
		return nil, fmt.Errorf("score %q is not a group index", s)
	}
	i := int(f)
	return &i, nil
}

// encodeMember encodes a part as Celery does: encode([1, task_id, state,
// encode_result(result)]) with the result serializer; exceptions become
// {"exc_type", "exc_message", "exc_module"}.
func encodeMember(contentType string, p backend.ChordPart) ([]byte, error) {
	return protocol.Marshal(contentType, []any{int64(1), p.TaskID, string(p.State), exceptionValue(p.Result)})
}

// decodeMember is the inverse of encodeMember, and reads members written by
// Python workers. Results of RETRY, FAILURE and REVOKED parts are returned
// as *protocol.ExceptionInfo when they look like an exception document.
func decodeMember(contentType string, data []byte) (backend.ChordPart, error) {
	v, err := protocol.Unmarshal(contentType, data, protocol.DecodeOptions{MaxBodySize: maxValueSize})
	if err != nil {
		return backend.ChordPart{}, err
	}
	tup, ok := v.([]any)
	if !ok || len(tup) != 4 {
		return backend.ChordPart{}, fmt.Errorf("chord member is not a 4-element list: %.100q", data)
	}
	id, ok1 := tup[1].(string)
	state, ok2 := tup[2].(string)
	if !ok1 || !ok2 || id == "" || state == "" {
		return backend.ChordPart{}, fmt.Errorf("chord member has no task id or state: %.100q", data)
	}
	p := backend.ChordPart{TaskID: id, State: protocol.State(state), Result: tup[3]}
	switch p.State {
	case protocol.StateFailure, protocol.StateRetry, protocol.StateRevoked:
		// Read like Python's exception_to_python; a result that is not an
		// exception dict is kept as it is.
		if e, err := protocol.DecodeException(tup[3]); err == nil {
			p.Result = e
		}
	}
	return p, nil
}

// exceptionValue converts a *protocol.ExceptionInfo into the dict Celery
// stores; other values pass through.
func exceptionValue(v any) any {
	if e, ok := v.(*protocol.ExceptionInfo); ok && e != nil {
		return e.Value()
	}
	return v
}

func secondsDuration(s int64) time.Duration { return time.Duration(s) * time.Second }
