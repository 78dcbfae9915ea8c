// Command ownbinary is a team's own worker binary: two tasks of its own,
// and every command of celeriac around them (worker with Celery's flags,
// inspect, control, status, purge, send, result, dlq, dashboard, events)
// from package cli, with defaults set in code, a flag of its own and a
// resource opened before the first task and closed after the last.
//
//	go build -o proj ./examples/ownbinary
//	CELERY_BROKER_URL=redis://localhost:6379/0 ./proj -A proj worker -Q a,b -c 8 -l INFO
//	./proj -A proj inspect registered
package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/worker"
)

// store stands for what a real program opens at start (a database pool):
// the tasks use it, the worker opens it before taking work and closes it
// after the warm shutdown.
type store struct {
	name   string
	closed atomic.Bool
}

func main() {
	var dsn string
	var db atomic.Pointer[store]

	mux := worker.NewMux()
	// proj.tasks.add(x, y): Python calls it as app.send_task("proj.tasks.add", args=[2, 3]).
	worker.Func(mux, "proj.tasks.add", func(ctx context.Context, x, y int) (int, error) {
		return x + y, nil
	})
	// proj.tasks.render(kib, ms): builds a buffer of kib KiB, holds it for
	// ms milliseconds (a render, an export), returns its size, checksum and
	// the store it would write to.
	worker.Func(mux, "proj.tasks.render", func(ctx context.Context, kib, ms int) (map[string]any, error) {
		s := db.Load()
		if s == nil || s.closed.Load() {
			return nil, errors.New("store not open")
		}
		buf := make([]byte, kib*1024)
		for i := range buf {
			buf[i] = byte(i)
		}
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// The buffer is in use until here (a checksum of what would be
		// uploaded): the memory is held for the whole task.
		return map[string]any{"bytes": len(buf), "crc32": crc32.ChecksumIEEE(buf), "store": s.name}, nil
	})

	cli.Main(mux,
		cli.Defaults(map[string]string{"queues": "a,b", "concurrency": "8"}),
		cli.WorkerFlags(func(fs *pflag.FlagSet) {
			fs.StringVar(&dsn, "store", "mem://proj", "where proj.tasks.render writes")
		}),
		cli.OnStart(func(ctx context.Context) error {
			db.Store(&store{name: dsn})
			fmt.Println("store opened:", dsn)
			return nil
		}),
		cli.OnStop(func(ctx context.Context) error {
			db.Load().closed.Store(true)
			fmt.Println("store closed:", dsn)
			return nil
		}),
	)
}
