package amqp

import (
	"context"
	"slices"
	"sync"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport/internal/commit"
)

// acker coalesces the acks of one channel. Acks asked for while another is
// being written are written together by the goroutine that writes: the
// longest run of them that, with the tags already settled, covers every
// outstanding tag from the lowest up, as one basic.ack with multiple set
// (one frame, one write, and one ack for RabbitMQ to process), the others
// one basic.ack each. No ack waits for another to make a batch: an ack
// asked for when none is being written is written at once, so the batches
// only form under load, where the writes queue up anyway (a group commit).
//
// basic.ack with multiple acks every outstanding tag up to its own, so it
// is sent only when the ledger shows each lower tag settled: acked in this
// batch, or settled before with a frame already written. RabbitMQ numbers
// a channel's deliveries 1, 2, 3, …, and every delivery of the consumer's
// channel passes through the ledger (acked here, or rejected and then
// recorded with settled), so a tag the ledger does not know is
// outstanding, or not received yet, and stops the run.
type acker struct {
	ch *amqp091.Channel
	// written is called with the number of acks of each batch once it is
	// written (or failed): the channel must stay open until then.
	written func(n int)

	mu       sync.Mutex
	ledger   tagLedger
	queued   []uint64        // tags to ack, not yet written
	batch    *commit.Outcome // the outcome of the write that queued joins
	flushing bool            // a goroutine is writing acks
	spare    []uint64
}

func newAcker(ch *amqp091.Channel, written func(n int)) *acker {
	return &acker{ch: ch, written: written, ledger: tagLedger{low: 1}}
}

// ack acks tag: it returns at once when another goroutine is writing acks,
// which then writes this one too; wait reports how its write went.
func (a *acker) ack(tag uint64) (wait func(context.Context) error) {
	a.mu.Lock()
	a.queued = append(a.queued, tag)
	if a.flushing {
		if a.batch == nil {
			a.batch = commit.NewOutcome()
		}
		b := a.batch
		a.mu.Unlock()
		return b.Wait
	}
	// Write this ack, then those asked for meanwhile, until none is left.
	// The first batch is this ack alone: nobody waits on it but us.
	a.flushing = true
	first, own := true, error(nil)
	for len(a.queued) > 0 {
		q, b := a.queued, a.batch
		a.queued, a.batch = a.spare[:0], nil
		slices.Sort(q)
		upto, rest := a.ledger.coalesce(q)
		a.mu.Unlock()

		err := a.write(upto, rest)
		if first {
			first, own = false, err
		}
		if b != nil {
			b.Report(err)
		}
		a.written(len(q))

		a.mu.Lock()
		a.spare = q
	}
	a.flushing = false
	a.mu.Unlock()
	if own == nil {
		return ackWritten
	}
	return func(context.Context) error { return own }
}

// ackWritten is the wait of an ack written without error.
func ackWritten(context.Context) error { return nil }

// write sends one basic.ack with multiple for upto (when non-zero) and one
// basic.ack for each of rest.
func (a *acker) write(upto uint64, rest []uint64) error {
	if upto != 0 {
		if err := a.ch.Ack(upto, true); err != nil {
			return err
		}
	}
	for _, t := range rest {
		if err := a.ch.Ack(t, false); err != nil {
			return err
		}
	}
	return nil
}

// settled records tag as settled with the broker (rejected, its frame
// written), so that a later multiple ack may reach past it.
func (a *acker) settled(tag uint64) {
	a.mu.Lock()
	a.ledger.add(tag)
	a.mu.Unlock()
}

// tagLedger records which delivery tags of a channel are settled with the
// broker. Its size is the number of runs of settled tags above the lowest
// unsettled one, so a delivery held for hours (an ETA task) costs one run,
// not one entry per tag settled since.
type tagLedger struct {
	low  uint64   // every tag below low is settled
	runs []tagRun // settled tags above low, sorted, disjoint, not adjacent
}

// tagRun is the settled tags from first to last, inclusive.
type tagRun struct{ first, last uint64 }

// add records tag as settled.
func (l *tagLedger) add(tag uint64) {
	switch {
	case tag < l.low:
		return
	case tag == l.low:
		l.low++
		if len(l.runs) > 0 && l.runs[0].first == l.low {
			l.low = l.runs[0].last + 1
			l.runs = l.runs[:copy(l.runs, l.runs[1:])]
		}
		return
	}
	// The first run that ends at tag-1 or later.
	lo, hi := 0, len(l.runs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.runs[m].last+1 < tag {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo
	if i < len(l.runs) && l.runs[i].first <= tag && tag <= l.runs[i].last {
		return
	}
	joinsPrev := i < len(l.runs) && l.runs[i].last+1 == tag
	joinsNext := i < len(l.runs) && l.runs[i].first == tag+1
	switch {
	case joinsPrev && i+1 < len(l.runs) && l.runs[i+1].first == tag+1:
		l.runs[i].last = l.runs[i+1].last
		l.runs = slices.Delete(l.runs, i+1, i+2)
	case joinsPrev:
		l.runs[i].last = tag
	case joinsNext:
		l.runs[i].first = tag
	default:
		l.runs = slices.Insert(l.runs, i, tagRun{tag, tag})
	}
}

// coalesce takes the sorted tags of a batch of acks and records them all
// as settled. It returns the tag of the multiple ack that settles the
// longest run of them reachable from the lowest unsettled tag (0: none),
// and the tags left to ack one by one.
func (l *tagLedger) coalesce(q []uint64) (upto uint64, rest []uint64) {
	i := 0
	for {
		if i < len(q) && q[i] == l.low {
			upto = q[i]
			i++
			l.low++
			continue
		}
		if len(l.runs) > 0 && l.runs[0].first == l.low {
			l.low = l.runs[0].last + 1
			l.runs = l.runs[:copy(l.runs, l.runs[1:])]
			continue
		}
		break
	}
	rest = q[i:]
	for _, t := range rest {
		l.add(t)
	}
	return upto, rest
}
