package transporttest

import (
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func adminTests() []testCase {
	return []testCase{
		{"LenPurge", testLenPurge},
	}
}

func testLenPurge(t *testing.T, e *env) {
	tr := e.transport()
	a, ok := tr.(transport.Admin)
	if !ok {
		t.Skipf("%T does not implement transport.Admin", tr)
	}
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	if n, err := a.Len(e.ctx, q); err != nil || n != 0 {
		t.Fatalf("Len of a new queue = %d, %v; want 0, nil", n, err)
	}
	e.publishN(tr, q, "m", 5)
	e.waitLen(tr, q, 5)

	// A delivery handed out is not ready: Len and Purge leave it alone.
	c := e.consume(tr, 1, transport.Queue{Name: q})
	d := e.recv(c)
	e.waitLen(tr, q, 4)
	e.stop(c)
	n, err := a.Purge(e.ctx, q)
	if err != nil || n != 4 {
		t.Fatalf("Purge = %d, %v; want 4, nil", n, err)
	}
	e.waitLen(tr, q, 0)
	if n, err := a.Purge(e.ctx, q); err != nil || n != 0 {
		t.Errorf("Purge of an empty queue = %d, %v; want 0, nil", n, err)
	}
	if err := d.Reject(e.ctx, true); err != nil {
		t.Fatalf("Reject(requeue) after Purge: %v", err)
	}
	e.waitLen(tr, q, 1)
	c2 := e.consume(tr, 1, transport.Queue{Name: q})
	d2 := e.recv(c2)
	if got := msgID(d2.Message); got != msgID(d.Message) {
		t.Errorf("after Purge got %s, want the requeued %s", got, msgID(d.Message))
	}
	e.ack(d2)
}
