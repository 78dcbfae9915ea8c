// Package commit holds the outcome of a group commit: one write that
// carries the requests of every caller that asked while the previous
// write was in flight (the acks of both transport adapters).
package commit

import "context"

// Outcome is one group-committed write's result, shared by every caller
// whose request it carried. Its zero value is not usable: use NewOutcome.
type Outcome struct {
	done chan struct{}
	err  error
}

// NewOutcome returns an Outcome that is not yet reported.
func NewOutcome() *Outcome { return &Outcome{done: make(chan struct{})} }

// Report sets the write's error (nil for success) and wakes the waiters.
// It is called exactly once, by the goroutine that wrote.
func (o *Outcome) Report(err error) {
	o.err = err
	close(o.done)
}

// Wait returns the write's error once it is reported, or ctx's error if
// ctx ends first. An outcome already reported wins over an ended ctx (a
// single select would pick either at random), so a caller whose ack was
// written is not told it failed.
func (o *Outcome) Wait(ctx context.Context) error {
	select {
	case <-o.done:
		return o.err
	default:
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err returns the reported error. It is only valid after Report, in the
// goroutine that called it or after Wait returned.
func (o *Outcome) Err() error { return o.err }
