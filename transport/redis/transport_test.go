package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func TestConsumeRecordsUnackedAsKombu(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	tag := newTag()
	envelope := pyEnvelope(tag, "rt_q", 0, 1)
	e.push("rt_q", 0, envelope)

	before := scoreFloat(time.Now()) - 1
	c := consume(t, tr, 4, "rt_q")
	d := receive(t, c.Deliveries())
	if d.Tag != tag || d.Queue != "rt_q" || d.Exchange != "" || d.RoutingKey != "rt_q" || d.Redelivered {
		t.Fatalf("delivery = tag %q queue %q exchange %q rk %q redelivered %v", d.Tag, d.Queue, d.Exchange, d.RoutingKey, d.Redelivered)
	}
	if got := taskID(d); got != "00000000-0000-4000-8000-000000000001" {
		t.Fatalf("task id = %q", got)
	}
	// kombu: HSET unacked <tag> json.dumps([envelope, exchange, routing_key]).
	got, err := e.raw.HGet(ctx, e.key("unacked"), tag).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := "[" + envelope + `, "", "rt_q"]`; got != want {
		t.Fatalf("unacked value mismatch (-want +got):\n%s", cmp.Diff(want, got))
	}
	sc, err := e.raw.ZScore(ctx, e.key("unacked_index"), tag).Result()
	if err != nil {
		t.Fatal(err)
	}
	if sc < before || sc > scoreFloat(time.Now())+1 {
		t.Fatalf("unacked_index score %f is not the delivery time", sc)
	}
	// Consume added kombu's binding member for the queue.
	if ok, _ := e.raw.SIsMember(ctx, e.key("_kombu.binding.rt_q"), "rt_q\x06\x16\x06\x16rt_q").Result(); !ok {
		t.Fatal("binding member missing")
	}

	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked has %d entries after ack", n)
	}
	if n := e.raw.ZCard(ctx, e.key("unacked_index")).Val(); n != 0 {
		t.Fatalf("unacked_index has %d entries after ack", n)
	}
	if err := d.Ack(ctx); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
		t.Fatalf("second Ack = %v, want ErrAlreadyAcknowledged", err)
	}
}

func TestPriorityBandsAndRoundRobin(t *testing.T) {
	pops(t, testPriorityBandsAndRoundRobin)
}

func testPriorityBandsAndRoundRobin(t *testing.T, staged bool) {
	e := newEnv(t)
	cfg := e.config()
	cfg.StagedPop = staged
	tr := e.dial(cfg)
	// Two queues; priorities spread over bands. kombu's order: band-major
	// (lower band first), queues alternating inside a band.
	type msg struct {
		q    string
		prio int
		i    int
	}
	in := []msg{{"rt_a", 9, 1}, {"rt_a", 0, 2}, {"rt_b", 0, 3}, {"rt_a", 0, 4}, {"rt_b", 5, 5}, {"rt_b", 0, 6}, {"rt_a", 3, 7}, {"rt_a", 7, 8}}
	for _, m := range in {
		e.push(m.q, m.prio, pyEnvelope(newTag(), m.q, m.prio, m.i))
	}
	c := consume(t, tr, 100, "rt_a", "rt_b")
	var got []int
	for range in {
		d := receive(t, c.Deliveries())
		got = append(got, idx(d))
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Band 0: a2, b3, a4, b6 (round robin a,b,a,b); band 3: a7, b5
	// (a first: after b6 the order is a,b); band 6: a8; band 9: a1.
	want := []int{2, 3, 4, 6, 7, 5, 8, 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("consume order mismatch (-want +got):\n%s", diff)
	}
}

func TestPrefetchBoundsPops(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	for i := range 10 {
		e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, i))
	}
	c := consume(t, tr, 3, "rt_q")
	var ds []*transport.Delivery
	for range 3 {
		ds = append(ds, receive(t, c.Deliveries()))
	}
	noDelivery(t, c.Deliveries(), 300*time.Millisecond)
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 3 {
		t.Fatalf("unacked = %d, want 3 (the prefetch)", n)
	}
	if n, _ := tr.Len(ctx, "rt_q"); n != 7 {
		t.Fatalf("Len = %d, want 7", n)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	receive(t, c.Deliveries())
	noDelivery(t, c.Deliveries(), 300*time.Millisecond)
	if err := c.SetPrefetch(5); err != nil {
		t.Fatal(err)
	}
	receive(t, c.Deliveries())
	receive(t, c.Deliveries())
	noDelivery(t, c.Deliveries(), 300*time.Millisecond)
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 5 {
		t.Fatalf("unacked = %d, want 5", n)
	}
}

// restoredFlags decodes the flags kombu sets on restore.
func restoredFlags(t testing.TB, raw string) (headers, deliveryInfo bool, tag string) {
	t.Helper()
	var env struct {
		Headers    map[string]any `json:"headers"`
		Properties struct {
			DeliveryTag  string         `json:"delivery_tag"`
			DeliveryInfo map[string]any `json:"delivery_info"`
		} `json:"properties"`
	}
	if err := json.Unmarshal([]byte(raw), &env); err != nil {
		t.Fatalf("restored envelope: %v", err)
	}
	return env.Headers["redelivered"] == true, env.Properties.DeliveryInfo["redelivered"] == true, env.Properties.DeliveryTag
}

func TestRejectRequeueGoesToTheBackWithFlags(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	tag := newTag()
	e.push("rt_q", 0, pyEnvelope(tag, "rt_q", 0, 1))
	c := consume(t, tr, 1, "rt_q")
	d := receive(t, c.Deliveries())
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, 2))
	if err := d.Reject(ctx, true); err != nil {
		t.Fatal(err)
	}
	// LPUSH: behind message 2, i.e. at the left end.
	items := e.raw.LRange(ctx, e.key("rt_q"), 0, -1).Val()
	if len(items) != 2 {
		t.Fatalf("queue has %d items, want 2", len(items))
	}
	h, di, gotTag := restoredFlags(t, items[0])
	if !h || !di || gotTag != tag {
		t.Fatalf("requeued item: headers.redelivered=%v delivery_info.redelivered=%v tag=%q", h, di, gotTag)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked = %d after reject", n)
	}
	// The requeued message is delivered again, marked redelivered.
	c2 := consume(t, tr, 2, "rt_q")
	first, second := receive(t, c2.Deliveries()), receive(t, c2.Deliveries())
	if idx(first) != 2 || idx(second) != 1 || !second.Redelivered || first.Redelivered {
		t.Fatalf("after requeue got %d (redelivered %v) then %d (redelivered %v)", idx(first), first.Redelivered, idx(second), second.Redelivered)
	}
}

func TestRejectWithoutRequeueDrops(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, 1))
	c := consume(t, tr, 1, "rt_q")
	d := receive(t, c.Deliveries())
	if err := d.Reject(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked = %d", n)
	}
	if n, _ := tr.Len(ctx, "rt_q"); n != 0 {
		t.Fatalf("Len = %d", n)
	}
}

func TestDeadLetterListReplayPurge(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	tags := []string{newTag(), newTag(), newTag()}
	for i, tag := range tags {
		e.push("rt_q", 6, pyEnvelope(tag, "rt_q", 6, i))
	}
	c := consume(t, tr, 3, "rt_q")
	when := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		d := receive(t, c.Deliveries())
		err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "max-retries", Error: fmt.Sprintf("boom %d", i),
			TaskID: taskID(d), TaskName: "tasks.add", Time: when})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked = %d after dead-lettering", n)
	}
	// The stored item keeps the envelope exactly as popped.
	raw := e.raw.LIndex(ctx, e.key("celeriac.dead.rt_q"), 0).Val()
	var item map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &item); err != nil {
		t.Fatal(err)
	}
	if got, want := string(item["envelope"]), pyEnvelope(tags[0], "rt_q", 6, 0); got != want {
		t.Fatalf("dead envelope mismatch (-want +got):\n%s", cmp.Diff(want, got))
	}
	dead, err := tr.DeadLetters(ctx, "rt_q", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, dm := range dead {
		got = append(got, dm.ID)
		if dm.Reason.Reason != "max-retries" || dm.Reason.TaskName != "tasks.add" || !dm.Reason.Time.Equal(when) ||
			dm.Queue != "rt_q" || dm.RoutingKey != "rt_q" || dm.Message.Headers["task"] != "tasks.add" {
			t.Fatalf("dead message %+v", dm)
		}
	}
	if diff := cmp.Diff(tags, got); diff != "" {
		t.Fatalf("dead letters (-want +got):\n%s", diff)
	}
	if lim, _ := tr.DeadLetters(ctx, "rt_q", 2); len(lim) != 2 {
		t.Fatalf("DeadLetters(limit 2) = %d items", len(lim))
	}

	n, err := tr.Replay(ctx, "rt_q", []string{tags[1]}, transport.ReplayOptions{ResetRetries: true})
	if err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	// Back in its band (priority 6), out of the dead list.
	if items := e.raw.LRange(ctx, e.key("rt_q\x06\x166"), 0, -1).Val(); len(items) != 1 || !strings.Contains(items[0], tags[1]) {
		t.Fatalf("band 6 after replay: %q", items)
	}
	if n, err := tr.Replay(ctx, "rt_q", []string{tags[1]}, transport.ReplayOptions{}); err != nil || n != 0 {
		t.Fatalf("second Replay of the same id = %d, %v", n, err)
	}
	if n, err := tr.PurgeDead(ctx, "rt_q", []string{tags[0]}); err != nil || n != 1 {
		t.Fatalf("PurgeDead(id) = %d, %v", n, err)
	}
	if n, err := tr.PurgeDead(ctx, "rt_q", nil); err != nil || n != 1 {
		t.Fatalf("PurgeDead(all) = %d, %v", n, err)
	}
	if n := e.raw.Exists(ctx, e.key("celeriac.dead.rt_q")).Val(); n != 0 {
		t.Fatal("dead list still exists")
	}
}

func TestUndecodableItemsAreDeadLetteredNotFatal(t *testing.T) {
	pops(t, testUndecodableItemsAreDeadLetteredNotFatal)
}

func testUndecodableItemsAreDeadLetteredNotFatal(t *testing.T, staged bool) {
	e := newEnv(t)
	cfg := e.config()
	cfg.StagedPop = staged
	tr := e.dial(cfg)
	ctx := context.Background()
	e.push("rt_q", 0, "not json \xff")
	e.push("rt_q", 0, `{"properties": {"priority": 0}}`)
	e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, 7))
	c := consume(t, tr, 10, "rt_q")
	d := receive(t, c.Deliveries())
	if idx(d) != 7 {
		t.Fatalf("got message %d, want 7", idx(d))
	}
	dead, err := tr.DeadLetters(ctx, "rt_q", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	for _, dm := range dead {
		if dm.Reason.Reason != "undecodable" || dm.ID == "" || dm.Reason.Time.IsZero() {
			t.Fatalf("dead letter %+v", dm)
		}
	}
	if got := string(dead[0].Message.Body); got != "not json \ufffd" {
		t.Fatalf("raw body of undecodable item = %q", got)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 1 {
		t.Fatalf("unacked = %d, want 1", n)
	}
}

func TestSweepRestoresExpiredMessagesOfOthers(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.VisibilityTimeout = time.Minute
	tr := e.dial(cfg)
	ctx := context.Background()
	// A crashed worker's message: recorded in unacked 2 minutes ago,
	// priority 6 (restored to its band), and a fresh one that stays.
	oldTag, newTag_ := newTag(), newTag()
	oldEnv := pyEnvelope(oldTag, "rt_q", 6, 1)
	e.raw.HSet(ctx, e.key("unacked"), oldTag, "["+oldEnv+`, "", "rt_q"]`)
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: scoreFloat(time.Now().Add(-2 * time.Minute)), Member: oldTag})
	e.raw.HSet(ctx, e.key("unacked"), newTag_, "["+pyEnvelope(newTag_, "rt_q", 0, 2)+`, "", "rt_q"]`)
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: scoreFloat(time.Now()), Member: newTag_})
	// An index entry without a message is cleaned up.
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: 1, Member: "orphan"})
	e.push("rt_q", 6, pyEnvelope(newTag(), "rt_q", 6, 3))

	n, err := tr.Sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v", n, err)
	}
	band := e.raw.LRange(ctx, e.key("rt_q\x06\x166"), 0, -1).Val()
	if len(band) != 2 {
		t.Fatalf("band 6 has %d items", len(band))
	}
	// RPUSH: the restored message is at the right end, consumed next.
	h, di, tag := restoredFlags(t, band[1])
	if !h || !di || tag != oldTag {
		t.Fatalf("restored item: headers.redelivered=%v delivery_info.redelivered=%v tag=%q", h, di, tag)
	}
	if e.raw.HExists(ctx, e.key("unacked"), oldTag).Val() || !e.raw.HExists(ctx, e.key("unacked"), newTag_).Val() {
		t.Fatal("sweep restored the wrong entries")
	}
	if e.raw.ZScore(ctx, e.key("unacked_index"), "orphan").Err() != goredis.Nil {
		t.Fatal("orphan index entry kept")
	}
	if e.raw.Exists(ctx, e.key("unacked_mutex")).Val() != 0 {
		t.Fatal("mutex not released")
	}
	// Another worker holding the mutex: the sweep does nothing.
	e.raw.Set(ctx, e.key("unacked_mutex"), "other", time.Minute)
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: 1, Member: newTag_})
	if n, err := tr.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep under a foreign mutex = %d, %v", n, err)
	}
	if e.raw.Get(ctx, e.key("unacked_mutex")).Val() != "other" {
		t.Fatal("foreign mutex touched")
	}
}

func TestRenewalKeepsHeldMessagesFromOtherSweeps(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.VisibilityTimeout = time.Minute
	cfg.RenewInterval = -1 // renewal driven by the test
	holder := e.dial(cfg)
	other := e.dial(cfg)
	ctx := context.Background()
	tags := []string{newTag(), newTag()}
	for i, tag := range tags {
		e.push("rt_q", 0, pyEnvelope(tag, "rt_q", 0, i))
	}
	c := consume(t, holder, 2, "rt_q")
	d1, d2 := receive(t, c.Deliveries()), receive(t, c.Deliveries())
	_ = d2
	age := func() {
		for _, tag := range tags {
			e.raw.ZAddXX(ctx, e.key("unacked_index"), goredis.Z{Score: scoreFloat(time.Now().Add(-2 * time.Minute)), Member: tag})
		}
	}
	// Both held, scores aged past the visibility timeout, then renewed by
	// the holder: another worker's sweep must leave them alone.
	age()
	if err := holder.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := other.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("other.Sweep after renewal = %d, %v", n, err)
	}
	// The holder's own sweep never restores what it holds.
	age()
	if n, err := holder.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("holder.Sweep of its own deliveries = %d, %v", n, err)
	}
	// Ack one; ZADD XX must not resurrect it in the index.
	if err := d1.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holder.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if e.raw.ZScore(ctx, e.key("unacked_index"), d1.Tag).Err() != goredis.Nil {
		t.Fatal("renewal re-added an acked tag")
	}
	// Without renewal (a dead holder) the other worker restores it.
	age()
	if n, err := other.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("other.Sweep without renewal = %d, %v", n, err)
	}
	if err := d2.Ack(ctx); err != nil {
		t.Fatal(err) // acking a restored message is harmless
	}
}

func TestRenewalTimerRuns(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.VisibilityTimeout = time.Hour
	cfg.RenewInterval = 20 * time.Millisecond
	tr := e.dial(cfg)
	ctx := context.Background()
	tag := newTag()
	e.push("rt_q", 0, pyEnvelope(tag, "rt_q", 0, 1))
	c := consume(t, tr, 1, "rt_q")
	receive(t, c.Deliveries())
	e.raw.ZAdd(ctx, e.key("unacked_index"), goredis.Z{Score: 1000, Member: tag})
	deadline := time.Now().Add(20 * time.Second)
	for e.raw.ZScore(ctx, e.key("unacked_index"), tag).Val() == 1000 {
		if time.Now().After(deadline) {
			t.Fatal("score never renewed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCloseRestoresHeldDeliveriesInOrder(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	for i := range 4 {
		e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, i))
	}
	c := consume(t, tr, 4, "rt_q")
	var ds []*transport.Delivery
	for range 3 { // three handed out, the fourth popped and waiting
		ds = append(ds, receive(t, c.Deliveries()))
	}
	if err := ds[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Ack after Close = %v, want ErrClosed", err)
	}
	if _, ok := <-c.Deliveries(); ok {
		t.Fatal("deliveries still open after Close")
	}
	if !errors.Is(c.Err(), transport.ErrClosed) {
		t.Fatalf("Err = %v", c.Err())
	}
	items := e.raw.LRange(ctx, e.key("rt_q"), 0, -1).Val()
	var got []int
	for i := len(items) - 1; i >= 0; i-- { // consumption order: right to left
		h, di, _ := restoredFlags(t, items[i])
		if !h || !di {
			t.Fatalf("restored item without flags: %s", items[i])
		}
		var env struct {
			Headers struct{ ID string } `json:"headers"`
		}
		json.Unmarshal([]byte(items[i]), &env)
		var n int
		fmt.Sscanf(strings.TrimPrefix(env.Headers.ID, "00000000-0000-4000-8000-"), "%d", &n)
		got = append(got, n)
	}
	if diff := cmp.Diff([]int{0, 2, 3}, got); diff != "" {
		t.Fatalf("restored order (-want +got):\n%s", diff)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked = %d after Close", n)
	}
}

func TestStopRestoresPoppedButUndelivered(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	for i := range 5 {
		e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, i))
	}
	c := consume(t, tr, 5, "rt_q")
	d := receive(t, c.Deliveries())
	// Wait until the other four are popped (recorded in unacked).
	deadline := time.Now().Add(20 * time.Second)
	for e.raw.HLen(ctx, e.key("unacked")).Val() != 5 {
		if time.Now().After(deadline) {
			t.Fatal("batch not popped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 1 {
		t.Fatalf("unacked = %d after Stop, want 1 (the delivery handed out)", n)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack after Stop: %v", err)
	}
	c2 := consume(t, tr, 10, "rt_q")
	for want := 1; want < 5; want++ {
		if got := idx(receive(t, c2.Deliveries())); got != want {
			t.Fatalf("after Stop got %d, want %d", got, want)
		}
	}
}

func TestPublishRouting(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	msg := protocol.Message{ContentType: "application/json", ContentEncoding: "utf-8",
		Headers: map[string]any{"task": "tasks.add", "id": "p1"}, Body: []byte(`[[1], {}, null]`),
		Properties: protocol.Properties{Priority: 4, DeliveryMode: 2}}

	// Default exchange: straight to the band list of the routing key.
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "rt_anon", Message: msg}); err != nil {
		t.Fatal(err)
	}
	items := e.raw.LRange(ctx, e.key("rt_anon\x06\x163"), 0, -1).Val()
	if len(items) != 1 {
		t.Fatalf("band 3 of rt_anon: %q", items)
	}
	m, err := parseMeta([]byte(items[0]))
	if err != nil || len(m.Tag) != 36 || m.Tag[14] != '4' || m.Exchange != "" || m.RoutingKey != "rt_anon" || m.Priority != 4 {
		t.Fatalf("published envelope meta %+v, %v", m, err)
	}
	e2, err := protocol.DecodeEnvelope([]byte(items[0]), protocol.DecodeOptions{})
	if err != nil || string(e2.Message.Body) != `[[1], {}, null]` || e2.BodyEncoding != "base64" {
		t.Fatalf("published envelope: %+v, %v", e2, err)
	}

	// Direct exchange: through the binding set, to every matching queue.
	e.raw.SAdd(ctx, e.key("_kombu.binding.rt_ex"), "k1\x06\x16\x06\x16rt_d1", "k1\x06\x16\x06\x16rt_d2", "k2\x06\x16\x06\x16rt_d3")
	if err := tr.Publish(ctx, &transport.Publishing{Exchange: "rt_ex", RoutingKey: "k1", Message: msg}); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]int64{"rt_d1": 1, "rt_d2": 1, "rt_d3": 0} {
		if n := e.raw.LLen(ctx, e.key(q+"\x06\x163")).Val(); n != want {
			t.Fatalf("%s has %d, want %d", q, n, want)
		}
	}
	// No binding matches: dropped as kombu drops it, not an error.
	if err := tr.Publish(ctx, &transport.Publishing{Exchange: "rt_ex", RoutingKey: "nope", Message: msg}); err != nil {
		t.Fatalf("unroutable publish = %v", err)
	}

	// Topic exchange: bindings made by Consume with kombu's pattern.
	c, err := tr.Consume(ctx, []transport.Queue{{Name: "rt_t1", Exchange: "rt_topic", ExchangeType: transport.Topic, RoutingKey: "a.*.c"},
		{Name: "rt_t2", Exchange: "rt_topic", ExchangeType: transport.Topic, RoutingKey: "a.#"}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	members := e.raw.SMembers(ctx, e.key("_kombu.binding.rt_topic")).Val()
	slices.Sort(members)
	wantMembers := []string{"a.#\x06\x16^a\\..*?$\x06\x16rt_t2", "a.*.c\x06\x16^a\\..*?[^\\.]\\.c$\x06\x16rt_t1"}
	if diff := cmp.Diff(wantMembers, members); diff != "" {
		t.Fatalf("topic bindings (-want +got):\n%s", diff)
	}
	if err := tr.Publish(ctx, &transport.Publishing{Exchange: "rt_topic", ExchangeType: transport.Topic, RoutingKey: "a.b.c", Message: msg}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(ctx, &transport.Publishing{Exchange: "rt_topic", ExchangeType: transport.Topic, RoutingKey: "a.x", Message: msg}); err != nil {
		t.Fatal(err)
	}
	if n1, n2 := e.raw.LLen(ctx, e.key("rt_t1\x06\x163")).Val(), e.raw.LLen(ctx, e.key("rt_t2\x06\x163")).Val(); n1 != 1 || n2 != 2 {
		t.Fatalf("topic routing: t1=%d t2=%d, want 1 and 2", n1, n2)
	}
	if n, err := tr.Purge(ctx, "rt_t2"); err != nil || n != 2 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
}

func TestSubscribeFanoutAsKombu(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	s, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: "celery.pidbox", Queue: "w1@host.celery.pidbox"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "worker.#", Queue: "celeryev.x"})
	if err != nil {
		t.Fatal(err)
	}
	if ok := e.raw.SIsMember(ctx, e.key("_kombu.binding.celery.pidbox"), "\x06\x16\x06\x16w1@host.celery.pidbox").Val(); !ok {
		t.Fatal("pidbox binding missing")
	}
	if ok := e.raw.SIsMember(ctx, e.key("_kombu.binding.celeryev"), "worker.#\x06\x16\x06\x16celeryev.x").Val(); !ok {
		t.Fatal("celeryev binding missing")
	}
	// A Python client's control message: PUBLISH on <prefix>/10.celery.pidbox.
	ctl := `{"body": "eyJtZXRob2QiOiAicGluZyJ9", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"clock": 1, "expires": 0}, "properties": {"delivery_mode": 2, "delivery_info": {"exchange": "celery.pidbox", "routing_key": ""}, "priority": 0, "body_encoding": "base64", "delivery_tag": "t1"}}`
	if n := e.raw.Publish(ctx, e.key("/10.celery.pidbox"), ctl).Val(); n != 1 {
		t.Fatalf("PUBLISH reached %d subscribers", n)
	}
	d := receive(t, s.Deliveries())
	if string(d.Message.Body) != `{"method": "ping"}` || d.Exchange != "celery.pidbox" || d.Queue != "w1@host.celery.pidbox" {
		t.Fatalf("control delivery %+v", d)
	}
	// Events published through the transport go to /10.celeryev/<rk>.
	msg := protocol.Message{ContentType: "application/json", ContentEncoding: "utf-8", Body: []byte(`{"type": "worker-heartbeat"}`)}
	if err := tr.Publish(ctx, &transport.Publishing{Exchange: "celeryev", ExchangeType: transport.Topic, RoutingKey: "worker.heartbeat", Message: msg}); err != nil {
		t.Fatal(err)
	}
	d = receive(t, ev.Deliveries())
	if d.RoutingKey != "worker.heartbeat" || string(d.Message.Body) != `{"type": "worker-heartbeat"}` {
		t.Fatalf("event delivery %+v", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-s.Deliveries(); ok {
		t.Fatal("deliveries open after Close")
	}
	if e.raw.SIsMember(ctx, e.key("_kombu.binding.celery.pidbox"), "\x06\x16\x06\x16w1@host.celery.pidbox").Val() {
		t.Fatal("pidbox binding kept after Close")
	}
}

// killOwnConnections kills this test's client connections only (by the
// client name set with CLIENT SETNAME): other engineers share the server.
func killOwnConnections(t testing.TB, raw *goredis.Client, name string) int {
	t.Helper()
	ctx := context.Background()
	list, err := raw.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		var id, cname string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "name="); ok {
				cname = v
			}
		}
		if cname == name && id != "" {
			if err := raw.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err == nil {
				n++
			}
		}
	}
	return n
}

func TestReconnectAfterConnectionsKilled(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.ReconnectMin = 10 * time.Millisecond
	cfg.ReconnectMax = 100 * time.Millisecond
	tr := e.dial(cfg)
	ctx := context.Background()
	c := consume(t, tr, 10, "rt_q")
	sub, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: "rt_fan"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for round := range 5 {
		for i := range 20 {
			e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, round*100+i))
		}
		for range 20 {
			d := receive(t, c.Deliveries())
			seen[idx(d)] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		if killed := killOwnConnections(t, e.raw, e.name); killed == 0 {
			t.Fatal("no connection of ours found to kill")
		}
	}
	if len(seen) != 100 {
		t.Fatalf("received %d distinct messages, want 100", len(seen))
	}
	if tr.Reconnects() == 0 {
		t.Error("Reconnects() = 0 after the connections were killed")
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked = %d after acks", n)
	}
	// The subscription came back too.
	msg := protocol.Message{ContentType: "application/json", Body: []byte(`{}`)}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := tr.Publish(ctx, &transport.Publishing{Exchange: "rt_fan", ExchangeType: transport.Fanout, Message: msg}); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-sub.Deliveries():
			if d.Exchange != "rt_fan" {
				t.Fatalf("broadcast %+v", d)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscription did not recover")
		}
	}
}

func TestClosedTransport(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	if _, err := tr.Consume(ctx, []transport.Queue{{Name: "rt_q"}}, transport.ConsumeOptions{}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Consume after Close = %v", err)
	}
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "rt_q"}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Publish after Close = %v", err)
	}
	if _, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: "x"}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Subscribe after Close = %v", err)
	}
}

func TestBlockingPopRecordsLikeKombu(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	// The BRPOP path is the one servers before 6.2 take.
	tr.rpopCount = false
	ctx := context.Background()
	c := consume(t, tr, 4, "rt_a", "rt_b")
	// Wait until the consumer blocks in BRPOP (its client shows up as
	// blocked), then push: the message is taken by BRPOP, not the script.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(e.raw.ClientList(ctx).Val(), "name="+e.name+" ") || !blockedIn(e, "brpop") {
		if time.Now().After(deadline) {
			t.Fatal("consumer never blocked in BRPOP")
		}
		time.Sleep(10 * time.Millisecond)
	}
	tag := newTag()
	envelope := pyEnvelope(tag, "rt_b", 9, 1)
	e.push("rt_b", 9, envelope)
	d := receive(t, c.Deliveries())
	if d.Tag != tag || d.Queue != "rt_b" {
		t.Fatalf("delivery %s from %s", d.Tag, d.Queue)
	}
	got := e.raw.HGet(ctx, e.key("unacked"), tag).Val()
	if want := "[" + envelope + `, "", "rt_b"]`; got != want {
		t.Fatalf("unacked value mismatch (-want +got):\n%s", cmp.Diff(want, got))
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// blockedIn reports whether one of this env's clients is blocked in cmd.
func blockedIn(e *env, cmd string) bool {
	for _, line := range strings.Split(e.raw.ClientList(context.Background()).Val(), "\n") {
		if strings.Contains(line, "name="+e.name+" ") && strings.Contains(line, "cmd="+cmd) && strings.Contains(line, "flags=b") {
			return true
		}
	}
	return false
}

// TestIdleWaitPopsAtomically: on Redis >= 6.2 an idle consumer waits in
// BLMOVE of a list onto itself, which takes no message, so a worker killed
// or a connection cut while it waits cannot lose one (BRPOP's window); the
// message that ends the wait is taken and recorded by the atomic script.
func TestIdleWaitPopsAtomically(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	if !tr.rpopCount {
		t.Skip("Redis before 6.2 has no BLMOVE; the consumer uses BRPOP there")
	}
	ctx := context.Background()
	k := keys{prefix: e.prefix, sep: DefaultSep, steps: []int{0, 3, 6, 9}}

	// The wait with a message present returns at once, and the script
	// pipelined behind it has taken the message: off its list and into
	// unacked in one step.
	tag := newTag()
	envelope := pyEnvelope(tag, "rt_a", 0, 1)
	e.push("rt_a", 0, envelope)
	got, err := tr.awaitPop([]string{"rt_a"}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].tag != tag {
		t.Fatalf("awaitPop = %+v, want the message %s", got, tag)
	}
	if n := e.raw.LLen(ctx, k.list("rt_a", 0)).Val(); n != 0 {
		t.Fatalf("list holds %d after the pop, want 0", n)
	}
	if !e.raw.HExists(ctx, e.key("unacked"), tag).Val() {
		t.Fatal("the popped message is not in unacked")
	}
	if err := e.raw.Del(ctx, e.key("unacked"), e.key("unacked_index")).Err(); err != nil {
		t.Fatal(err)
	}

	// A consumer takes a waiting message, then blocks waiting (in BLMOVE,
	// not BRPOP) and gets a message pushed.
	tag = newTag()
	e.push("rt_a", 0, pyEnvelope(tag, "rt_a", 0, 1))
	c := consume(t, tr, 4, "rt_a", "rt_b")
	d := receive(t, c.Deliveries())
	if d.Tag != tag {
		t.Fatalf("delivery %s, want %s", d.Tag, tag)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !blockedIn(e, "blmove") {
		if blockedIn(e, "brpop") {
			t.Fatal("consumer blocked in BRPOP")
		}
		if time.Now().After(deadline) {
			t.Fatal("consumer never blocked in BLMOVE")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tag2 := newTag()
	envelope2 := pyEnvelope(tag2, "rt_b", 9, 1)
	e.push("rt_b", 9, envelope2)
	d2 := receive(t, c.Deliveries())
	if d2.Tag != tag2 || d2.Queue != "rt_b" {
		t.Fatalf("delivery %s from %s", d2.Tag, d2.Queue)
	}
	value := e.raw.HGet(ctx, e.key("unacked"), tag2).Val()
	if want := "[" + envelope2 + `, "", "rt_b"]`; value != want {
		t.Fatalf("unacked value mismatch (-want +got):\n%s", cmp.Diff(want, value))
	}
	for _, d := range []*transport.Delivery{d, d2} {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitReplicas: with WaitReplicas, publishes and acks are followed by
// WAIT; the test server has no replica, so each is written but counted as
// unreplicated. Node names the server.
func TestWaitReplicas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if info, err := e.raw.Info(ctx, "replication").Result(); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the test server has replicas; this test needs none")
	}
	cfg := e.config()
	cfg.WaitReplicas, cfg.WaitTimeout = 1, 20*time.Millisecond
	tr := e.dial(cfg)
	q := "wait_" + randHex(3)
	for i := range 3 {
		if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: protocol.Message{
			Headers: map[string]any{"id": fmt.Sprint(i), "task": "t"}, Body: []byte("[]"),
			ContentType: "application/json", ContentEncoding: "utf-8"}}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 3})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d := receive(t, c.Deliveries())
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Stop(ctx)
	if n, err := e.raw.HLen(ctx, e.key("unacked")).Result(); err != nil || n != 0 {
		t.Errorf("unacked holds %d entries (%v): the acks were not written", n, err)
	}
	// 3 publishes and 3 acks (in one to three batches).
	if got := tr.Unreplicated(); got != 6 {
		t.Errorf("Unreplicated() = %d, want 6", got)
	}
	if tr.Node() == "" || tr.Failovers() != 0 {
		t.Errorf("Node() = %q, Failovers() = %d; want the server and 0", tr.Node(), tr.Failovers())
	}
}

// TestAcquireMutexAfterLostReply: a SET NX repeated after its reply was
// lost finds the mutex taken by itself; the sweep must see that it holds
// it (and release it), not give up and leave it held for 300 s.
func TestAcquireMutexAfterLostReply(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tr := e.dial(e.config())
	// The first SET NX got through; its reply did not.
	if err := e.raw.Set(ctx, e.key("unacked_mutex"), "tok-1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := tr.acquireMutex(ctx, "tok-1"); err != nil || !ok {
		t.Errorf("acquireMutex with the holder's token = %v, %v; want true", ok, err)
	}
	if ok, err := tr.acquireMutex(ctx, "tok-2"); err != nil || ok {
		t.Errorf("acquireMutex with another token = %v, %v; want false", ok, err)
	}
	if err := e.raw.Del(ctx, e.key("unacked_mutex")).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := tr.acquireMutex(ctx, "tok-3"); err != nil || !ok {
		t.Errorf("acquireMutex on a free mutex = %v, %v; want true", ok, err)
	}
}
