package worker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// The consumer-progress watchdog (Config.ConsumerWatchdog). The transports
// notice a dead connection (heartbeats, read timeouts, PING health checks:
// docs/network-faults.md); the watchdog is the net under them, for a
// consumer that stays connected and still receives nothing: a consumer
// the broker cancelled without telling, a fetch loop wedged by a fault the
// link checks did not see. Celery has no such net: its workers stay up and
// idle (celery/celery #3201, #8091, #10205).
//
// Evidence of a stall is deliberately narrow, so that legitimate idleness
// never restarts anything: the worker has room (a free slot, nothing ready
// to dispatch, fewer unsettled messages than its prefetch window, which
// counts ETA and rate-limited tasks held in memory and acks still in
// flight), nothing was received for the watchdog period, and the broker
// counted ready messages in a consumed queue at two checks a quarter period
// apart. A queue cancelled with cancel_consumer is not consumed, so it is
// not asked about.

// watchdog is the loop's view of consuming progress.
type watchdog struct {
	every    time.Duration // the period; <= 0: off
	ticker   *time.Ticker
	last     time.Time // when the last delivery was received (or the consumer built)
	armed    time.Time // when a check first saw a stall (zero: none seen)
	querying bool      // a count of ready messages is in flight
	building bool      // a new consumer is being built
	// fruitless counts restarts since the last delivery: each doubles the
	// wait before the next.
	fruitless int
}

// reasonNoProgress is the restart reason for a stall.
const reasonNoProgress = "no-progress"

func (l *loop) startWatchdog(now time.Time) {
	l.wd.every = l.w.cfg.ConsumerWatchdog
	l.wd.last = now
	if l.wd.every <= 0 {
		return
	}
	if _, ok := l.w.tr.(transport.Admin); !ok {
		l.w.log.Info("consumer watchdog off: the transport cannot count ready messages")
		return
	}
	l.wd.ticker = time.NewTicker(max(l.wd.every/4, time.Millisecond))
}

func (l *loop) watchdogC() <-chan time.Time {
	if l.wd.ticker == nil {
		return nil
	}
	return l.wd.ticker.C
}

func (l *loop) stopWatchdog() {
	if l.wd.ticker != nil {
		l.wd.ticker.Stop()
		l.wd.ticker = nil
	}
}

// progressed records a delivery.
func (l *loop) progressed(now time.Time) {
	l.wd.last, l.wd.armed, l.wd.fruitless = now, time.Time{}, 0
}

// room reports whether the broker should be sending: a slot is free,
// nothing waits for one, and the prefetch window is not full of unsettled
// messages (running or settling, ready, held for an ETA or a rate limit).
func (l *loop) room() bool {
	if l.running >= l.concurrency || l.ready.len() > 0 {
		return false
	}
	if l.prefetchSet > 0 && l.tasks.count()+len(l.held)+len(l.awaiting) >= l.prefetchSet {
		return false
	}
	return true
}

// checkProgress runs on every watchdog tick.
func (l *loop) checkProgress(now time.Time) {
	wd := &l.wd
	if wd.querying || wd.building {
		return
	}
	if !l.room() {
		wd.armed = time.Time{}
		return
	}
	if now.Sub(wd.last) < wd.every<<min(wd.fruitless, 4) {
		return
	}
	var queues []string
	for _, q := range l.cons.Queues() {
		queues = append(queues, q.Name)
	}
	if len(queues) == 0 {
		wd.armed = time.Time{}
		return
	}
	admin := l.w.tr.(transport.Admin)
	wd.querying = true
	l.w.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ready := map[string]int{}
		var err error
		for _, q := range queues {
			var n int
			if n, err = admin.Len(ctx, q); err != nil {
				break
			}
			if n > 0 {
				ready[q] = n
			}
		}
		l.call(func() { l.progressReport(now, ready, err) })
	})
}

// progressReport weighs the broker's count of ready messages, asked for
// at asked.
func (l *loop) progressReport(asked time.Time, ready map[string]int, err error) {
	wd := &l.wd
	wd.querying = false
	if err != nil {
		// The link checks own a broker that does not answer.
		l.w.log.Debug("consumer watchdog: cannot count ready messages", zap.Error(err))
		wd.armed = time.Time{}
		return
	}
	if len(ready) == 0 || wd.last.After(asked) || !l.room() {
		wd.armed = time.Time{}
		return
	}
	if wd.armed.IsZero() {
		// One sighting may be a message published a moment ago: look again
		// at the next tick.
		wd.armed = asked
		return
	}
	l.restartConsumer(ready, time.Since(wd.last))
}

// restartConsumer builds a new consumer for the queues consumed now; the
// swap happens on the loop (swapConsumer) once it is built.
func (l *loop) restartConsumer(ready map[string]int, idle time.Duration) {
	w, wd := l.w, &l.wd
	wd.building, wd.armed = true, time.Time{}
	wd.fruitless++
	names := slices.Sorted(maps.Keys(ready))
	total := 0
	for _, n := range ready {
		total += n
	}
	cause := fmt.Errorf("consumer stalled: %d messages ready in %v, room for them, nothing received for %s; rebuilding the consumer",
		total, names, idle.Round(time.Second))
	w.consumerErr.Store(&cause)
	w.log.Warn("consumer made no progress; rebuilding it", zap.String("reason", reasonNoProgress),
		zap.Strings("queues", names), zap.Int("ready", total), zap.Duration("idle", idle),
		zap.Int("running", l.running), zap.Int("concurrency", l.concurrency), zap.Int("prefetch", l.prefetchSet))
	if o, ok := w.cfg.Observer.(ConsumerObserver); ok {
		o.ConsumerRestarted(reasonNoProgress)
	}
	queues := l.cons.Queues()
	opts := transport.ConsumeOptions{Prefetch: l.prefetch, PerQueuePrefetch: w.perQueue()}
	w.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cons, err := w.tr.Consume(ctx, queues, opts)
		cancel()
		if !l.call(func() { l.swapConsumer(cons, opts.Prefetch, err) }) && err == nil {
			l.retire(cons) // the loop ended meanwhile
		}
	})
}

// swapConsumer puts a newly built consumer in place of the stalled one,
// which is retired.
func (l *loop) swapConsumer(cons transport.Consumer, prefetch int, err error) {
	wd := &l.wd
	wd.building = false
	if err != nil {
		// Still stalled: the next ticks try again.
		l.w.log.Error("consumer watchdog: building a new consumer failed", zap.Error(err))
		return
	}
	old := l.cons
	l.cons, l.deliveries, l.prefetchSet = cons, cons.Deliveries(), prefetch
	wd.last = time.Now()
	l.w.consumerErr.Store(nil)
	l.w.log.Info("consumer rebuilt")
	l.retire(old)
}

// retire stops a replaced consumer and hands what it still delivers to the
// loop: those messages are ours until settled, and settle through the old
// consumer's acknowledger (transport.Consumer.Stop keeps them valid). Once
// the loop has ended they go back to the broker.
func (l *loop) retire(old transport.Consumer) {
	w := l.w
	w.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := old.Stop(ctx); err != nil {
			w.log.Warn("consumer watchdog: stopping the stalled consumer", zap.Error(err))
		}
	})
	w.bg.Go(func() {
		for {
			select {
			case d, ok := <-old.Deliveries():
				if !ok {
					return
				}
				select {
				case l.drained <- d:
					continue
				case <-l.done:
				}
				ctx, cancel := w.settleCtx()
				if err := d.Reject(ctx, true); err != nil {
					w.log.Warn("returning a message of a retired consumer failed; the broker will deliver it again",
						zap.String("delivery_tag", d.Tag), zap.Error(err))
				}
				cancel()
			case <-l.done:
				// What it still holds is unacknowledged: the broker delivers
				// it again once the consumer's channel or the transport closes.
				return
			}
		}
	})
}

// ConsumerHealth reports a stalled consumer being rebuilt by the watchdog
// (Config.ConsumerWatchdog), nil otherwise: for a readiness probe, next to
// the broker's and the result backend's own checks.
func (w *Worker) ConsumerHealth() error {
	if p := w.consumerErr.Load(); p != nil {
		return *p
	}
	return nil
}
