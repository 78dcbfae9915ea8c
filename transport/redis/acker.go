package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/internal/commit"
)

// acker batches acks (group commit): whatever acks arrive while one flush
// is in flight go out together in the next MULTI/EXEC. An ack that finds
// nothing in flight is written by its caller's goroutine, so an idle
// transport adds no hand-off (two goroutine wake-ups, a third of the ack's
// latency) to the round trip; acks that queue meanwhile get a goroutine of
// the acker's.
type acker struct {
	t       *Transport
	mu      sync.Mutex
	pending *ackBatch
	leading bool // a goroutine is writing; acks queue in pending
	closed  bool // after the final flush: acks are refused
	direct  sync.WaitGroup
	leaders sync.WaitGroup
}

type ackBatch struct {
	tags []string
	out  *commit.Outcome
}

func newAckBatch() *ackBatch { return &ackBatch{out: commit.NewOutcome()} }

func (b *ackBatch) wait(ctx context.Context) error { return b.out.Wait(ctx) }

func newAcker(t *Transport) *acker {
	return &acker{t: t, pending: newAckBatch()}
}

func (a *acker) ack(ctx context.Context, tag string) error {
	a.mu.Lock()
	if a.closed {
		// Close raced with this ack: the message stays in unacked and comes
		// back after the visibility timeout (at least once, never lost).
		a.mu.Unlock()
		return transport.ErrClosed
	}
	b := a.pending
	b.tags = append(b.tags, tag)
	if a.leading {
		a.mu.Unlock()
		return b.wait(ctx)
	}
	a.leading = true
	a.pending = newAckBatch()
	a.direct.Add(1)
	a.mu.Unlock()
	defer a.direct.Done()
	err := a.write(b)
	if err != nil && isRetryable(err) {
		// Retries back off: they belong to the acker, and the caller waits
		// only as long as its ctx allows (the ack is still applied).
		a.leaders.Go(func() {
			a.retry(b, err, a.t.stop)
			a.lead()
		})
		return b.wait(ctx)
	}
	a.finish(b, err)
	a.mu.Lock()
	if len(a.pending.tags) > 0 {
		a.leaders.Go(a.lead)
	} else {
		a.leading = false
	}
	a.mu.Unlock()
	return b.out.Err()
}

// ackAsync queues an ack for a goroutine of the acker's to write and
// returns its batch.
func (a *acker) ackAsync(tag string) (*ackBatch, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, transport.ErrClosed
	}
	b := a.pending
	b.tags = append(b.tags, tag)
	if !a.leading {
		a.leading = true
		a.leaders.Go(a.lead)
	}
	return b, nil
}

// lead writes queued acks until there are none left, then gives up the
// lead.
func (a *acker) lead() {
	for {
		a.mu.Lock()
		if len(a.pending.tags) == 0 {
			a.leading = false
			a.mu.Unlock()
			return
		}
		b := a.pending
		a.pending = newAckBatch()
		a.mu.Unlock()
		a.flush(b, a.t.stop)
	}
}

// close refuses further acks and waits until the queued ones are written:
// acks queued before Close still count.
func (a *acker) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.direct.Wait()
	a.leaders.Wait()
}

// flush writes a batch, retrying, and reports to its waiters.
func (a *acker) flush(b *ackBatch, stop <-chan struct{}) {
	if len(b.tags) == 0 {
		b.out.Report(nil)
		return
	}
	err := a.write(b)
	if err != nil && isRetryable(err) {
		a.retry(b, err, stop)
		return
	}
	a.finish(b, err)
}

// write is one attempt: ZREM + HDEL of the batch's tags in one MULTI/EXEC,
// then WAIT on the same connection with Config.WaitReplicas.
func (a *acker) write(b *ackBatch) error {
	ctx := context.Background()
	var tx interface {
		TxPipelined(context.Context, func(goredis.Pipeliner) error) ([]goredis.Cmder, error)
	} = a.t.rdb
	var cn *goredis.Conn
	if a.t.cfg.WaitReplicas > 0 {
		cn = a.t.rdb.Conn()
		defer cn.Close()
		tx = cn
	}
	_, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for i := 0; i < len(b.tags); i += 1000 {
			chunk := b.tags[i:min(i+1000, len(b.tags))]
			members := make([]any, len(chunk))
			for j, tag := range chunk {
				members[j] = tag
			}
			p.ZRem(ctx, a.t.keys.unackedIndex, members...)
			p.HDel(ctx, a.t.keys.unacked, chunk...)
		}
		return nil
	})
	if err == nil && cn != nil {
		a.t.waitReplicated(ctx, cn, "acks", len(b.tags))
	}
	return err
}

// finish reports a batch's outcome to its waiters.
func (a *acker) finish(b *ackBatch, err error) {
	if err != nil {
		a.t.log.Error("redis: acks failed; the messages stay unacked and come back after the visibility timeout",
			zap.Int("count", len(b.tags)), zap.Error(err))
		err = fmt.Errorf("redis: ack: %w", err)
	}
	b.out.Report(err)
}

// retry writes a batch whose first attempt failed with err, backing off
// between attempts (fully, even once the transport stops: the final acks
// matter most).
func (a *acker) retry(b *ackBatch, err error, stop <-chan struct{}) {
	for attempt := 0; ; attempt++ {
		if !isRetryable(err) || attempt >= 10 {
			a.finish(b, err)
			return
		}
		a.t.logError(&a.t.errLimiter, "redis: ack failed; retrying", err, zap.Int("count", len(b.tags)))
		if stop == nil {
			time.Sleep(a.t.backoff(attempt))
		} else if !sleep(stop, a.t.backoff(attempt)) {
			stop = nil
		}
		if err = a.write(b); err == nil {
			a.finish(b, nil)
			return
		}
	}
}
