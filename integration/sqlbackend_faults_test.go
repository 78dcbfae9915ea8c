package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/worker"
)

// privatePG is a PostgreSQL server of the test's own (initdb in a temporary
// directory, its own port), so that it can be restarted without touching
// the shared one. As root, its commands run as the postgres user.
type privatePG struct {
	bin, dir, port string
}

func startPrivatePG(t *testing.T) *privatePG {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		unavailable(t, "no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)")
	}
	sort.Strings(bins)
	dir, err := os.MkdirTemp("", "celeriac-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	p := &privatePG{bin: filepath.Dir(bins[len(bins)-1]), dir: dir, port: port}
	if os.Getuid() == 0 {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
	}
	p.run(t, "initdb", "-D", filepath.Join(dir, "data"), "-A", "trust", "-U", "postgres", "--no-sync")
	p.start(t)
	t.Cleanup(func() {
		// Stopped already, when the test left it down: nothing to do.
		_ = exec.Command("runuser", "-u", "postgres", "--", filepath.Join(p.bin, "pg_ctl"), "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate").Run()
		_ = exec.Command(filepath.Join(p.bin, "pg_ctl"), "-D", filepath.Join(dir, "data"), "stop", "-m", "immediate").Run()
	})
	return p
}

// lossCounter is a worker.Observer that counts lost results.
type lossCounter struct {
	mu   sync.Mutex
	lost []protocol.State
}

func (*lossCounter) TaskReceived(string)                                {}
func (*lossCounter) TaskWaiting(string, string, time.Duration)          {}
func (*lossCounter) TaskStarted(string)                                 {}
func (*lossCounter) TaskFinished(string, worker.Outcome, time.Duration) {}
func (*lossCounter) MessageRejected(string)                             {}
func (c *lossCounter) ResultLost(s protocol.State) {
	c.mu.Lock()
	c.lost = append(c.lost, s)
	c.mu.Unlock()
}

func (c *lossCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lost)
}

func (p *privatePG) run(t *testing.T, prog string, args ...string) {
	t.Helper()
	argv := append([]string{filepath.Join(p.bin, prog)}, args...)
	if os.Getuid() == 0 {
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out.String())
	}
}

func (p *privatePG) ctl(t *testing.T, args ...string) {
	t.Helper()
	p.run(t, "pg_ctl", append([]string{"-D", filepath.Join(p.dir, "data"), "-w", "-t", "60"}, args...)...)
}

func (p *privatePG) start(t *testing.T) {
	t.Helper()
	p.ctl(t, "-l", filepath.Join(p.dir, "log"), "-o",
		fmt.Sprintf("-p %s -k %s -c listen_addresses=127.0.0.1 -c fsync=off", p.port, p.dir), "start")
}

func (p *privatePG) url() string {
	return "postgres://postgres@127.0.0.1:" + p.port + "/postgres"
}

// TestSQLBackendSurvivesPostgresRestart: a celeriac worker stores 600
// results while its PostgreSQL is stopped (fast shutdown, connections
// killed) and started again mid-run. Every result is written: the writes
// that fail meanwhile are retried within the worker's result budget, and
// none is given up. Then PostgreSQL stays down: the next results are given
// up when the budget (ResultTimeout, 30 s here) runs out, logged and counted as lost
// (worker.LossObserver, celeriac_results_lost_total), never dropped
// silently.
func TestSQLBackendSurvivesPostgresRestart(t *testing.T) {
	pg := startPrivatePG(t)
	be, err := sqlbackend.New(t.Context(), sqlbackend.Config{URL: "db+postgresql+psycopg2" + strings.TrimPrefix(pg.url(), "postgres"), StatementTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	queue := "it_sql_flt_" + strings.ToLower(rand.Text()[:8])
	tr, _ := amqpTransport(t, amqptransport.Config{})
	deleteAMQP(t, queue)
	mux := worker.NewMux()
	// Tasks after the first 100 wait until PostgreSQL is down, so that
	// their results are written into the outage whatever the timing.
	down := make(chan struct{})
	mux.HandleFunc("it_sql.slow", func(ctx context.Context, task *worker.Task) (any, error) {
		var i int
		if _, err := fmt.Sscanf(task.ID[strings.LastIndex(task.ID, "-")+1:], "%d", &i); err == nil && i >= 100 {
			select {
			case <-down:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return task.ID, nil
	})
	core, logs := observer.New(zap.ErrorLevel)
	losses := &lossCounter{}
	// A result budget of 30 s (the default is 5 minutes) so that the
	// outage past it fits the test.
	w, err := worker.New(tr, mux, worker.Config{Queues: []string{queue}, Concurrency: 4, Backend: be, AcksLate: true,
		Logger: zap.New(core), Observer: losses, ResultTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker Run: %v", err)
		}
	})
	defer func() { stop(); wg.Wait() }()

	const n = 600
	publish := func(id string) {
		msg, err := protocol.EncodeTask(&protocol.TaskMessage{ID: id, Name: "it_sql.slow", Args: []any{}, Kwargs: map[string]any{},
			RootID: id, CorrelationID: id, DeliveryMode: 2}, protocol.EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: queue, Message: *msg}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		publish(fmt.Sprintf("%s-%03d", queue, i))
	}
	count := func() int {
		rows := pgQueryURL(t, pg.url(), "SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")
		var c int
		fmt.Sscan(rows[0][0], &c)
		return c
	}
	deadline := time.Now().Add(time.Minute)
	for count() < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d results after a minute", count())
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := count()
	pg.ctl(t, "stop", "-m", "fast")
	close(down)
	time.Sleep(1500 * time.Millisecond) // the worker goes on running tasks meanwhile
	pg.start(t)
	deadline = time.Now().Add(2 * time.Minute)
	for count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d results after the restart; stats %+v", count(), n, be.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := be.Stats()
	t.Logf("COUNTS postgres restart: %d results before the restart, %d after; backend retries %d, given up %d", before, n, st.StoreRetries, st.StoreFailures)
	if before != 100 {
		t.Fatalf("%d results before the restart, want the 100 tasks that did not wait", before)
	}
	if st.StoreRetries == 0 {
		t.Errorf("no write was retried: the restart did not hit a write")
	}
	if st.StoreFailures != 0 {
		t.Errorf("%d writes were given up", st.StoreFailures)
	}
	got := pgQueryURL(t, pg.url(), "SELECT count(DISTINCT task_id) FROM celery_taskmeta WHERE task_id LIKE $1 AND status = 'SUCCESS' AND result IS NOT NULL", queue+"-%")
	if got[0][0] != fmt.Sprint(n) {
		t.Errorf("%s distinct SUCCESS rows, want %d", got[0][0], n)
	}
	if losses.count() != 0 {
		t.Fatalf("%d results lost across the restart", losses.count())
	}

	// Down for longer than the budget: given up, logged, counted.
	pg.ctl(t, "stop", "-m", "fast")
	publish(queue + "-lost-1000")
	publish(queue + "-lost-1001")
	deadline = time.Now().Add(90 * time.Second)
	for losses.count() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d results counted lost after 90 s with PostgreSQL down, want 2", losses.count())
		}
		time.Sleep(100 * time.Millisecond)
	}
	logged := logs.FilterMessage("storing the task state failed").Len()
	t.Logf("COUNTS postgres down: %d results lost, %d logged", losses.count(), logged)
	if logged != 2 {
		t.Errorf("%d lost results logged, want 2", logged)
	}
}
