package sql

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// forEachSchema runs f on a fresh backend of each schema.
func forEachSchema(t *testing.T, cfg Config, f func(t *testing.T, b *Backend)) {
	t.Run("sqlalchemy", func(t *testing.T) {
		b := newSQLAlchemy(t, cfg)
		defer b.Close()
		f(t, b)
	})
	t.Run("django", func(t *testing.T) {
		b, _ := newDjango(t, cfg)
		defer b.Close()
		f(t, b)
	})
}

// uniqueChannel returns a notify channel no other test listens on.
func uniqueChannel(t testing.TB) string {
	return "bt_sql_" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

func storeState(t testing.TB, b *Backend, id string, st protocol.State) {
	t.Helper()
	m := &protocol.ResultMeta{TaskID: id, Status: st, Result: int64(1)}
	if st.Ready() {
		m.DateDone = time.Now().UTC()
	}
	if err := b.Store(context.Background(), backend.StoreRequest{Meta: m}); err != nil {
		t.Fatalf("Store %s %s: %v", id, st, err)
	}
}

type waited struct {
	m   *protocol.ResultMeta
	err error
}

func waitAsync(ctx context.Context, b *Backend, id string) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		m, err := b.Wait(ctx, id)
		ch <- waited{m, err}
	}()
	return ch
}

// listening waits until b's LISTEN connection is up and returns its server
// process id.
func listening(t *testing.T, b *Backend) uint32 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b.lisMu.Lock()
		l := b.lis
		b.lisMu.Unlock()
		if l != nil {
			if pid := l.pid.Load(); pid != 0 {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no LISTEN connection after 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWaitWakesOnNotify: a Wait that would not poll again for an hour
// returns when celeriac stores the task's ready state: the store's NOTIFY
// woke it. A state that is not ready wakes it without ending it.
func TestWaitWakesOnNotify(t *testing.T) {
	forEachSchema(t, Config{}, func(t *testing.T, b *Backend) {
		b.pollMin, b.pollMax = time.Hour, time.Hour
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		w := waitAsync(ctx, b, "bt-wait-notify")
		listening(t, b)
		storeState(t, b, "bt-wait-notify", protocol.StateStarted)
		storeState(t, b, "bt-wait-notify", protocol.StateSuccess)
		r := <-w
		if r.err != nil || r.m.Status != protocol.StateSuccess {
			t.Fatalf("Wait = %+v, %v; want SUCCESS", r.m, r.err)
		}
		// A result stored before the Wait is read at once.
		if m, err := b.Wait(ctx, "bt-wait-notify"); err != nil || m.Status != protocol.StateSuccess {
			t.Fatalf("second Wait = %+v, %v", m, err)
		}
	})
}

// TestWaitPollsForPythonRows: rows written without a notification, as
// Python's backends write them, are found by the fallback poll.
func TestWaitPollsForPythonRows(t *testing.T) {
	forEachSchema(t, Config{}, func(t *testing.T, b *Backend) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		w := waitAsync(ctx, b, "bt-wait-python")
		listening(t, b)
		if b.schema == Django {
			// The backend's URL sets the search_path to the test's schema.
			execSQL(t, "SET search_path TO "+b.s.pool.ConnConfig.RuntimeParams["search_path"],
				"INSERT INTO "+b.s.taskTable+" (task_id, status, content_type, content_encoding, result, date_done, date_created, meta) "+
					"VALUES ('bt-wait-python', 'SUCCESS', 'application/json', 'utf-8', '5', now(), now(), '{\"children\": []}')")
		} else {
			execSQL(t, "INSERT INTO "+b.s.taskTable+" (id, task_id, status, date_done) VALUES (nextval("+
				quoteLiteral(b.s.taskSeq)+"), 'bt-wait-python', 'SUCCESS', now())")
		}
		start := time.Now()
		r := <-w
		if r.err != nil || r.m.Status != protocol.StateSuccess {
			t.Fatalf("Wait = %+v, %v; want SUCCESS", r.m, r.err)
		}
		// The poll runs at least every 500 ms.
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Wait returned %v after the insert", d)
		}
	})
}

// TestNotifyOnStore: a store notifies the channel with the task id in its
// transaction; a store that leaves a SUCCESS alone, and any store with
// NoNotify, does not notify.
func TestNotifyOnStore(t *testing.T) {
	channel := uniqueChannel(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, transporttest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			return ""
		}
		return n.Payload
	}
	forEachSchema(t, Config{NotifyChannel: channel}, func(t *testing.T, b *Backend) {
		storeState(t, b, "bt-notify-1", protocol.StateStarted)
		if p := next(); p != "bt-notify-1" {
			t.Fatalf("notification %q, want the task id", p)
		}
		storeState(t, b, "bt-notify-1", protocol.StateSuccess)
		if p := next(); p != "bt-notify-1" {
			t.Fatalf("notification %q, want the task id", p)
		}
		storeState(t, b, "bt-notify-1", protocol.StateFailure) // SUCCESS stays
		if p := next(); p != "" {
			t.Fatalf("notification %q for a store that changed nothing", p)
		}
		// Concurrent stores commit together: each is notified.
		errs := make(chan error, 10)
		for i := range 10 {
			go func() {
				errs <- b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "bt-notify-c" + strconv.Itoa(i), Status: protocol.StateSuccess}})
			}()
		}
		for range 10 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		seen := map[string]bool{}
		for range 10 {
			seen[next()] = true
		}
		if len(seen) != 10 || seen[""] {
			t.Errorf("notified %v, want the 10 task ids", seen)
		}
	})
	forEachSchema(t, Config{NotifyChannel: channel, NoNotify: true}, func(t *testing.T, b *Backend) {
		storeState(t, b, "bt-notify-2", protocol.StateSuccess)
		if p := next(); p != "" {
			t.Fatalf("notification %q with NoNotify", p)
		}
	})
}

// TestWaitListenReconnect: when the LISTEN connection is lost, Wait keeps
// working; the listener reconnects and later stores wake Waits again.
func TestWaitListenReconnect(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	b.pollMin, b.pollMax = time.Hour, time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := waitAsync(ctx, b, "bt-wait-reconnect")
	pid := listening(t, b)
	execSQL(t, "SELECT pg_terminate_backend("+strconv.FormatUint(uint64(pid), 10)+")")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p := b.lis.pid.Load(); p != 0 && p != pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the LISTEN connection was not reopened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	storeState(t, b, "bt-wait-reconnect", protocol.StateSuccess)
	if r := <-w; r.err != nil || r.m.Status != protocol.StateSuccess {
		t.Fatalf("Wait = %+v, %v", r.m, r.err)
	}
}

// TestWaitEnds: a Wait ends with its context, and with Close.
func TestWaitEnds(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := b.Wait(short, "bt-never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the deadline", err)
	}
	w := waitAsync(t.Context(), b, "bt-never")
	listening(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-w; !errors.Is(r.err, backend.ErrClosed) {
		t.Fatalf("Wait after Close = %v, want ErrClosed", r.err)
	}
	if _, err := b.Wait(t.Context(), "bt-never"); !errors.Is(err, backend.ErrClosed) {
		t.Fatalf("Wait on a closed backend = %v", err)
	}
}

func TestNotifyChannelConfig(t *testing.T) {
	_, err := Config{URL: "postgres://x/y", NotifyChannel: string(make([]byte, 64))}.settings()
	if err == nil {
		t.Error("a 64-byte channel was accepted")
	}
	s, err := Config{URL: "postgres://x/y"}.settings()
	if err != nil || s.channel != "celeriac_result" || !s.notify {
		t.Errorf("defaults: channel %q notify %v, %v", s.channel, s.notify, err)
	}
}

// BenchmarkWaitWake measures how long after a store starts a blocked Wait
// returns. "notify": celeriac's NOTIFY wakes it (its poll is set to an
// hour, so nothing else can). "poll": with NoNotify, as for the rows a
// Python worker writes, a Wait that has waited 1 s already (its poll
// interval then 320-500 ms) finds the row by polling.
func BenchmarkWaitWake(b *testing.B) {
	for _, bc := range []struct {
		name     string
		noNotify bool
		before   time.Duration
	}{
		{"notify", false, 2 * time.Millisecond},
		{"poll", true, time.Second},
	} {
		b.Run(bc.name, func(b *testing.B) {
			be := newSQLAlchemy(b, Config{NoNotify: bc.noNotify, NotifyChannel: uniqueChannel(b)})
			defer be.Close()
			if !bc.noNotify {
				be.pollMin, be.pollMax = time.Hour, time.Hour
			}
			ctx := context.Background()
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := "bt-wake-" + strconv.Itoa(i)
				woke := make(chan time.Time, 1)
				go func() {
					_, _ = be.Wait(ctx, id)
					woke <- time.Now()
				}()
				time.Sleep(bc.before) // let the Wait block
				start := time.Now()
				storeState(b, be, id, protocol.StateSuccess)
				total += (<-woke).Sub(start)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
		})
	}
}

// BenchmarkStoreNotify compares the throughput of concurrent stores with
// and without the NOTIFY.
func BenchmarkStoreNotify(b *testing.B) {
	for _, noNotify := range []bool{false, true} {
		b.Run("nonotify="+strconv.FormatBool(noNotify), func(b *testing.B) {
			be := newSQLAlchemy(b, Config{NoNotify: noNotify, NotifyChannel: uniqueChannel(b)})
			defer be.Close()
			b.SetParallelism(8)
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					storeState(b, be, "bt-store-"+strconv.FormatInt(n.Add(1), 10), protocol.StateSuccess)
				}
			})
		})
	}
}
