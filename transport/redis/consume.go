package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Consume binds the queues as kombu does (SADD to _kombu.binding.<exchange>)
// and starts delivering their messages. Fanout queues are refused: use
// Subscribe. The first Consume also starts the restore sweep and the
// visibility renewal.
func (t *Transport) Consume(ctx context.Context, queues []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("redis: negative prefetch %d", opts.Prefetch)
	}
	for _, q := range queues {
		if err := validQueue(q); err != nil {
			return nil, err
		}
	}
	if t.isClosed() {
		return nil, transport.ErrClosed
	}
	for _, q := range queues {
		if err := t.bind(ctx, q); err != nil {
			return nil, fmt.Errorf("redis: bind %q: %w", q.Name, err)
		}
	}
	c := &consumer{
		t:        t,
		out:      make(chan *transport.Delivery),
		prefetch: opts.Prefetch,
		perQueue: opts.PerQueuePrefetch,
		byQueue:  map[string]int{},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if t.cfg.StagedPop && t.rpopCount {
		c.stage = newStager(t)
	}
	for _, q := range queues {
		c.addQueue(q)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, transport.ErrClosed
	}
	t.consumers[c] = struct{}{}
	if !t.bgStarted {
		t.bgStarted = true
		t.wg.Go(t.background)
	}
	t.wg.Go(c.run)
	t.mu.Unlock()
	return c, nil
}

func validQueue(q transport.Queue) error {
	if q.Name == "" {
		return errors.New("redis: queue without a name")
	}
	switch q.ExchangeType {
	case "", transport.Direct, transport.Topic:
		return nil
	case transport.Fanout:
		return fmt.Errorf("redis: queue %q is bound to a fanout exchange: use Subscribe", q.Name)
	default:
		return fmt.Errorf("redis: queue %q: unknown exchange type %q", q.Name, q.ExchangeType)
	}
}

// consumer is one Consume call: a goroutine that pops batches within the
// free prefetch and hands deliveries out.
type consumer struct {
	t    *Transport
	out  chan *transport.Delivery
	wake chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once

	// handing counts the batches given to handOut and not yet handed out.
	handing atomic.Int32
	// stage is the staged pop (Config.StagedPop); nil for the script's.
	stage *stager

	mu          sync.Mutex
	queues      []transport.Queue
	order       []string // queue names in the cycle order
	prefetch    int
	outstanding int
	// perQueue is ConsumeOptions.PerQueuePrefetch: each queue with room
	// costs its own pop. byQueue counts the outstanding messages of each
	// queue then.
	perQueue bool
	byQueue  map[string]int
	err      error
}

func (c *consumer) addQueue(q transport.Queue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.ContainsFunc(c.queues, func(x transport.Queue) bool { return x.Name == q.Name }) {
		return
	}
	c.queues = append(c.queues, q)
	c.order = append(c.order, q.Name)
	if c.t.cfg.QueueOrderStrategy == Sorted {
		slices.Sort(c.order)
	}
}

func (c *consumer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Deliveries implements transport.Consumer.
func (c *consumer) Deliveries() <-chan *transport.Delivery { return c.out }

// SetPrefetch implements transport.Consumer.
func (c *consumer) SetPrefetch(n int) error {
	if n < 0 {
		return fmt.Errorf("redis: negative prefetch %d", n)
	}
	c.mu.Lock()
	c.prefetch = n
	c.mu.Unlock()
	c.signal()
	return nil
}

// AddQueue implements transport.Consumer.
func (c *consumer) AddQueue(ctx context.Context, q transport.Queue) error {
	if err := validQueue(q); err != nil {
		return err
	}
	if c.t.isClosed() {
		return transport.ErrClosed
	}
	if err := c.t.bind(ctx, q); err != nil {
		return fmt.Errorf("redis: bind %q: %w", q.Name, err)
	}
	c.addQueue(q)
	c.signal()
	return nil
}

// CancelQueue implements transport.Consumer. kombu keeps the binding; so
// does this transport.
func (c *consumer) CancelQueue(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queues = slices.DeleteFunc(c.queues, func(q transport.Queue) bool { return q.Name == name })
	c.order = slices.DeleteFunc(c.order, func(n string) bool { return n == name })
	return nil
}

// Queues implements transport.Consumer.
func (c *consumer) Queues() []transport.Queue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.queues)
}

// Stop implements transport.Consumer: no more pops; messages popped but not
// yet handed out are restored to the front of their queues.
func (c *consumer) Stop(ctx context.Context) error {
	c.once.Do(func() { close(c.stop) })
	select {
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.t.mu.Lock()
	delete(c.t.consumers, c)
	c.t.mu.Unlock()
	return nil
}

// halt stops the consumer for good with err and waits for its goroutine.
func (c *consumer) halt(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.once.Do(func() { close(c.stop) })
	<-c.done
}

// Err implements transport.Consumer.
func (c *consumer) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// quota is one pop: up to n messages from queues.
type quota struct {
	queues []string
	n      int
}

// quotas plans the next pops: one over every queue within the shared free
// prefetch, or with ConsumeOptions.PerQueuePrefetch one per queue with room, in
// consume order.
func (c *consumer) quotas() []quota {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.order) == 0 {
		return nil
	}
	n := c.t.cfg.BatchSize
	if !c.perQueue {
		if c.prefetch > 0 {
			n = min(n, c.prefetch-c.outstanding)
		}
		if n <= 0 {
			return nil
		}
		return []quota{{queues: slices.Clone(c.order), n: n}}
	}
	var qs []quota
	for _, q := range c.order {
		m := n
		if c.prefetch > 0 {
			m = min(m, c.prefetch-c.byQueue[q])
		}
		if m > 0 {
			qs = append(qs, quota{queues: []string{q}, n: m})
		}
	}
	return qs
}

func (c *consumer) acquire(msgs []popped) {
	c.mu.Lock()
	c.outstanding += len(msgs)
	if c.perQueue {
		for i := range msgs {
			c.byQueue[msgs[i].queue]++
		}
	}
	c.mu.Unlock()
}

func (c *consumer) release(queue string) {
	c.mu.Lock()
	c.outstanding--
	if c.perQueue {
		c.byQueue[queue]--
	}
	c.mu.Unlock()
	c.signal()
}

// consumes reports whether the queue is still consumed.
func (c *consumer) consumes(queue string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.order, queue)
}

// rotate moves a queue to the end of the order after a message was taken
// from it (kombu's round_robin_cycle.rotate).
func (c *consumer) rotate(queue string) {
	if c.t.cfg.QueueOrderStrategy != RoundRobin {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.order, queue); i >= 0 {
		c.order = append(slices.Delete(c.order, i, i+1), queue)
	}
}

// popped is one message taken off a list and recorded in unacked.
type popped struct {
	queue, tag, exchange, routingKey string
	// raw is the envelope as Redis returned it. It may share memory with
	// an immutable string (see stringBytes): never write to it.
	raw []byte
}

// stringBytes returns s's bytes without copying them. The popped
// envelopes are only ever read (decoded, pushed back, dead-lettered), and
// copying each one out of go-redis's reply string cost a tenth of the
// bytes a drain allocates.
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// run is the consumer's fetch loop. Popping and handing out overlap: a
// second goroutine decodes and hands out one batch while the next is
// popped, within the free prefetch.
func (c *consumer) run() {
	defer close(c.done)
	batches := make(chan []*held, 2)
	var dwg sync.WaitGroup
	dwg.Go(func() { c.handOut(batches) })
	defer func() {
		close(batches)
		dwg.Wait()
		if c.stage != nil {
			c.stage.close()
		}
		close(c.out)
	}()
	attempt := 0
	exhausted := false
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		qs := c.quotas()
		if len(qs) == 0 {
			select {
			case <-c.wake:
			case <-c.stop:
				return
			}
			continue
		}
		var msgs []popped
		var err error
		if c.stage != nil {
			msgs, err = c.stage.pop(qs, c.t.cfg.BRPOPTimeout, c.stop)
		} else {
			if !exhausted {
				// Fewer than asked for from every pop: every list was empty
				// when the script ran, so the next step is to wait (BLMOVE
				// answers at once if a message came meanwhile), not another
				// pop that would find nothing and cost an idle consumer a
				// script call per message.
				exhausted = true
				for _, q := range qs {
					var m []popped
					if m, err = c.t.popBatch(q.queues, q.n); err != nil {
						break
					}
					msgs = append(msgs, m...)
					exhausted = exhausted && len(m) < q.n
				}
				if err != nil && len(msgs) > 0 {
					// Earlier pops of this round are recorded in unacked:
					// hold them now (the error comes back on the next pop).
					err, exhausted = nil, false
				}
				exhausted = exhausted && err == nil
			}
			if err == nil && len(msgs) == 0 {
				// Wait on all the queues with room, for as many messages as
				// the smallest room allows.
				order, n := qs[0].queues, qs[0].n
				if len(qs) > 1 {
					order = nil
					for _, q := range qs {
						order = append(order, q.queues...)
						n = min(n, q.n)
					}
				}
				exhausted = false
				if c.t.rpopCount {
					msgs, err = c.t.awaitPop(order, n)
					exhausted = err == nil && len(msgs) < n
				} else {
					var m *popped
					m, err = c.t.blockingPop(order, c.stop)
					if m != nil {
						msgs = []popped{*m}
					}
				}
			}
		}
		if err != nil {
			c.t.logError(&c.t.errLimiter, "redis: consume failed; retrying", err, zap.Int("attempt", attempt))
			if !sleep(c.stop, c.t.backoff(attempt)) {
				return
			}
			attempt++
			continue
		}
		if attempt > 0 {
			c.t.log.Info("redis: consuming again after a broker error", zap.Int("failed_attempts", attempt))
		}
		attempt = 0
		if len(msgs) == 0 {
			continue
		}
		c.acquire(msgs)
		hs := make([]*held, 0, len(msgs))
		var cancelled []*held
		for i := range msgs {
			c.rotate(msgs[i].queue)
			h := c.t.hold(c, &msgs[i])
			if c.consumes(h.queue) {
				hs = append(hs, h)
			} else {
				cancelled = append(cancelled, h)
			}
		}
		if len(cancelled) > 0 {
			// Popped from a queue cancelled meanwhile (kombu defers the
			// cancel until the read is over): back to the front.
			c.t.restoreUndelivered(cancelled)
		}
		if len(hs) == 0 {
			continue
		}
		if len(hs) <= directBatch && c.handing.Load() == 0 {
			// handOut is idle (this goroutine is the only one that gives it
			// work), so nothing is ahead of these in order: hand them out
			// here and spare a goroutine wake-up, which an idle consumer's
			// first message would otherwise wait for.
			if !c.deliver(hs) {
				return
			}
			runtime.Gosched()
			continue
		}
		c.handing.Add(1)
		select {
		case batches <- hs:
		case <-c.stop:
			c.handing.Add(-1)
			c.t.restoreUndelivered(hs)
			return
		}
	}
}

// directBatch is the largest batch the fetch loop hands out itself when
// handOut is idle; a larger one is worth overlapping with the next pop.
const directBatch = 16

// handOut decodes popped messages and hands them out in order. Once the
// consumer stops, what was not handed out is restored.
func (c *consumer) handOut(batches <-chan []*held) {
	stopped := false
	for hs := range batches {
		if stopped {
			c.t.restoreUndelivered(hs)
		} else if !c.deliver(hs) {
			stopped = true
		}
		c.handing.Add(-1)
	}
}

// deliver hands held messages out. It returns false when the consumer
// stopped; messages not handed out are then restored.
func (c *consumer) deliver(hs []*held) bool {
	now := time.Now()
	for i, h := range hs {
		env, err := protocol.DecodeEnvelope(h.raw, c.t.cfg.Decode)
		if err != nil {
			c.t.deadLetterUndecodable(h, err)
			continue
		}
		d := &transport.Delivery{
			Message:      env.Message,
			Queue:        h.queue,
			Exchange:     h.exchange,
			RoutingKey:   h.routingKey,
			Redelivered:  env.DeliveryInfo.Redelivered || env.Message.Headers["redelivered"] == true,
			Tag:          h.tag,
			ReceivedAt:   now,
			Acknowledger: h,
		}
		select {
		case c.out <- d:
		case <-c.stop:
			c.t.restoreUndelivered(hs[i:])
			return false
		}
	}
	return true
}

// popBatch runs the consume script: up to n messages over the queues' bands
// in kombu's order, each recorded in unacked and unacked_index in the same
// atomic step.
func (t *Transport) popBatch(order []string, n int) ([]popped, error) {
	ks, args := t.consumeArgs(order, n)
	res, err := t.scrConsume.Run(context.Background(), t.rdb, ks, args...).Slice()
	if err != nil {
		if errors.Is(err, goredis.Nil) {
			return nil, nil
		}
		return nil, err
	}
	return t.parsePopped(order, res), nil
}

// consumeArgs returns the consume script's keys and arguments.
func (t *Transport) consumeArgs(order []string, n int) ([]string, []any) {
	nb := len(t.keys.steps)
	ks := make([]string, 0, 2+len(order)*(nb+1))
	ks = append(ks, t.keys.unacked, t.keys.unackedIndex)
	for _, q := range order {
		for _, s := range t.keys.steps {
			ks = append(ks, t.keys.prefix+t.keys.queueBand(q, s))
		}
	}
	for _, q := range order {
		ks = append(ks, t.keys.deadList(q))
	}
	rotate := "0"
	if t.cfg.QueueOrderStrategy == RoundRobin {
		rotate = "1"
	}
	rpopCount := "0"
	if t.rpopCount {
		rpopCount = "1"
	}
	args := make([]any, 0, 7+len(order))
	args = append(args, n, score(time.Now()), len(order), nb, rotate, newTag(), rpopCount)
	for _, q := range order {
		args = append(args, q)
	}
	return ks, args
}

// parsePopped reads the consume script's answer (and logs the undecodable
// items it dead-lettered).
func (t *Transport) parsePopped(order []string, res []any) []popped {
	out := make([]popped, 0, len(res)/5)
	for i := 0; i+4 < len(res); i += 5 {
		qi, _ := res[i].(int64)
		s := func(j int) string { v, _ := res[i+j].(string); return v }
		if qi < 0 {
			q := ""
			if int(-qi) <= len(order) {
				q = order[-qi-1]
			}
			t.log.Error("redis: undecodable message moved to the dead-letter list",
				zap.String("queue", q), zap.String("error", s(1)), zap.String("dead_id", s(2)),
				zap.String("dead_list", t.keys.deadList(q)))
			continue
		}
		if qi < 1 || int(qi) > len(order) {
			continue
		}
		out = append(out, popped{queue: order[qi-1], raw: stringBytes(s(1)), tag: s(2), exchange: s(3), routingKey: s(4)})
	}
	return out
}

// maxPipelinedWait bounds awaitPop's BLMOVE: the pipeline's answer is read
// under go-redis's ReadTimeout (3 s), not a blocking command's own.
const maxPipelinedWait = 2 * time.Second

// awaitPop waits for a message and takes it, on Redis >= 6.2. BRPOP
// removes a message from its list before the consumer can record it in
// unacked: a process killed, or a connection cut, between the two loses
// that message (the fault suite lost tasks to it). BLMOVE of a list onto
// itself, right end to right end, instead returns as soon as the list
// holds a message and leaves the list exactly as it was, so nothing is
// ever in flight outside Redis; the atomic consume script then takes the
// message. The script is pipelined behind BLMOVE on one connection, so
// Redis runs it the moment BLMOVE returns (or times out): an idle
// consumer's first message costs one round trip, as with BRPOP.
//
// BLMOVE watches a single list: the first in consume order (the default
// band of the first queue, where Celery's unprioritised tasks go), for
// BRPOPTimeout when it is the only list, else for at most idlePoll, so
// that messages on the other lists wait at most that long.
func (t *Transport) awaitPop(order []string, n int) ([]popped, error) {
	ks := t.keys.consumeOrder(order)
	if len(ks) == 0 {
		return nil, nil
	}
	wait := t.cfg.BRPOPTimeout
	if len(ks) > 1 {
		wait = min(wait, idlePoll)
	}
	wait = min(wait, maxPipelinedWait)
	keys, args := t.consumeArgs(order, n)
	ctx := context.Background()
	var pop *goredis.Cmd
	_, _ = t.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		// go-redis's BLMove rounds its timeout to whole seconds; the server
		// takes fractions.
		p.Do(ctx, "BLMOVE", ks[0], ks[0], "RIGHT", "RIGHT", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
		pop = t.scrConsume.EvalSha(ctx, p, keys, args...)
		return nil
	})
	res, err := pop.Slice()
	switch {
	case err == nil:
		return t.parsePopped(order, res), nil
	case errors.Is(err, goredis.Nil):
		return nil, nil
	case goredis.HasErrorPrefix(err, "NOSCRIPT"):
		// The script cache was flushed: the plain pop loads it again.
		return t.popBatch(order, n)
	}
	return nil, err
}

// idlePoll bounds how long an idle consumer of several lists waits on the
// first one before it polls them all again (see awaitPop).
const idlePoll = 100 * time.Millisecond

// blockingPop waits for a message when every list was empty, on Redis
// before 6.2 (no BLMOVE, see awaitPop): up to BRPOPTimeout in BRPOP
// (priority-major key order), and records the message in unacked as kombu
// does, with kombu's loss window between the pop and the record.
func (t *Transport) blockingPop(order []string, stop <-chan struct{}) (*popped, error) {
	ctx := context.Background()
	res, err := t.rdb.BRPop(ctx, t.cfg.BRPOPTimeout, t.keys.consumeOrder(order)...).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	key, item := res[0], []byte(res[1])
	queue := t.keys.queueOfKey(key)
	select {
	case <-stop:
		// Stopping: put the message back where it was, at the front.
		if err := t.rdb.RPush(ctx, key, item).Err(); err != nil {
			t.log.Error("redis: could not put back a message popped while stopping; it is lost",
				zap.String("queue", queue), zap.Error(err), zap.ByteString("envelope", item))
		}
		return nil, nil
	default:
	}
	meta, err := parseMeta(item)
	if err != nil {
		id := newTag()
		raw, _ := appendJSONString(item)
		d, _ := encodeDeadItem(&deadItem{
			ID: id, Envelope: raw, Queue: queue, Reason: "undecodable", Error: err.Error(),
			Time: timeJSON(time.Now()),
		})
		if err := t.rdb.RPush(ctx, t.keys.deadList(queue), d).Err(); err != nil {
			t.log.Error("redis: could not dead-letter an undecodable message; it is lost",
				zap.String("queue", queue), zap.Error(err), zap.ByteString("envelope", item))
			return nil, nil
		}
		t.log.Error("redis: undecodable message moved to the dead-letter list",
			zap.String("queue", queue), zap.Error(err), zap.String("dead_id", id))
		return nil, nil
	}
	rk := meta.RoutingKey
	if rk == "" {
		rk = queue
	}
	_, err = t.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.ZAdd(ctx, t.keys.unackedIndex, goredis.Z{Score: scoreFloat(time.Now()), Member: meta.Tag})
		p.HSet(ctx, t.keys.unacked, meta.Tag, unackedValue(item, meta.Exchange, rk))
		return nil
	})
	if err != nil {
		// Same window as kombu: popped but not recorded. Try to put it back
		// before giving up on it.
		if perr := t.rdb.RPush(ctx, key, item).Err(); perr != nil {
			t.log.Error("redis: message popped but neither recorded nor put back; it is lost",
				zap.String("queue", queue), zap.String("delivery_tag", meta.Tag), zap.Error(err))
		}
		return nil, err
	}
	return &popped{queue: queue, tag: meta.Tag, exchange: meta.Exchange, routingKey: rk, raw: item}, nil
}

func score(t time.Time) string { return strconv.FormatFloat(scoreFloat(t), 'f', 6, 64) }

func scoreFloat(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

func timeJSON(t time.Time) []byte {
	return []byte(`"` + t.UTC().Format(time.RFC3339Nano) + `"`)
}

func appendJSONString(b []byte) ([]byte, error) {
	return marshalJSON(string(b))
}
