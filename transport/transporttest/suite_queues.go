package transporttest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func priorityTests() []testCase {
	return []testCase{
		{"Order", testPriorityOrder},
	}
}

func queueTests() []testCase {
	return []testCase{
		{"AddAndCancel", testAddAndCancel},
	}
}

// kombuBand is the Redis priority band of p (kombu's priority_steps 0, 3, 6,
// 9): lower bands are consumed first.
func kombuBand(p int) int {
	switch {
	case p < 3:
		return 0
	case p < 6:
		return 3
	case p < 9:
		return 6
	}
	return 9
}

func testPriorityOrder(t *testing.T, e *env) {
	tr := e.transport()
	q := transport.Queue{Name: e.queue(), Arguments: e.f.PriorityQueueArguments}
	e.declare(tr, q)
	prios := []int{3, 0, 9, 5, 1, 7, 2, 8, 4, 6, 5, 0, 9}
	type sent struct {
		id   string
		prio int
	}
	var all []sent
	prioByID := map[string]int{}
	for i, p := range prios {
		id := fmt.Sprintf("p%d-%02d", p, i)
		m := msg(id)
		m.Properties.Priority = p
		e.publish(tr, q.Name, m)
		all = append(all, sent{id, p})
		prioByID[id] = p
	}
	e.waitLen(tr, q.Name, len(prios))
	want := slices.Clone(all)
	switch e.f.Priority {
	case PriorityHigherFirst:
		slices.SortStableFunc(want, func(a, b sent) int { return b.prio - a.prio })
	case PriorityLowerFirstBands:
		slices.SortStableFunc(want, func(a, b sent) int { return kombuBand(a.prio) - kombuBand(b.prio) })
	}
	c := e.consume(tr, 1, q)
	var got, wantIDs []string
	for i := range prios {
		d := e.recv(c)
		got = append(got, msgID(d.Message))
		wantIDs = append(wantIDs, want[i].id)
		if p, want := d.Message.Properties.Priority, prioByID[msgID(d.Message)]; p != want {
			t.Errorf("%s: Properties.Priority = %d, want %d", msgID(d.Message), p, want)
		}
		e.ack(d)
	}
	if !slices.Equal(got, wantIDs) {
		t.Errorf("delivery order with Features.Priority %v:\n got %v\nwant %v", e.f.Priority, got, wantIDs)
	}
}

func testAddAndCancel(t *testing.T, e *env) {
	tr := e.transport()
	q1, q2 := e.queue(), e.queue()
	c := e.consume(tr, 0, transport.Queue{Name: q1})
	if err := c.AddQueue(e.ctx, transport.Queue{Name: q2}); err != nil {
		t.Fatalf("AddQueue(%s): %v", q2, err)
	}
	if got := queueNames(c.Queues()); !slices.Equal(got, []string{q1, q2}) {
		t.Errorf("Queues() after AddQueue = %v, want [%s %s]", got, q1, q2)
	}
	e.publish(tr, q2, msg("to-q2"))
	d := e.recv(c)
	if msgID(d.Message) != "to-q2" || d.Queue != q2 {
		t.Errorf("got %s from %q, want to-q2 from %q", msgID(d.Message), d.Queue, q2)
	}

	if err := c.CancelQueue(e.ctx, q1); err != nil {
		t.Fatalf("CancelQueue(%s): %v", q1, err)
	}
	if got := queueNames(c.Queues()); !slices.Equal(got, []string{q2}) {
		t.Errorf("Queues() after CancelQueue = %v, want [%s]", got, q2)
	}
	e.ack(d)
	e.publish(tr, q1, msg("to-q1"))
	e.none(c, "the consumer no longer consumes "+q1)
	e.waitLen(tr, q1, 1)
	e.publish(tr, q2, msg("to-q2-again"))
	d = e.recv(c)
	if msgID(d.Message) != "to-q2-again" {
		t.Errorf("got %s, want to-q2-again", msgID(d.Message))
	}
	e.ack(d)

	// A queue cancelled while one of its deliveries is out: the delivery
	// still settles.
	c2 := e.consume(tr, 1, transport.Queue{Name: q1})
	d = e.recv(c2)
	if err := c2.CancelQueue(e.ctx, q1); err != nil {
		t.Fatalf("CancelQueue(%s): %v", q1, err)
	}
	e.ack(d)
	e.waitLen(tr, q1, 0)
}
