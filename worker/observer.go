package worker

import (
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Outcome is how a task run ended, for metrics.
type Outcome string

// Outcomes.
const (
	OutcomeSucceeded    Outcome = "succeeded"
	OutcomeFailed       Outcome = "failed"
	OutcomeRetried      Outcome = "retried"
	OutcomeRejected     Outcome = "rejected"
	OutcomeDeadLettered Outcome = "dead-lettered"
	OutcomeRevoked      Outcome = "revoked"
	OutcomeIgnored      Outcome = "ignored"
)

// Wait reasons, for Observer.TaskWaiting.
const (
	WaitETA        = "eta"
	WaitRateLimit  = "rate-limit"
	WaitGlobalRate = "global-rate-limit"
)

// Observer is told what the worker does, for metrics (worker/prommetrics
// implements it for Prometheus). Methods are called from the worker's hot
// paths and must be fast and must not block.
type Observer interface {
	// TaskReceived: a message for the task arrived (before any wait).
	TaskReceived(name string)
	// TaskWaiting: the task waits before it can start (its countdown/ETA or a
	// rate limit) for about d.
	TaskWaiting(name, reason string, d time.Duration)
	// TaskStarted: the handler is being called.
	TaskStarted(name string)
	// TaskFinished: the run ended with outcome after runtime (zero for
	// tasks that did not run: revoked, rejected before start).
	TaskFinished(name string, outcome Outcome, runtime time.Duration)
	// MessageRejected: a message was dead-lettered before any handler ran
	// (undecodable, refused content type, unknown task, too large...).
	MessageRejected(reason string)
}

// LossObserver is an optional extension of Observer: an Observer that also
// implements it is told of every result write the worker gave up on after
// its settle budget (the backend stayed down), so that no lost result goes
// uncounted (worker/prommetrics exports it).
type LossObserver interface {
	// ResultLost: a state for a task could not be stored.
	ResultLost(state protocol.State)
}

// ConsumerObserver is an optional extension of Observer: an Observer that
// also implements it is told of every consumer the watchdog rebuilt (see
// Config.ConsumerWatchdog), with the reason ("no-progress"); worker/prommetrics
// exports it as celeriac_consumer_restarts_total.
type ConsumerObserver interface {
	ConsumerRestarted(reason string)
}

func (w *Worker) resultLost(state protocol.State) {
	if lo, ok := w.cfg.Observer.(LossObserver); ok {
		lo.ResultLost(state)
	}
}

// Stats is a snapshot of the worker's state, for gauges.
type Stats struct {
	Running     int
	Ready       int
	HeldETA     int
	HeldRate    int
	Prefetch    int
	Concurrency int
	Processed   int64
}

// Stats returns a snapshot of the worker's state. It is safe to call from
// any goroutine; when the worker is not running it reports zeros.
func (w *Worker) Stats() Stats {
	s, _ := w.inLoop(func(l *loop) any {
		st := Stats{
			Running:     l.running,
			Ready:       l.ready.len(),
			HeldETA:     l.heldETA,
			HeldRate:    len(l.held) - l.heldETA + len(l.awaiting),
			Prefetch:    l.prefetchSet,
			Concurrency: l.concurrency,
		}
		return st
	}).(Stats)
	s.Processed = w.processed.Load()
	return s
}

// nopObserver is used when Config.Observer is nil.
type nopObserver struct{}

func (nopObserver) TaskReceived(string)                         {}
func (nopObserver) TaskWaiting(string, string, time.Duration)   {}
func (nopObserver) TaskStarted(string)                          {}
func (nopObserver) TaskFinished(string, Outcome, time.Duration) {}
func (nopObserver) MessageRejected(string)                      {}
