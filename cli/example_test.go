package cli_test

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/worker"
)

// A program's main: its tasks, and every command of celeriac around them.
// Built as proj, it runs as `proj -A proj worker -Q a,b -c 8 -l INFO`,
// `proj inspect active`, `proj control shutdown`, `proj status` ...
// (This example is compiled, not run: Main exits.)
func ExampleMain() {
	mux := worker.NewMux()
	worker.Func(mux, "proj.tasks.add", func(ctx context.Context, x, y int) (int, error) {
		return x + y, nil
	})
	cli.Main(mux, cli.Defaults(map[string]string{"queues": "a,b", "concurrency": "8"}))
}

// A flag of the program's own, read by a start hook that opens what the
// tasks need; the stop hook closes it after the warm shutdown, once no
// task runs any more.
func ExampleOnStart() {
	var dsn string
	mux := worker.NewMux()
	worker.Func(mux, "proj.tasks.add", func(ctx context.Context, x, y int) (int, error) {
		return x + y, nil
	})
	ctx, stop := context.WithCancel(context.Background())
	code := cli.Run(ctx, mux, []string{"-b", "memory://", "worker", "--database-url", "postgres://db/proj"},
		cli.WorkerFlags(func(fs *pflag.FlagSet) {
			fs.StringVar(&dsn, "database-url", "", "the program's database")
		}),
		cli.OnStart(func(ctx context.Context) error {
			fmt.Println("pool opened:", dsn)
			time.AfterFunc(100*time.Millisecond, stop) // a SIGTERM, in a real program
			return nil
		}),
		cli.OnStop(func(ctx context.Context) error {
			fmt.Println("pool closed")
			return nil
		}),
		cli.Output(io.Discard, io.Discard),
	)
	fmt.Println("exit status", code)
	// Output:
	// pool opened: postgres://db/proj
	// pool closed
	// exit status 0
}
