package worker

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
)

// callOptions are the options a finished task adds when it applies a
// signature (a callback, the next chain step, a chord body, an errback), as
// in sig.apply_async((retval,), parent_id=..., root_id=..., chain=...).
type callOptions struct {
	parentID string
	rootID   string
	// chain is set (possibly to an empty, non-nil slice) when the caller
	// passes the remaining chain.
	chain    []protocol.Signature
	hasChain bool
	groupID  string
	// queue is the queue of the task that applies the signature: where its
	// messages go when nothing routes them (see Config.Routes).
	queue string
	// span is the run's span (nil when tracing is off): what is published
	// joins its trace.
	span trace.Span
}

// applySignature publishes a signature as Celery's worker would (see
// publish.Applier), each message and the chord size in its own settle
// budget. It returns the ids of what it published (for the parent's
// children).
func (w *Worker) applySignature(sig protocol.Signature, extra []any, c callOptions) ([]string, error) {
	a := publish.Applier{
		P: w.producer,
		Publish: func(m *protocol.TaskMessage, dest publish.Destination, o *publish.Options) error {
			return w.persist(func(ctx context.Context) error {
				return w.producer.Publish(withSpan(ctx, c.span), m, dest, o.Serializer, o.Compression)
			})
		},
	}
	if chords, ok := backend.ChordsOf(w.cfg.Backend); ok {
		a.SetChordSize = func(gid string, n int) error {
			return w.persist(func(ctx context.Context) error { return chords.SetChordSize(ctx, gid, n) })
		}
	} else if _, ok := w.cfg.Backend.(backend.ChordUnlocker); ok {
		a.UnlockChords = true
	}
	return a.Apply(sig, extra, publish.Call{
		ParentID: c.parentID, RootID: c.rootID,
		Chain: c.chain, HasChain: c.hasChain,
		GroupID: c.groupID, Queue: c.queue,
	})
}
