package memory_test

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// model is the memory transport's documented behaviour for one queue and one
// consumer with a prefetch of at most 32 (so the consumer's goroutine never
// blocks on its channel buffer): what it will deliver next, and with which
// Redelivered flag.
type model struct {
	levels   map[int][]mmsg // ready messages per priority, head first
	taken    []mmsg         // taken by the consumer's goroutine, not yet received
	held     []mmsg         // received and unsettled, in order of receipt
	dead     []mmsg
	prefetch int
	gen      int // the current consumer; the prefetch is per consumer
}

type mmsg struct {
	id          int64
	prio        int
	redelivered bool
	gen         int // the consumer holding it
}

func (m *model) pushBack(x mmsg)  { m.levels[x.prio] = append(m.levels[x.prio], x) }
func (m *model) pushFront(x mmsg) { m.levels[x.prio] = append([]mmsg{x}, m.levels[x.prio]...) }

func (m *model) pop() (mmsg, bool) {
	for p := 3; p >= 0; p-- {
		if l := m.levels[p]; len(l) > 0 {
			m.levels[p] = l[1:]
			return l[0], true
		}
	}
	return mmsg{}, false
}

// fill is what the consumer's goroutine does whenever it runs: take ready
// messages while the prefetch allows.
func (m *model) fill() {
	mine := 0
	for _, x := range m.held {
		if x.gen == m.gen {
			mine++
		}
	}
	for len(m.taken)+mine < m.prefetch {
		x, ok := m.pop()
		if !ok {
			return
		}
		m.taken = append(m.taken, x)
	}
}

// giveBack returns what was taken and not received, unmarked, in order.
func (m *model) giveBack() {
	for i := len(m.taken) - 1; i >= 0; i-- {
		m.pushFront(m.taken[i])
	}
	m.taken = nil
}

func (m *model) ready() int {
	n := 0
	for _, l := range m.levels {
		n += len(l)
	}
	return n
}

// FuzzModel runs random operation sequences against the memory transport and
// the model, inside a synctest bubble so that "the consumer has done all it
// can" is exact (synctest.Wait) rather than timed.
func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 2, 0, 1, 1, 3, 0, 1, 1})
	f.Add([]byte{0, 0, 0, 3, 0, 1, 6, 2, 1, 1, 1, 7, 1, 1, 1, 4, 0, 5, 0, 7, 2, 1})
	f.Add([]byte{6, 4, 0, 3, 0, 2, 0, 1, 1, 1, 1, 7, 0, 1, 1, 3, 0, 1, 3, 0, 7, 1, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		defer fuzzwatch.Watch(t, ops)()
		if len(ops) > 400 {
			ops = ops[:400]
		}
		synctest.Test(t, func(t *testing.T) { runModel(t, ops) })
	})
}

func runModel(t *testing.T, ops []byte) {
	ctx := t.Context()
	b := memory.NewBroker()
	q := []transport.Queue{{Name: "q", Arguments: map[string]any{memory.ArgMaxPriority: 3}}}
	m := &model{levels: map[int][]mmsg{}, prefetch: 2}
	var (
		tr   *memory.Transport
		c    transport.Consumer
		held []*transport.Delivery // parallel to m.held
		next int64
		log  []string
	)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("after %v: %s", log, fmt.Sprintf(format, args...))
	}
	connect := func() {
		tr = memory.New(memory.Config{Broker: b})
		var err error
		if c, err = tr.Consume(ctx, q, transport.ConsumeOptions{Prefetch: m.prefetch}); err != nil {
			fail("Consume: %v", err)
		}
	}
	connect()
	defer func() { tr.Close() }()
	arg := func(i *int) int {
		*i++
		if *i < len(ops) {
			return int(ops[*i])
		}
		return 0
	}
	pick := func(i *int) int { return arg(i) % len(held) }

	for i := 0; i < len(ops); i++ {
		synctest.Wait()
		m.fill()
		switch ops[i] % 8 {
		case 0:
			p := arg(&i) % 4
			next++
			log = append(log, fmt.Sprintf("pub(%d,p%d)", next, p))
			msg := protocol.Message{Headers: map[string]any{"id": next}, Properties: protocol.Properties{Priority: p}}
			if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "q", Message: msg}); err != nil {
				fail("Publish: %v", err)
			}
			m.pushBack(mmsg{id: next, prio: p})
		case 1:
			log = append(log, "recv")
			select {
			case d := <-c.Deliveries():
				if len(m.taken) == 0 {
					fail("got %v, the model expects nothing (prefetch %d, %d held)", d.Message.Headers["id"], m.prefetch, len(m.held))
				}
				want := m.taken[0]
				m.taken = m.taken[1:]
				if got := d.Message.Headers["id"]; got != want.id || d.Redelivered != want.redelivered {
					fail("got %v redelivered=%v, want %d redelivered=%v", got, d.Redelivered, want.id, want.redelivered)
				}
				want.gen = m.gen
				m.held = append(m.held, want)
				held = append(held, d)
			default:
				if len(m.taken) > 0 {
					fail("nothing delivered, the model expects %d", m.taken[0].id)
				}
			}
		case 2, 3, 4, 5:
			if len(held) == 0 {
				continue
			}
			k := pick(&i)
			d, x := held[k], m.held[k]
			held = append(held[:k], held[k+1:]...)
			m.held = append(m.held[:k], m.held[k+1:]...)
			var err error
			switch ops[i-1] % 8 {
			case 2:
				log = append(log, fmt.Sprintf("ack(%d)", x.id))
				err = d.Ack(ctx)
			case 3:
				log = append(log, fmt.Sprintf("requeue(%d)", x.id))
				err = d.Reject(ctx, true)
				x.redelivered = true
				m.pushFront(x)
			case 4:
				log = append(log, fmt.Sprintf("drop(%d)", x.id))
				err = d.Reject(ctx, false)
			case 5:
				log = append(log, fmt.Sprintf("dead(%d)", x.id))
				err = d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "model"})
				x.redelivered = false
				m.dead = append(m.dead, x)
			}
			if err != nil {
				fail("settling %d: %v", x.id, err)
			}
		case 6:
			m.prefetch = 1 + arg(&i)%5
			log = append(log, fmt.Sprintf("prefetch(%d)", m.prefetch))
			if err := c.SetPrefetch(m.prefetch); err != nil {
				fail("SetPrefetch: %v", err)
			}
		case 7:
			switch arg(&i) % 3 {
			case 0:
				log = append(log, "stop")
				if err := c.Stop(ctx); err != nil {
					fail("Stop: %v", err)
				}
				for d := range c.Deliveries() {
					fail("delivery %v after Stop", d.Message.Headers["id"])
				}
				m.giveBack()
				m.gen++
				var err error
				if c, err = tr.Consume(ctx, q, transport.ConsumeOptions{Prefetch: m.prefetch}); err != nil {
					fail("Consume: %v", err)
				}
			case 1:
				log = append(log, "close")
				if err := tr.Close(); err != nil {
					fail("Close: %v", err)
				}
				m.giveBack()
				for k := len(m.held) - 1; k >= 0; k-- {
					x := m.held[k]
					x.redelivered = true
					m.pushFront(x)
				}
				m.held, held = nil, nil
				m.gen++
				connect()
			case 2:
				log = append(log, "replay")
				n, err := tr.Replay(ctx, "q", nil, transport.ReplayOptions{})
				if err != nil || n != len(m.dead) {
					fail("Replay = %d, %v; want %d", n, err, len(m.dead))
				}
				for _, x := range m.dead {
					m.pushBack(x)
				}
				m.dead = nil
			}
		}
	}
	synctest.Wait()
	m.fill()
	s := b.Stats()
	if s.Ready != m.ready() || s.Unacked != len(m.held)+len(m.taken) || s.Dead != len(m.dead) {
		fail("broker %+v; model: %d ready, %d taken, %d held, %d dead", s, m.ready(), len(m.taken), len(m.held), len(m.dead))
	}
}
