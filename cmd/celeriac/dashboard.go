package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/cmd/celeriac/internal/dashboard"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

func newDashboardCmd(g *globalFlags) *cobra.Command {
	var (
		listen, token, basicFile, persist string
		queues                            []string
		readOnly, enableEvents            bool
		maxTasks                          int
		refresh                           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve a web dashboard: workers, tasks, queues and dead letters",
		Long: `Serve a web UI for the broker and result backend: the workers (Python and Go,
from Celery's events and remote control), the live task stream with filters,
each task's detail, per-task-name throughput and runtime, queue depths and
priorities, and the dead letters (list, show, replay, purge: the same code as
celeriac dlq).

It listens on 127.0.0.1 unless --listen says otherwise. Reading needs no
credentials; every action (revoke, replay, purge, shutdown, pool and rate
limit changes) needs --auth-token (or $CELERIAC_DASHBOARD_TOKEN) or
--basic-auth-file, and a CSRF token that the pages carry. Without
credentials, or with --read-only, there are no actions.

History is bounded (--max-tasks, the newest kept) and kept in memory; with
--persist it is loaded from and saved to a file.`,
		Example: `  celeriac -b redis://localhost:6379/0 --result-backend redis://localhost:6379/0 dashboard
  CELERIAC_DASHBOARD_TOKEN=s3cret celeriac -b amqp://guest:guest@localhost// dashboard --queue celery
  celeriac dashboard --read-only --listen 127.0.0.1:8080 --persist /var/lib/celeriac/dashboard.json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = os.Getenv("CELERIAC_DASHBOARD_TOKEN")
			}
			var basic map[string]string
			if basicFile != "" {
				var err error
				if basic, err = readBasicAuth(basicFile); err != nil {
					return usagef("--basic-auth-file: %v", err)
				}
			}
			if maxTasks < 1 {
				return usagef("--max-tasks must be at least 1")
			}
			// SIGINT/SIGTERM stop the server and save --persist.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			conn, err := g.open(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			var qs []string
			for _, q := range queues {
				for _, s := range strings.Split(q, ",") {
					if s = strings.TrimSpace(s); s != "" {
						qs = append(qs, s)
					}
				}
			}
			d, err := dashboard.New(dashboard.Options{
				Transport: conn.Transport, BrokerScheme: conn.BrokerScheme, Backend: conn.Backend,
				Inspector: queueInspector(conn.Transport), Queues: qs, MaxTasks: maxTasks,
				PersistFile: persist, AuthToken: token, BasicAuth: basic, ReadOnly: readOnly,
				EnableEvents: enableEvents, RefreshEvery: refresh, Logger: g.log.Named("dashboard"),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- d.Run(ctx) }()
			go func() {
				<-ctx.Done()
				sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer c()
				_ = srv.Shutdown(sctx)
			}()
			mode := "actions with credentials"
			switch {
			case readOnly:
				mode = "read-only"
			case token == "" && len(basic) == 0:
				mode = "read-only (no --auth-token or --basic-auth-file)"
			}
			g.log.Info("dashboard ready", zap.String("url", "http://"+ln.Addr().String()+"/"), zap.String("mode", mode))
			serveErr := make(chan error, 1)
			go func() { serveErr <- srv.Serve(ln) }()
			select {
			case err := <-serveErr:
				cancel()
				<-runErr
				if errors.Is(err, http.ErrServerClosed) {
					return nil
				}
				return err
			case err := <-runErr:
				cancel()
				<-serveErr
				return err
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:5555", "address to serve on (loopback by default)")
	f.StringVar(&token, "auth-token", "", "token that allows actions (default $CELERIAC_DASHBOARD_TOKEN)")
	f.StringVar(&basicFile, "basic-auth-file", "", "file of user:password lines that allow actions (HTTP basic auth)")
	f.BoolVar(&readOnly, "read-only", false, "no actions at all")
	f.StringArrayVarP(&queues, "queue", "Q", nil, "queues to show besides those the workers consume (repeatable, or comma-separated)")
	f.IntVar(&maxTasks, "max-tasks", 10000, "tasks kept in memory, the newest")
	f.StringVar(&persist, "persist", "", "file to load history from at start and save it to every minute and at exit")
	f.BoolVar(&enableEvents, "enable-events", true, "tell workers to send task events (enable_events) every --refresh, as Flower does")
	f.DurationVar(&refresh, "refresh", 10*time.Second, "how often workers are asked for stats and queues, and queue depths sampled")
	return cmd
}

// readBasicAuth reads user:password lines; blank lines and # comments are
// skipped.
func readBasicAuth(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		u, p, ok := strings.Cut(line, ":")
		if !ok || u == "" || p == "" {
			return nil, fmt.Errorf("line %d: want user:password", n)
		}
		out[u] = p
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no user:password line")
	}
	return out, nil
}

// queueInspector adapts the transports' own queue reports to the
// dashboard's: RabbitMQ's consumers and x-max-priority, Redis's bands.
func queueInspector(tr any) dashboard.QueueInspector {
	switch t := tr.(type) {
	case *amqptransport.Transport:
		return inspectFunc(func(ctx context.Context, q string) (dashboard.QueueDetail, error) {
			info, err := t.QueueInfo(ctx, q)
			return dashboard.QueueDetail{Depth: info.Messages, Consumers: info.Consumers, MaxPriority: info.MaxPriority}, err
		})
	case *redistransport.Transport:
		return inspectFunc(func(ctx context.Context, q string) (dashboard.QueueDetail, error) {
			bands, err := t.BandLens(ctx, q)
			det := dashboard.QueueDetail{Consumers: -1, MaxPriority: -1}
			for _, b := range bands {
				det.Depth += b.Len
				det.Bands = append(det.Bands, dashboard.QueueBand{Priority: b.Priority, Len: b.Len})
			}
			return det, err
		})
	}
	return nil
}

type inspectFunc func(ctx context.Context, q string) (dashboard.QueueDetail, error)

func (f inspectFunc) Inspect(ctx context.Context, q string) (dashboard.QueueDetail, error) {
	return f(ctx, q)
}
