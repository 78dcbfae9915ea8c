package redis

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The staged pop (Config.StagedPop) takes messages without the consume
// script. The script's Redis CPU a message is mostly Lua hashing every
// envelope it touches (docs/performance.md); plain commands do not.
//
// A round is two round trips on a connection of the consumer's own:
//
//  1. LMOVE each message from its list into a staging list of the
//     consumer's own (one a source list, so that a message can go back
//     exactly where it came from), LLEN of every list (how many the next
//     round should ask for), WATCH of the consumer's fence key, and LLEN
//     of the staging lists used.
//  2. MULTI: kombu's records (HSET unacked, ZADD unacked_index) written
//     from the client, and the staging lists deleted; EXEC.
//
// A message is therefore always in exactly one place in Redis: its list,
// a staging list, or kombu's unacked (from where any worker, Python or Go,
// restores it). What a consumer that died left in its staging lists only
// a celeriac sweeper puts back: every transport with staged consumers
// keeps a heartbeat per consumer in the registry hash, and puts back the
// staging lists of a consumer whose heartbeat is older than
// Config.StagedLease. The sweeper changes the fence in the same
// transaction, so a consumer that was only slow (and whose messages went
// back) sees its EXEC fail and drops the round, and a sweep that raced a
// consumer's round fails its own EXEC (it watches the staging lists).

// stagedRegistry is the hash of staged consumers: id -> stagedBeat JSON.
const stagedRegistry = "_celeriac.staging"

// stagedBeat is a registry entry: when the consumer last beat, and every
// list it has staged from (index i is staging list i).
type stagedBeat struct {
	At    int64    `json:"at"` // unix ms
	Lists []string `json:"lists"`
}

// stager is one consumer's staged pop. Only the consumer's fetch loop
// calls pop; mu guards what the heartbeat reads.
type stager struct {
	t  *Transport
	id string

	conn     *goredis.Conn
	watching bool // a WATCH may be left on conn
	// dirty: a round failed after its LMOVEs may have run, so the staging
	// lists may hold messages nobody recorded; the next round takes them.
	dirty bool
	lens  map[string]int64 // last LLEN of each source list
	known bool             // lens holds every list of the last round

	mu    sync.Mutex
	lists []string // source list keys; staging list i holds lists[i]'s
	index map[string]int
}

func newStager(t *Transport) *stager {
	return &stager{t: t, id: newTag(), lens: map[string]int64{}, index: map[string]int{}}
}

func (s *stager) registry() string { return s.t.keys.prefix + stagedRegistry }

func (s *stager) fence() string { return stagedFence(s.t.keys.prefix, s.id) }

func stagedFence(prefix, id string) string {
	return prefix + stagedRegistry + "." + id + ".fence"
}

func stagedList(prefix, id string, i int) string {
	return prefix + stagedRegistry + "." + id + "." + strconv.Itoa(i)
}

// staging returns the index of a source list's staging list, registering
// the source the first time (and beating at once, so that a sweeper knows the
// list before anything is staged in it).
func (s *stager) staging(ctx context.Context, src string) (int, error) {
	s.mu.Lock()
	i, ok := s.index[src]
	if !ok {
		i = len(s.lists)
		s.lists = append(s.lists, src)
		s.index[src] = i
	}
	s.mu.Unlock()
	if !ok {
		if err := s.beat(ctx); err != nil {
			return 0, err
		}
	}
	return i, nil
}

// beat writes the consumer's registry entry.
func (s *stager) beat(ctx context.Context) error {
	s.mu.Lock()
	b, _ := json.Marshal(stagedBeat{At: time.Now().UnixMilli(), Lists: s.lists})
	s.mu.Unlock()
	return s.t.rdb.HSet(ctx, s.registry(), s.id, b).Err()
}

// step is part of a round's plan: take n messages from list src, of
// queue.
type step struct {
	queue, src string
	n          int
}

// plan returns the LMOVEs that take up to n messages from the queues in
// kombu's order (the consume script's: priority band first, then the
// queues in cycle order, rotated after each message with round_robin),
// as far as the last known list lengths tell.
func (s *stager) plan(order []string, n int) []step {
	k := s.t.keys
	var out []step
	add := func(q, src string) {
		if l := len(out); l > 0 && out[l-1].src == src {
			out[l-1].n++
			return
		}
		out = append(out, step{queue: q, src: src, n: 1})
	}
	left := map[string]int64{}
	for _, q := range order {
		for _, b := range k.steps {
			src := k.prefix + k.queueBand(q, b)
			left[src] = s.lens[src]
		}
	}
	cycle := append([]string(nil), order...)
	rotate := s.t.cfg.QueueOrderStrategy == RoundRobin
	for range n {
		found := false
		for _, b := range k.steps {
			for oi, q := range cycle {
				src := k.prefix + k.queueBand(q, b)
				if left[src] > 0 {
					left[src]--
					add(q, src)
					if rotate && len(cycle) > 1 {
						cycle = append(append(cycle[:oi:oi], cycle[oi+1:]...), q)
					}
					found = true
					break
				}
			}
			if found {
				break
			}
		}
		if !found {
			break
		}
	}
	return out
}

// moved is one message a round took, in pop order.
type moved struct {
	queue string
	i     int // staging list
	raw   string
}

// pop runs one round over the quotas: a plan from the last list lengths
// if they show messages, else a blocking wait of up to wait on the first
// list of the first quota. It returns the messages recorded in unacked.
func (s *stager) pop(qs []quota, wait time.Duration, stop <-chan struct{}) ([]popped, error) {
	ctx := context.Background()
	if s.conn == nil {
		s.conn = s.t.rdb.Conn()
		s.watching = false
	}
	if s.dirty {
		ps, err := s.recover(ctx)
		if err != nil {
			s.fail()
			return nil, err
		}
		s.dirty = false
		if len(ps) > 0 {
			return ps, nil
		}
	}
	var steps []step
	if s.known {
		for _, q := range qs {
			steps = append(steps, s.plan(q.queues, q.n)...)
		}
	}
	var all []string // every list of every quota, for the lengths
	for _, q := range qs {
		all = append(all, s.t.keys.consumeOrder(q.queues)...)
	}
	block := len(steps) == 0
	if block {
		select {
		case <-stop:
			return nil, nil
		default:
		}
		wait = min(wait, maxPipelinedWait)
		if len(all) > 1 {
			wait = min(wait, idlePoll)
		}
		steps = []step{{queue: s.t.keys.queueOfKey(all[0]), src: all[0], n: 1}}
	}
	type lmove struct {
		cmd   *goredis.StringCmd
		queue string
		i     int
	}
	var (
		moves  []lmove
		used   = map[int]bool{}
		order  []int // staging lists used, in first-use order
		lenCmd []*goredis.IntCmd
	)
	for _, st := range steps {
		i, err := s.staging(ctx, st.src)
		if err != nil {
			return nil, err
		}
		if !used[i] {
			used[i] = true
			order = append(order, i)
		}
	}
	stagingLen := map[int]*goredis.IntCmd{}
	_, err := s.conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
		if s.watching {
			p.Do(ctx, "UNWATCH")
		}
		for _, st := range steps {
			i := s.index[st.src]
			dst := stagedList(s.t.keys.prefix, s.id, i)
			for range st.n {
				var c *goredis.StringCmd
				if block {
					// go-redis's BLMove rounds its timeout to whole
					// seconds; the server takes fractions.
					c = goredis.NewStringCmd(ctx, "BLMOVE", st.src, dst, "RIGHT", "LEFT",
						strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
					_ = p.Process(ctx, c)
				} else {
					c = p.LMove(ctx, st.src, dst, "RIGHT", "LEFT")
				}
				moves = append(moves, lmove{cmd: c, queue: st.queue, i: i})
			}
		}
		for _, l := range all {
			lenCmd = append(lenCmd, p.LLen(ctx, l))
		}
		p.Do(ctx, "WATCH", s.fence())
		for _, i := range order {
			stagingLen[i] = p.LLen(ctx, stagedList(s.t.keys.prefix, s.id, i))
		}
		return nil
	})
	s.watching = true
	if err == nil || errors.Is(err, goredis.Nil) {
		// Nil is an empty list's LMOVE; any other error (a key that is
		// not a list, say) fails the round rather than pass for empty.
		err = nil
		for _, m := range moves {
			if e := m.cmd.Err(); !errors.Is(e, goredis.Nil) {
				err = cmp.Or(err, e)
			}
		}
		for _, c := range lenCmd {
			err = cmp.Or(err, c.Err())
		}
		for _, c := range stagingLen {
			err = cmp.Or(err, c.Err())
		}
	}
	if err != nil {
		// The LMOVEs may have run: the next round records what they left.
		s.fail()
		return nil, err
	}
	for i, l := range all {
		s.lens[l] = lenCmd[i].Val()
	}
	s.known = true
	var ms []moved
	count := map[int]int{}
	for _, m := range moves {
		v, err := m.cmd.Result()
		if err != nil {
			continue // nil: the list was empty
		}
		ms = append(ms, moved{queue: m.queue, i: m.i, raw: v})
		count[m.i]++
	}
	if len(ms) == 0 {
		return nil, nil
	}
	// A sweep between the LMOVEs and the WATCH put back the oldest of a
	// staging list's messages: keep only what is still there.
	keep := map[int]int{}
	for _, i := range order {
		n := int(stagingLen[i].Val())
		if n > count[i] {
			// More than this round moved: an earlier round's messages
			// are there too. Record them all from the lists themselves.
			s.dirty = true
			return nil, nil
		}
		keep[i] = n
	}
	skip := map[int]int{}
	for i := range count {
		skip[i] = count[i] - keep[i]
	}
	kept := ms[:0]
	for _, m := range ms {
		if skip[m.i] > 0 {
			skip[m.i]--
			continue
		}
		kept = append(kept, m)
	}
	if h := s.t.stagedHook; h != nil {
		h(s.id)
	}
	return s.record(ctx, kept, order)
}

// fail drops the connection after an error: the WATCH on it, if any, goes
// with it, and the next round starts on a new one and takes what the
// staging lists hold.
func (s *stager) fail() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
	s.watching = false
	s.dirty = true
}

// record writes kombu's records of the staged messages and empties the
// staging lists in one transaction, under the WATCH of the fence: if a
// sweeper put the messages back meanwhile, nothing is written and nothing
// is returned. Undecodable messages go to their queue's dead-letter list
// in the same transaction.
func (s *stager) record(ctx context.Context, ms []moved, staging []int) ([]popped, error) {
	now := time.Now()
	at := scoreFloat(now)
	out := make([]popped, 0, len(ms))
	hset := make([]any, 0, 2*len(ms))
	zadd := make([]goredis.Z, 0, len(ms))
	type dead struct {
		list string
		item []byte
		id   string
		err  error
	}
	var deads []dead
	for _, m := range ms {
		raw := stringBytes(m.raw)
		tag, ex, rk, err := quickMeta(raw)
		if err != nil {
			id := newTag()
			env, _ := appendJSONString(raw)
			d, _ := encodeDeadItem(&deadItem{
				ID: id, Envelope: env, Queue: m.queue, Reason: "undecodable", Error: err.Error(),
				Time: timeJSON(now),
			})
			deads = append(deads, dead{list: s.t.keys.deadList(m.queue), item: d, id: id, err: err})
			continue
		}
		if rk == "" {
			rk = m.queue
		}
		hset = append(hset, tag, unackedValue(raw, ex, rk))
		zadd = append(zadd, goredis.Z{Score: at, Member: tag})
		out = append(out, popped{queue: m.queue, tag: tag, exchange: ex, routingKey: rk, raw: raw})
	}
	_, err := s.conn.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		if len(hset) > 0 {
			p.HSet(ctx, s.t.keys.unacked, hset...)
			p.ZAdd(ctx, s.t.keys.unackedIndex, zadd...)
		}
		for _, d := range deads {
			p.RPush(ctx, d.list, d.item)
		}
		ks := make([]string, 0, len(staging))
		for _, i := range staging {
			ks = append(ks, stagedList(s.t.keys.prefix, s.id, i))
		}
		p.Del(ctx, ks...)
		return nil
	})
	s.watching = false
	switch {
	case errors.Is(err, goredis.TxFailedErr):
		// The sweeper also removed this consumer's registry entry: beat
		// again at once, so that a death now still leaves a trace.
		_ = s.beat(ctx)
		s.t.log.Warn("redis: a sweeper put back staged messages of this consumer (its heartbeat was late); they are delivered again",
			zap.Int("count", len(ms)))
		return nil, nil
	case err != nil:
		s.fail()
		return nil, err
	}
	for _, d := range deads {
		s.t.log.Error("redis: undecodable message moved to the dead-letter list",
			zap.String("dead_list", d.list), zap.Error(d.err), zap.String("dead_id", d.id))
	}
	return out, nil
}

// recover records whatever the staging lists hold after a failed round.
func (s *stager) recover(ctx context.Context) ([]popped, error) {
	s.mu.Lock()
	n := len(s.lists)
	srcs := append([]string(nil), s.lists...)
	s.mu.Unlock()
	if n == 0 {
		return nil, nil
	}
	ranges := make([]*goredis.StringSliceCmd, n)
	_, err := s.conn.Pipelined(ctx, func(p goredis.Pipeliner) error {
		if s.watching {
			p.Do(ctx, "UNWATCH")
		}
		p.Do(ctx, "WATCH", s.fence())
		for i := range n {
			ranges[i] = p.LRange(ctx, stagedList(s.t.keys.prefix, s.id, i), 0, -1)
		}
		return nil
	})
	s.watching = true
	if err != nil {
		return nil, err
	}
	var ms []moved
	var staging []int
	for i := range n {
		vs := ranges[i].Val()
		if len(vs) == 0 {
			continue
		}
		staging = append(staging, i)
		q := s.t.keys.queueOfKey(srcs[i])
		// The newest is on the left: pop order is right to left.
		for j := len(vs) - 1; j >= 0; j-- {
			ms = append(ms, moved{queue: q, i: i, raw: vs[j]})
		}
	}
	if len(ms) == 0 {
		return nil, nil
	}
	return s.record(ctx, ms, staging)
}

// close ends the consumer's staging: what its lists still hold goes back
// to the front of their source lists, and its registry entry and fence
// go.
func (s *stager) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
	s.mu.Lock()
	lists := append([]string(nil), s.lists...)
	s.mu.Unlock()
	err := s.t.retry(ctx, func() error {
		_, err := s.t.putBack(ctx, s.id, lists, 0)
		return err
	})
	if err != nil {
		s.t.log.Error("redis: could not put back this consumer's staged messages; a sweeper does once its heartbeat is old",
			zap.String("consumer", s.id), zap.Error(err))
	}
}

// putBack moves a consumer's staged messages back to the front of their
// source lists, in their order, changes its fence and removes its
// registry entry, in one transaction that fails if a staging list
// changed meanwhile. With staleBefore non-zero it does so only if the
// consumer's heartbeat is older than that (unix ms). It returns how many
// messages went back.
func (t *Transport) putBack(ctx context.Context, id string, lists []string, staleBefore int64) (int, error) {
	prefix := t.keys.prefix
	ks := make([]string, len(lists))
	for i := range lists {
		ks[i] = stagedList(prefix, id, i)
	}
	n := 0
	fn := func(tx *goredis.Tx) error {
		if staleBefore != 0 {
			v, err := tx.HGet(ctx, prefix+stagedRegistry, id).Bytes()
			if err != nil && !errors.Is(err, goredis.Nil) {
				return err
			}
			var b stagedBeat
			if err == nil && json.Unmarshal(v, &b) == nil && b.At >= staleBefore {
				return nil // it beat meanwhile
			}
		}
		ranges := make([]*goredis.StringSliceCmd, len(ks))
		if _, err := tx.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range ks {
				ranges[i] = p.LRange(ctx, k, 0, -1)
			}
			return nil
		}); err != nil {
			return err
		}
		n = 0
		_, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.Incr(ctx, stagedFence(prefix, id))
			for i, r := range ranges {
				// Newest on the left: pushing left to right onto the front
				// leaves the oldest at the very front.
				for _, v := range r.Val() {
					p.RPush(ctx, lists[i], v)
					n++
				}
			}
			if len(ks) > 0 {
				p.Del(ctx, ks...)
			}
			p.Del(ctx, stagedFence(prefix, id))
			p.HDel(ctx, prefix+stagedRegistry, id)
			return nil
		})
		return err
	}
	err := t.rdb.Watch(ctx, fn, ks...)
	if errors.Is(err, goredis.TxFailedErr) {
		return 0, nil // the consumer is alive after all: it moved
	}
	return n, err
}

// SweepStaged puts back the staged messages of every consumer whose
// heartbeat is older than Config.StagedLease (see Config.StagedPop), and
// returns how many went back. Entries that cannot be read are left alone.
func (t *Transport) SweepStaged(ctx context.Context) (int, error) {
	entries, err := t.rdb.HGetAll(ctx, t.keys.prefix+stagedRegistry).Result()
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-t.cfg.StagedLease).UnixMilli()
	total := 0
	var errs []error
	for id, v := range entries {
		var b stagedBeat
		if err := json.Unmarshal([]byte(v), &b); err != nil || b.At >= cutoff {
			continue
		}
		n, err := t.putBack(ctx, id, b.Lists, cutoff)
		if err != nil {
			errs = append(errs, fmt.Errorf("consumer %s: %w", id, err))
			continue
		}
		if n > 0 {
			t.log.Warn("redis: put back the staged messages of a consumer whose heartbeat stopped",
				zap.String("consumer", id), zap.Int("count", n), zap.Time("last_beat", time.UnixMilli(b.At)))
		}
		total += n
	}
	return total, errors.Join(errs...)
}

// StagedLen is the package's StagedLen on this transport's Redis and key
// prefix.
func (t *Transport) StagedLen(ctx context.Context) (int64, error) {
	return StagedLen(ctx, t.rdb, t.keys.prefix)
}

// stagedHeartbeat beats for every staged consumer and sweeps the dead.
func (t *Transport) stagedHeartbeat() {
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.StagedLease/2)
	defer cancel()
	t.mu.Lock()
	var ss []*stager
	for c := range t.consumers {
		if c.stage != nil {
			ss = append(ss, c.stage)
		}
	}
	t.mu.Unlock()
	for _, s := range ss {
		if err := s.beat(ctx); err != nil {
			t.logError(&t.bgErrLimits, "redis: staged consumer heartbeat failed", err)
		}
	}
	if _, err := t.SweepStaged(ctx); err != nil {
		t.logError(&t.bgErrLimits, "redis: staged sweep failed", err)
	}
}

// quickMeta reads delivery tag, exchange and routing key the way the
// consume script does: a plain search when each occurs once after the
// properties key, else a full decode.
func quickMeta(raw []byte) (tag, exchange, routingKey string, err error) {
	from := 0
	for _, pat := range [][]byte{[]byte(`"properties": {`), []byte(`"properties":{`)} {
		if i := bytes.Index(raw, pat); i >= 0 {
			if !bytes.Contains(raw[i+len(pat):], []byte(`"properties"`)) {
				from = i + len(pat)
			}
			break
		}
	}
	if tag, ok := fastField(raw, "delivery_tag", from); ok && tag != "" {
		ex, ok1 := fastField(raw, "exchange", from)
		rk, ok2 := fastField(raw, "routing_key", from)
		if ok1 && ok2 {
			return tag, ex, rk, nil
		}
	}
	m, err := parseMeta(raw)
	if err != nil {
		return "", "", "", err
	}
	return m.Tag, m.Exchange, m.RoutingKey, nil
}

// fastField reads the string value of "name" when its key occurs exactly
// once from from on and the value holds no escapes.
func fastField(raw []byte, name string, from int) (string, bool) {
	b := raw[from:]
	for _, pat := range []string{`"` + name + `": "`, `"` + name + `":"`} {
		i := bytes.Index(b, []byte(pat))
		if i < 0 {
			continue
		}
		rest := b[i+len(pat):]
		if bytes.Contains(rest, []byte(pat)) {
			return "", false
		}
		q := bytes.IndexByte(rest, '"')
		if q < 0 {
			return "", false
		}
		v := rest[:q]
		if bytes.IndexByte(v, '\\') >= 0 {
			return "", false
		}
		return string(v), true
	}
	return "", false
}

// StagedLen returns how many messages the staging lists of every staged
// consumer (Config.StagedPop) hold on the Redis c, under a global key
// prefix: messages taken from their queues and not yet recorded in
// kombu's unacked, which neither LLEN of a queue nor HLEN of unacked
// counts.
func StagedLen(ctx context.Context, c goredis.Cmdable, globalKeyPrefix string) (int64, error) {
	entries, err := c.HGetAll(ctx, globalKeyPrefix+stagedRegistry).Result()
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	var cmds []*goredis.IntCmd
	_, err = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for id, v := range entries {
			var b stagedBeat
			if json.Unmarshal([]byte(v), &b) != nil {
				continue
			}
			for i := range b.Lists {
				cmds = append(cmds, p.LLen(ctx, stagedList(globalKeyPrefix, id, i)))
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
