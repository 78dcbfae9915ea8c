package transporttest

import (
	"fmt"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func deadLetterTests() []testCase {
	return []testCase{
		{"Removes", testDeadLetterRemoves},
		{"ListAndReplay", testDeadLetterListAndReplay},
		{"PurgeDead", testPurgeDead},
		{"RejectKept", testRejectKept},
	}
}

// deadMessage is richMessage without an expiration: RabbitMQ removes the
// expiration property of a message it dead-letters (keeping it in x-death).
func deadMessage(id string) protocol.Message {
	m := richMessage(id)
	m.Properties.Expiration = ""
	return m
}

// deadQueue declares a queue with Features.DeadLetterQueueArguments.
func (e *env) deadQueue() transport.Queue {
	q := transport.Queue{Name: e.queue()}
	if e.f.DeadLetterQueueArguments != nil {
		q.Arguments = e.f.DeadLetterQueueArguments(q.Name)
	}
	return q
}

func (e *env) deadStore(tr transport.Transport) transport.DeadLetterStore {
	e.t.Helper()
	ds, ok := tr.(transport.DeadLetterStore)
	if !ok {
		e.t.Skipf("%T does not implement transport.DeadLetterStore", tr)
	}
	return ds
}

// waitDead waits until the store lists n dead messages of queue and returns
// them.
func (e *env) waitDead(ds transport.DeadLetterStore, queue string, n int) []transport.DeadMessage {
	e.t.Helper()
	var dead []transport.DeadMessage
	e.eventually(fmt.Sprintf("%d dead letters of %s", n, queue), func() (bool, string) {
		var err error
		dead, err = ds.DeadLetters(e.ctx, queue, 0)
		if err != nil {
			return false, err.Error()
		}
		return len(dead) == n, fmt.Sprintf("%d dead letters", len(dead))
	})
	return dead
}

// testDeadLetterRemoves holds for every transport, with a store or not: a
// dead-lettered message leaves its queue for good.
func testDeadLetterRemoves(t *testing.T, e *env) {
	tr := e.transport()
	q := e.deadQueue()
	c := e.consume(tr, 1, q)
	e.publish(tr, q.Name, msg("dl-1"))
	e.publish(tr, q.Name, msg("next-2"))
	d := e.recv(c)
	if err := d.DeadLetter(e.ctx, transport.DeadLetterReason{Reason: "permanent", Error: "boom"}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	d2 := e.recv(c)
	if msgID(d2.Message) != "next-2" {
		t.Fatalf("after dead-lettering %s got %s, want next-2", msgID(d.Message), msgID(d2.Message))
	}
	e.ack(d2)
	e.none(c, "a dead-lettered message must not be redelivered")
	e.waitLen(tr, q.Name, 0)
}

func testDeadLetterListAndReplay(t *testing.T, e *env) {
	tr := e.transport()
	ds := e.deadStore(tr)
	q := e.deadQueue()
	c := e.consume(tr, 0, q)
	const n = 3
	want := map[string]struct{}{}
	for i := range n {
		m := deadMessage(fmt.Sprintf("dead-%d", i))
		m.Headers["retries"] = int64(2)
		e.publish(tr, q.Name, m)
		want[msgID(m)] = struct{}{}
	}
	reasonAt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var order []string
	for i := range n {
		d := e.recv(c)
		id := msgID(d.Message)
		order = append(order, id)
		r := transport.DeadLetterReason{
			Reason:   "max-retries",
			Error:    fmt.Sprintf("ConnectionError('attempt %d')", i),
			TaskID:   id,
			TaskName: "transporttest.roundtrip",
			Time:     reasonAt,
		}
		if err := d.DeadLetter(e.ctx, r); err != nil {
			t.Fatalf("DeadLetter(%s): %v", id, err)
		}
	}
	e.none(c, "every message was dead-lettered")

	dead := e.waitDead(ds, q.Name, n)
	seenIDs := map[string]bool{}
	for i, dm := range dead {
		id := msgID(dm.Message)
		if id != order[i] {
			t.Errorf("dead letter %d is %s, want %s (oldest first)", i, id, order[i])
		}
		if dm.ID == "" || seenIDs[dm.ID] {
			t.Errorf("dead letter %s has ID %q: empty or not unique", id, dm.ID)
		}
		seenIDs[dm.ID] = true
		if dm.Queue != q.Name {
			t.Errorf("dead letter %s: Queue = %q, want %q", id, dm.Queue, q.Name)
		}
		wantMsg := deadMessage(id)
		wantMsg.Headers["retries"] = int64(2)
		if diff := diffMessage(wantMsg, dm.Message, redeliveryKey, e.f.ExtraProperties); diff != "" {
			t.Errorf("dead letter %s differs from the published message:\n%s", id, diff)
		}
		if e.f.DeadLetterReason {
			r := dm.Reason
			wantErr := fmt.Sprintf("ConnectionError('attempt %d')", i)
			if r.Reason != "max-retries" || r.Error != wantErr || r.TaskID != id || r.TaskName != "transporttest.roundtrip" || !r.Time.Truncate(time.Second).Equal(reasonAt) {
				t.Errorf("dead letter %s: Reason = %+v; want max-retries, %q, %s, transporttest.roundtrip, %v", id, r, wantErr, id, reasonAt)
			}
		}
	}
	if t.Failed() {
		return
	}
	limited, err := ds.DeadLetters(e.ctx, q.Name, 2)
	if err != nil {
		t.Fatalf("DeadLetters(limit 2): %v", err)
	}
	if len(limited) != 2 || limited[0].ID != dead[0].ID || limited[1].ID != dead[1].ID {
		t.Errorf("DeadLetters(limit 2) = %d messages, want the 2 oldest", len(limited))
	}

	// Replay the oldest with its retries reset.
	moved, err := ds.Replay(e.ctx, q.Name, []string{dead[0].ID}, transport.ReplayOptions{ResetRetries: true})
	if err != nil || moved != 1 {
		t.Fatalf("Replay(one, ResetRetries) = %d, %v; want 1, nil", moved, err)
	}
	d := e.recv(c)
	if id := msgID(d.Message); id != order[0] {
		t.Errorf("replayed %s, got %s", order[0], id)
	}
	if r := d.Message.Headers["retries"]; !equalValue(r, int64(0)) {
		t.Errorf("replayed with ResetRetries: retries header = %#v (%T), want int64(0)", r, r)
	}
	if diff := diffMessage(deadMessage(order[0]), d.Message, func(k string) bool { return k == "retries" || redeliveryKey(k) }, e.f.ExtraProperties); diff != "" {
		t.Errorf("replayed message differs:\n%s", diff)
	}
	e.ack(d)
	e.none(c, "only one message was replayed")
	if rest := e.waitDead(ds, q.Name, 2); rest[0].ID != dead[1].ID || rest[1].ID != dead[2].ID {
		t.Errorf("after replaying the oldest, the store holds %s and %s; want %s and %s", rest[0].ID, rest[1].ID, dead[1].ID, dead[2].ID)
	}

	// Replay the rest, keeping their retries.
	moved, err = ds.Replay(e.ctx, q.Name, nil, transport.ReplayOptions{})
	if err != nil || moved != 2 {
		t.Fatalf("Replay(all) = %d, %v; want 2, nil", moved, err)
	}
	got := map[string]bool{}
	for range 2 {
		d := e.recv(c)
		got[msgID(d.Message)] = true
		if r := d.Message.Headers["retries"]; !equalValue(r, int64(2)) {
			t.Errorf("replayed %s without ResetRetries: retries header = %#v (%T), want int64(2)", msgID(d.Message), r, r)
		}
		e.ack(d)
	}
	if !got[order[1]] || !got[order[2]] {
		t.Errorf("replayed all: got %v, want %s and %s", got, order[1], order[2])
	}
	e.none(c, "every dead letter was replayed once")
	e.waitDead(ds, q.Name, 0)
}

func testPurgeDead(t *testing.T, e *env) {
	tr := e.transport()
	ds := e.deadStore(tr)
	q := e.deadQueue()
	c := e.consume(tr, 0, q)
	e.publishN(tr, q.Name, "m", 3)
	for _, d := range e.recvN(c, 3) {
		if err := d.DeadLetter(e.ctx, transport.DeadLetterReason{Reason: "permanent"}); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	dead := e.waitDead(ds, q.Name, 3)
	n, err := ds.PurgeDead(e.ctx, q.Name, []string{dead[1].ID})
	if err != nil || n != 1 {
		t.Fatalf("PurgeDead(one) = %d, %v; want 1, nil", n, err)
	}
	rest := e.waitDead(ds, q.Name, 2)
	if rest[0].ID != dead[0].ID || rest[1].ID != dead[2].ID {
		t.Errorf("after purging the middle one the store holds %s, %s; want %s, %s", rest[0].ID, rest[1].ID, dead[0].ID, dead[2].ID)
	}
	n, err = ds.PurgeDead(e.ctx, q.Name, nil)
	if err != nil || n != 2 {
		t.Fatalf("PurgeDead(all) = %d, %v; want 2, nil", n, err)
	}
	e.waitDead(ds, q.Name, 0)
	e.none(c, "purged dead letters must not come back")
	e.waitLen(tr, q.Name, 0)
}

func testRejectKept(t *testing.T, e *env) {
	if !e.f.RejectDeadLetters {
		t.Skip("Features.RejectDeadLetters is false")
	}
	tr := e.transport()
	ds := e.deadStore(tr)
	q := e.deadQueue()
	c := e.consume(tr, 1, q)
	want := deadMessage("rejected-1")
	e.publish(tr, q.Name, want)
	if err := e.recv(c).Reject(e.ctx, false); err != nil {
		t.Fatalf("Reject(no requeue): %v", err)
	}
	dead := e.waitDead(ds, q.Name, 1)
	if diff := diffMessage(want, dead[0].Message, redeliveryKey, e.f.ExtraProperties); diff != "" {
		t.Errorf("dead letter differs from the rejected message:\n%s", diff)
	}
	if moved, err := ds.Replay(e.ctx, q.Name, nil, transport.ReplayOptions{}); err != nil || moved != 1 {
		t.Fatalf("Replay = %d, %v; want 1, nil", moved, err)
	}
	d := e.recv(c)
	if msgID(d.Message) != "rejected-1" {
		t.Errorf("replayed %s, want rejected-1", msgID(d.Message))
	}
	e.ack(d)
}
