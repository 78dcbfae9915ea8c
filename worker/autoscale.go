package worker

import (
	"time"

	"go.uber.org/zap"
)

// defaultAutoscaleKeepalive is Celery's AUTOSCALE_KEEPALIVE: how long after
// the last growth the pool may shrink, and how often the autoscaler looks.
const defaultAutoscaleKeepalive = 30 * time.Second

// autoscaler is Celery's Autoscaler (celery/worker/autoscale.py) on the
// loop's concurrency: after every task message and every keepalive it
// grows the pool to the tasks reserved (received, not finished; at most
// max), and shrinks it to max(reserved, min) once keepalive has passed
// since the last growth. Like Celery's it never shrinks before it has
// grown once. It runs on the loop goroutine.
type autoscaler struct {
	max, min  int
	keepalive time.Duration
	lastUp    time.Time
	ticker    *time.Ticker
}

func newAutoscaler(c Config) *autoscaler {
	if c.AutoscaleMax <= 0 {
		return nil
	}
	k := c.AutoscaleKeepalive
	if k <= 0 {
		k = defaultAutoscaleKeepalive
	}
	return &autoscaler{max: c.AutoscaleMax, min: c.AutoscaleMin, keepalive: k}
}

// tick is the autoscaler's periodic wake-up; nil without autoscaling.
func (l *loop) autoscaleTick() <-chan time.Time {
	a := l.auto
	if a == nil {
		return nil
	}
	if a.ticker == nil {
		a.ticker = time.NewTicker(a.keepalive)
	}
	return a.ticker.C
}

// reserved is Celery's len(state.reserved_requests): tasks received and
// not finished, except those held for their ETA.
func (l *loop) reserved() int {
	return l.running + l.ready.len() + len(l.held) - l.heldETA + len(l.awaiting)
}

// maybeScale is Celery's Autoscaler._maybe_scale.
func (l *loop) maybeScale(now time.Time) {
	a := l.auto
	if a == nil {
		return
	}
	procs, qty := l.concurrency, l.reserved()
	if cur := min(qty, a.max); cur > procs {
		a.lastUp = now
		l.scaleTo(cur, "scaling up")
		return
	}
	// The pool keeps one slot: a goroutine that waits costs nothing, and a
	// pool of none would take no task to scale up on.
	if cur := max(qty, a.min, 1); cur < procs && !a.lastUp.IsZero() && now.Sub(a.lastUp) > a.keepalive {
		l.scaleTo(cur, "scaling down")
	}
}

func (l *loop) scaleTo(n int, msg string) {
	l.w.log.Info("autoscaler: "+msg, zap.Int("from", l.concurrency), zap.Int("to", n))
	l.concurrency = n
}

// updateAutoscale is Celery's Autoscaler.update (control autoscale): a new
// max below the pool shrinks it and changes the prefetch; a new min above
// it grows it.
func (l *loop) updateAutoscale(maxN, minN int) (int, int, bool) {
	a := l.auto
	if a == nil {
		return 0, 0, false
	}
	if maxN > 0 {
		if maxN < l.concurrency {
			l.scaleTo(maxN, "scaling down")
		}
		a.max = maxN
		l.wantPrefetch()
	}
	if minN >= 0 {
		if minN > l.concurrency {
			l.scaleTo(minN, "scaling up")
		}
		a.min = minN
	}
	return a.max, a.min, true
}

// autoscaleInfo is Celery's Autoscaler.info, the "autoscaler" of stats.
func (l *loop) autoscaleInfo() map[string]any {
	a := l.auto
	if a == nil {
		return nil
	}
	return map[string]any{
		"max":     int64(a.max),
		"min":     int64(a.min),
		"current": int64(l.concurrency),
		"qty":     int64(l.reserved()),
	}
}
