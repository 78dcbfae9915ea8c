package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// deadLetter moves a held delivery from unacked to its queue's dead-letter
// list in one atomic step.
func (t *Transport) deadLetter(ctx context.Context, h *held, r transport.DeadLetterReason) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	env := json.RawMessage(h.raw)
	if !json.Valid(h.raw) {
		env, _ = marshalJSON(string(h.raw))
	}
	item, err := encodeDeadItem(&deadItem{
		ID: h.tag, Envelope: env, Queue: h.queue, Exchange: h.exchange, RoutingKey: h.routingKey,
		Reason: r.Reason, Error: r.Error, TaskID: r.TaskID, TaskName: r.TaskName, Time: timeJSON(r.Time),
	})
	if err != nil {
		return fmt.Errorf("redis: dead-letter: %w", err)
	}
	return t.retry(ctx, func() error {
		n, err := t.scrSettle.Run(ctx, t.rdb,
			[]string{t.keys.unacked, t.keys.unackedIndex, t.keys.deadList(h.queue)},
			h.tag, "RPUSH", item, "").Int64()
		if err != nil {
			return fmt.Errorf("redis: dead-letter: %w", err)
		}
		if n == 0 {
			return transport.ErrStaleDelivery
		}
		return nil
	})
}

// deadLetterUndecodable dead-letters a popped message whose envelope
// protocol.DecodeEnvelope refused; the consumer goes on.
func (t *Transport) deadLetterUndecodable(h *held, cause error) {
	if !h.settle() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := t.deadLetter(ctx, h, transport.DeadLetterReason{Reason: "undecodable", Error: cause.Error()})
	if err != nil {
		t.log.Error("redis: could not dead-letter an undecodable message; it stays unacked and comes back after the visibility timeout",
			zap.String("queue", h.queue), zap.String("delivery_tag", h.tag), zap.NamedError("cause", cause), zap.Error(err))
		return
	}
	t.log.Error("redis: undecodable message moved to the dead-letter list",
		zap.String("queue", h.queue), zap.String("delivery_tag", h.tag),
		zap.String("dead_list", t.keys.deadList(h.queue)), zap.Error(cause))
}

// deadEntry is a stored dead item with its exact bytes (needed to remove it).
type deadEntry struct {
	raw  string
	item *deadItem
	err  error
}

func (t *Transport) readDead(ctx context.Context, queue string, limit int) ([]deadEntry, error) {
	stop := int64(-1)
	if limit > 0 {
		stop = int64(limit) - 1
	}
	raws, err := t.rdb.LRange(ctx, t.keys.deadList(queue), 0, stop).Result()
	if err != nil {
		return nil, fmt.Errorf("redis: dead letters of %q: %w", queue, err)
	}
	out := make([]deadEntry, len(raws))
	for i, r := range raws {
		item, err := decodeDeadItem([]byte(r))
		out[i] = deadEntry{raw: r, item: item, err: err}
	}
	return out, nil
}

// DeadLetters lists up to limit dead messages of a queue, oldest first.
// Each one's Message is decoded from the stored envelope; an item whose
// envelope cannot be decoded has an empty Message with the raw envelope as
// its Body. Items that are not dead-letter records at all are listed with
// Reason "malformed" and no ID.
func (t *Transport) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	if t.isClosed() {
		return nil, transport.ErrClosed
	}
	entries, err := t.readDead(ctx, queue, limit)
	if err != nil {
		return nil, err
	}
	out := make([]transport.DeadMessage, 0, len(entries))
	for _, e := range entries {
		if e.err != nil {
			out = append(out, transport.DeadMessage{Queue: queue,
				Message: protocol.Message{Body: []byte(e.raw)},
				Reason:  transport.DeadLetterReason{Reason: "malformed", Error: e.err.Error()}})
			continue
		}
		d := e.item
		dm := transport.DeadMessage{
			ID: d.ID, Queue: d.Queue, Exchange: d.Exchange, RoutingKey: d.RoutingKey,
			Reason: transport.DeadLetterReason{Reason: d.Reason, Error: d.Error, TaskID: d.TaskID,
				TaskName: d.TaskName, Time: parseDeadTime(d.Time)},
		}
		raw := d.envelopeBytes()
		if env, err := protocol.DecodeEnvelope(raw, t.cfg.Decode); err == nil {
			dm.Message = env.Message
		} else {
			dm.Message = protocol.Message{Body: raw}
		}
		out = append(out, dm)
	}
	return out, nil
}

func parseDeadTime(raw json.RawMessage) time.Time {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if tm, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return tm
		}
		return time.Time{}
	}
	var f float64
	if json.Unmarshal(raw, &f) == nil && f > 0 && f < 1e12 {
		return time.UnixMicro(int64(f * 1e6)).UTC()
	}
	return time.Time{}
}

// Replay moves dead messages of a queue back to it (all when ids is empty):
// each one is removed from the dead-letter list and pushed to the back of
// the list of its priority band in one atomic step, so a replay that stops
// halfway loses nothing and doubles nothing.
func (t *Transport) Replay(ctx context.Context, queue string, ids []string, opts transport.ReplayOptions) (int, error) {
	if t.isClosed() {
		return 0, transport.ErrClosed
	}
	entries, err := t.readDead(ctx, queue, 0)
	if err != nil {
		return 0, err
	}
	moved := 0
	for _, e := range entries {
		if e.err != nil || (len(ids) > 0 && !slices.Contains(ids, e.item.ID)) {
			continue
		}
		env := e.item.envelopeBytes()
		if opts.ResetRetries {
			if r, err := resetRetries(env); err == nil {
				env = r
			}
		}
		prio := 0
		if m, err := parseMeta(env); err == nil {
			prio = m.Priority
		}
		n, err := t.scrReplay.Run(ctx, t.rdb, []string{t.keys.deadList(queue), t.keys.list(queue, prio)},
			e.raw, env).Int64()
		if err != nil {
			return moved, fmt.Errorf("redis: replay: %w", err)
		}
		moved += int(n)
	}
	return moved, nil
}

// PurgeDead deletes dead messages of a queue (all when ids is empty) and
// returns how many.
func (t *Transport) PurgeDead(ctx context.Context, queue string, ids []string) (int, error) {
	if t.isClosed() {
		return 0, transport.ErrClosed
	}
	key := t.keys.deadList(queue)
	if len(ids) == 0 {
		var n *goredis.IntCmd
		_, err := t.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			n = p.LLen(ctx, key)
			p.Del(ctx, key)
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("redis: purge dead letters: %w", err)
		}
		return int(n.Val()), nil
	}
	entries, err := t.readDead(ctx, queue, 0)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, e := range entries {
		if e.err != nil || !slices.Contains(ids, e.item.ID) {
			continue
		}
		n, err := t.rdb.LRem(ctx, key, 1, e.raw).Result()
		if err != nil {
			return removed, fmt.Errorf("redis: purge dead letters: %w", err)
		}
		removed += int(n)
	}
	return removed, nil
}
