package redis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// restore puts a message recorded in unacked back into the queues its
// exchange and routing key lead to (kombu's restore_by_tag): the
// redelivered flags are set, the message goes to the list of its priority
// band (kombu >= 5.4), to the front (RPUSH) or, with leftmost, to the back
// (LPUSH), and it leaves unacked, all in one atomic step. With expected
// non-empty the step happens only if the unacked entry still equals it. It
// returns the script's result: 1 restored, 0 no longer unacked, -1 entry
// changed.
func (t *Transport) restore(ctx context.Context, tag string, raw []byte, exchange, routingKey, queue string, leftmost bool, expected string) (int64, error) {
	payload, err := markRedelivered(raw)
	if err != nil {
		// Not an object: put it back as it was rather than lose it.
		payload = raw
	}
	prio := 0
	if m, err := parseMeta(raw); err == nil {
		prio = m.Priority
	}
	queues, err := t.lookup(ctx, exchange, routingKey, false)
	if err != nil {
		return 0, err
	}
	if len(queues) == 0 {
		// kombu would drop the message here; send it where it came from.
		fallback := queue
		if fallback == "" {
			fallback = routingKey
		}
		t.log.Warn("redis: no binding for restored message; restoring to its queue",
			zap.String("exchange", exchange), zap.String("routing_key", routingKey),
			zap.String("queue", fallback), zap.String("delivery_tag", tag))
		queues = []string{fallback}
	}
	ks := []string{t.keys.unacked, t.keys.unackedIndex}
	for _, q := range queues {
		ks = append(ks, t.keys.list(q, prio))
	}
	cmd := "RPUSH"
	if leftmost {
		cmd = "LPUSH"
	}
	return t.scrSettle.Run(ctx, t.rdb, ks, tag, cmd, payload, expected).Int64()
}

// restoreUndelivered restores messages popped by a consumer that stopped
// before handing them out, newest first so that they keep their order at
// the front of their queues.
func (t *Transport) restoreUndelivered(hs []*held) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := len(hs) - 1; i >= 0; i-- {
		h := hs[i]
		if !h.settle() {
			continue
		}
		err := t.retry(ctx, func() error {
			_, err := t.restore(ctx, h.tag, h.raw, h.exchange, h.routingKey, h.queue, false, "")
			return err
		})
		if err != nil {
			t.log.Error("redis: could not restore an undelivered message; it comes back after the visibility timeout",
				zap.String("queue", h.queue), zap.String("delivery_tag", h.tag), zap.Error(err))
		}
	}
}

// background runs the restore sweep and the visibility renewal until Close.
func (t *Transport) background() {
	var sweepC, renewC <-chan time.Time
	if !t.cfg.DisableRestore {
		t.sweepLogged()
		tk := time.NewTicker(t.cfg.SweepPeriod())
		defer tk.Stop()
		sweepC = tk.C
	}
	if t.cfg.RenewInterval > 0 {
		tk := time.NewTicker(t.cfg.RenewInterval)
		defer tk.Stop()
		renewC = tk.C
	}
	var stagedC <-chan time.Time
	if t.cfg.StagedPop && t.rpopCount {
		tk := time.NewTicker(t.cfg.StagedLease / 6)
		defer tk.Stop()
		stagedC = tk.C
	}
	for {
		select {
		case <-t.stop:
			return
		case <-sweepC:
			t.sweepLogged()
		case <-stagedC:
			t.stagedHeartbeat()
		case <-renewC:
			if err := t.Renew(context.Background()); err != nil {
				t.logError(&t.bgErrLimits, "redis: visibility renewal failed", err)
			}
		}
	}
}

func (t *Transport) sweepLogged() {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.UnackedMutexExpire)
	defer cancel()
	n, err := t.Sweep(ctx)
	if err != nil {
		t.logError(&t.bgErrLimits, "redis: restore sweep failed", err)
	}
	if n > 0 {
		t.log.Info("redis: restored messages whose visibility timeout passed", zap.Int("count", n))
	}
}

// Sweep runs kombu's restore_visible once: under the unacked_mutex (SET NX
// PX, released with compare-and-delete), every unacked message delivered
// more than VisibilityTimeout ago goes back to the front of its queue with
// the redelivered flags, whichever worker (Python or Go) lost it. Messages
// this process holds are skipped: their visibility is being renewed. It
// returns how many messages were restored; 0 when another worker holds the
// mutex. The transport runs it on its own timer; it is exported for tools
// and tests.
func (t *Transport) Sweep(ctx context.Context) (int, error) {
	t.releaseStray(ctx)
	token := newTag()
	ok, err := t.acquireMutex(ctx, token)
	if err != nil {
		t.addStray(token)
	}
	if err != nil || !ok {
		return 0, err
	}
	defer func() {
		// A release lost with its connection would leave the mutex held
		// for UnackedMutexExpire (kombu's 300 s) and stop every worker's
		// sweep that long, so it is tried again; compare-and-delete makes a
		// repeat harmless.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = t.scrUnlock.Run(uctx, t.rdb, []string{t.keys.unackedMutex}, token).Err(); err == nil || errors.Is(err, goredis.Nil) || uctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond << attempt)
		}
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.addStray(token)
			t.logError(&t.bgErrLimits, "redis: could not release the restore mutex; sweeps wait for it to expire", err)
		}
	}()
	ceil := scoreFloat(time.Now().Add(-t.cfg.VisibilityTimeout))
	// ZREVRANGEBYSCORE as kombu issues it (works before Redis 6.2, unlike
	// ZRANGE ... REV BYSCORE).
	args := []any{"ZREVRANGEBYSCORE", t.keys.unackedIndex, strconv.FormatFloat(ceil, 'f', 6, 64), "0"}
	if t.cfg.UnackedRestoreLimit > 0 {
		args = append(args, "LIMIT", 0, t.cfg.UnackedRestoreLimit)
	}
	tags, err := t.rdb.Do(ctx, args...).StringSlice()
	if err != nil {
		return 0, err
	}
	mine := t.heldTags()
	restored := 0
	for _, tag := range tags {
		if _, ok := mine[tag]; ok {
			continue
		}
		v, err := t.rdb.HGet(ctx, t.keys.unacked, tag).Bytes()
		if errors.Is(err, goredis.Nil) {
			// An index entry without its message: drop it, as kombu does.
			if err := t.rdb.ZRem(ctx, t.keys.unackedIndex, tag).Err(); err != nil {
				return restored, err
			}
			continue
		}
		if err != nil {
			return restored, err
		}
		env, ex, rk, err := parseUnacked(v)
		if err != nil {
			if derr := t.deadLetterRaw(ctx, tag, v, err); derr != nil {
				return restored, derr
			}
			continue
		}
		n, err := t.restore(ctx, tag, env, ex, rk, "", false, string(v))
		if err != nil {
			return restored, err
		}
		if n == 1 {
			restored++
		}
	}
	return restored, nil
}

// acquireMutex takes kombu's unacked_mutex with token (SET NX PX). go-redis
// sends a command again when its reply was lost with the connection; the
// repeated SET NX then fails on the mutex the first one took, and a sweep
// that gave up there would leave it held for UnackedMutexExpire (kombu's
// 300 s), stopping every worker's sweep that long. So a refused SET NX is
// checked: a mutex holding this token is this sweep's.
// strayTokens are the mutex tokens of sweeps whose SET NX or release got
// no answer. On a link that held its bytes (a blackhole healed, TCP
// retransmitting) such a SET reaches Redis after the client gave up on it,
// and would hold the unacked_mutex for UnackedMutexExpire (kombu's 300 s)
// with nobody to release it: no worker, Python or Go, restores anything
// meanwhile (the gray-failure matrix lost 5 minutes to it). Every sweep
// first releases them, compare-and-delete, until they expire.
type strayTokens struct {
	mu     sync.Mutex
	tokens []strayToken
}

type strayToken struct {
	token string
	at    time.Time
}

// maxStray bounds the tokens kept: only the first SET to land can take
// the mutex, and it is one of the oldest.
const maxStray = 32

func (t *Transport) addStray(token string) {
	t.stray.mu.Lock()
	defer t.stray.mu.Unlock()
	if len(t.stray.tokens) == maxStray {
		t.stray.tokens = t.stray.tokens[1:]
	}
	t.stray.tokens = append(t.stray.tokens, strayToken{token, time.Now()})
}

func (t *Transport) releaseStray(ctx context.Context) {
	t.stray.mu.Lock()
	now := time.Now()
	live := t.stray.tokens[:0]
	for _, s := range t.stray.tokens {
		if now.Sub(s.at) < t.cfg.UnackedMutexExpire {
			live = append(live, s)
		}
	}
	t.stray.tokens = live
	tokens := slices.Clone(live)
	t.stray.mu.Unlock()
	for _, s := range tokens {
		err := t.scrUnlock.Run(ctx, t.rdb, []string{t.keys.unackedMutex}, s.token).Err()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return // the link is still down: next sweep
		}
	}
}

func (t *Transport) acquireMutex(ctx context.Context, token string) (bool, error) {
	ok, err := t.rdb.SetNX(ctx, t.keys.unackedMutex, token, t.cfg.UnackedMutexExpire).Result()
	if err != nil || ok {
		return ok, err
	}
	holder, err := t.rdb.Get(ctx, t.keys.unackedMutex).Result()
	if errors.Is(err, goredis.Nil) {
		return false, nil
	}
	return err == nil && holder == token, err
}

// deadLetterRaw moves an unacked entry that cannot be parsed to the
// dead-letter list named "_unacked" (its queue is unknown).
func (t *Transport) deadLetterRaw(ctx context.Context, tag string, v []byte, cause error) error {
	raw, err := marshalJSON(string(v))
	if err != nil {
		return err
	}
	item, err := encodeDeadItem(&deadItem{
		ID: tag, Envelope: raw, Queue: "_unacked", Reason: "undecodable",
		Error: cause.Error(), Time: timeJSON(time.Now()),
	})
	if err != nil {
		return err
	}
	_, err = t.scrSettle.Run(ctx, t.rdb, []string{t.keys.unacked, t.keys.unackedIndex, t.keys.deadList("_unacked")},
		tag, "RPUSH", item, string(v)).Int64()
	if err == nil {
		t.log.Error("redis: malformed unacked entry moved to the dead-letter list",
			zap.String("delivery_tag", tag), zap.String("dead_list", t.keys.deadList("_unacked")), zap.Error(cause))
	}
	return err
}

func (t *Transport) heldTags() map[string]struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[string]struct{}, len(t.held))
	for h := range t.held {
		m[h.tag] = struct{}{}
	}
	return m
}

// Renew refreshes the unacked_index score of every delivery this process
// holds (ZADD XX, so settled or restored messages are not re-added). The
// transport calls it every RenewInterval; it is exported for tests and for
// callers that hold a message across a long pause.
func (t *Transport) Renew(ctx context.Context) error {
	tags := t.heldTags()
	if len(tags) == 0 {
		return nil
	}
	list := make([]string, 0, len(tags))
	for tag := range tags {
		list = append(list, tag)
	}
	slices.Sort(list)
	now := scoreFloat(time.Now())
	_, err := t.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i := 0; i < len(list); i += 500 {
			chunk := list[i:min(i+500, len(list))]
			zs := make([]goredis.Z, len(chunk))
			for j, tag := range chunk {
				zs[j] = goredis.Z{Score: now, Member: tag}
			}
			p.ZAddXX(ctx, t.keys.unackedIndex, zs...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis: renew visibility: %w", err)
	}
	return nil
}
