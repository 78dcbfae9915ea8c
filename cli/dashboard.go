package cli

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

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/internal/dashboard"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

func newDashboardCmd(g *globalFlags) *cobra.Command {
	var (
		listen, token, basicFile, persist string
		queues, allowedHosts              []string
		readOnly, enableEvents, insecure  bool
		urlPrefix, brokerAPI              string
		maxTasks                          int
		refresh                           time.Duration
	)
	cmd := &cobra.Command{
		Use:         "dashboard",
		Annotations: map[string]string{daemonAnnotation: "dashboard"},
		Short:       "Serve a web dashboard: workers, tasks, queues and dead letters",
		Long: `Serve a web UI for the broker and result backend: the workers (Python and Go,
from Celery's events and remote control), the live task stream with filters,
each task's detail, per-task-name throughput and runtime, queue depths and
priorities, and the dead letters (list, show, replay, purge: the same code as
celeriac dlq).

It listens on 127.0.0.1 unless --listen says otherwise. With --auth-token (or
$CELERIAC_DASHBOARD_TOKEN) or --basic-auth-file every page needs the
credentials, and every action (revoke, replay, purge, shutdown, pool and
rate limit changes) needs them and a CSRF token that the pages carry.
Without credentials pages are public and there are no actions and no dead
letters; a --listen address that is not loopback then needs
--insecure-no-auth. Requests must name the dashboard in their Host header:
the --listen host, a loopback name, or an --allowed-host (a defence against
DNS rebinding). With --read-only there are no actions and no remote-control
command is sent. See docs/security.md.

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
			hosts, anyIP, loopback := listenHosts(listen)
			anonymous := token == "" && len(basic) == 0
			if !loopback && anonymous && !insecure {
				return usagef("--listen %s is not a loopback address: give --auth-token or --basic-auth-file, "+
					"or --insecure-no-auth to let anyone who reaches it read task arguments and results", listen)
			}
			for _, h := range allowedHosts {
				for _, s := range strings.Split(h, ",") {
					if s = strings.TrimSpace(s); s != "" {
						hosts = append(hosts, s)
					}
				}
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
			var api *dashboard.RabbitAPI
			if brokerAPI != "" {
				if conn.BrokerScheme != "amqp" {
					return usagef("--broker-api is RabbitMQ's management API: the broker is %s", conn.BrokerScheme)
				}
				if api, err = rabbitAPI(brokerAPI, g.options().BrokerURL); err != nil {
					return usagef("--broker-api: %v", err)
				}
				g.log.Info("unacked counts and rates from RabbitMQ's management API", zap.Stringer("broker_api", api))
			}
			// /api/task/async-apply sends with Celery's defaults, as
			// `celeriac send` does.
			sender := client.New(conn.Transport, client.Config{DefaultQueue: g.file.TaskDefaultQueue, Backend: conn.Backend})
			d, err := dashboard.New(dashboard.Options{
				Transport: conn.Transport, BrokerScheme: conn.BrokerScheme, Backend: conn.Backend, Client: sender,
				Inspector: queueInspector(conn.Transport, api), Queues: qs, MaxTasks: maxTasks,
				PersistFile: persist, AuthToken: token, BasicAuth: basic, ReadOnly: readOnly,
				AllowedHosts: hosts, AllowIPHosts: anyIP, URLPrefix: urlPrefix,
				EnableEvents: enableEvents, RefreshEvery: refresh, Logger: g.log.Named("dashboard"),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := d.Server()
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
			case anonymous:
				mode = "read-only (no --auth-token or --basic-auth-file)"
			}
			if !loopback && anonymous {
				g.log.Warn("THE DASHBOARD IS PUBLIC: it listens on a non-loopback address without credentials; anyone who reaches it reads task arguments, results and tracebacks",
					zap.String("listen", listen))
			}
			g.log.Info("dashboard ready", zap.String("url", "http://"+ln.Addr().String()+strings.TrimRight("/"+strings.Trim(urlPrefix, "/"), "/")+"/"), zap.String("mode", mode))
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
	f.StringVar(&token, "auth-token", "", "token every page and action needs (default $CELERIAC_DASHBOARD_TOKEN)")
	f.StringVar(&basicFile, "basic-auth-file", "", "file of user:password lines (HTTP basic auth) every page and action needs")
	f.BoolVar(&readOnly, "read-only", false, "no actions and no remote-control commands at all")
	f.StringVar(&urlPrefix, "url-prefix", "", "serve under this path (/flower) for a reverse proxy that forwards it unchanged")
	f.StringVar(&brokerAPI, "broker-api", "", "RabbitMQ's management API (http://user:pass@host:15672/api/; the broker's credentials when none), for unacked counts and rates, as Flower's --broker_api")
	f.StringArrayVar(&allowedHosts, "allowed-host", nil, "host name requests may give in their Host header besides the --listen host and loopback names (repeatable, or comma-separated)")
	f.BoolVar(&insecure, "insecure-no-auth", false, "serve a non-loopback --listen address without credentials")
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
// dashboard's: RabbitMQ's consumers and x-max-priority (and, with api,
// its unacked counts and rates), Redis's bands and unacked hash.
func queueInspector(tr any, api *dashboard.RabbitAPI) dashboard.QueueInspector {
	switch t := tr.(type) {
	case *amqptransport.Transport:
		return inspectFunc(func(ctx context.Context, q string) (dashboard.QueueDetail, error) {
			info, err := t.QueueInfo(ctx, q)
			det := dashboard.QueueDetail{Depth: info.Messages, Consumers: info.Consumers, MaxPriority: info.MaxPriority, Unacked: -1}
			if err != nil || api == nil {
				return det, err
			}
			// AMQP's own figures stay the depth and consumers: the API's
			// lag behind by its statistics interval.
			if rq, err := api.Queue(ctx, q); err != nil {
				det.UnackedErr = err.Error()
			} else {
				det.Unacked = rq.Unacked
				det.PublishRate, det.AckRate, det.HasRates = rq.PublishRate, rq.AckRate, rq.HasRates
			}
			return det, nil
		})
	case *redistransport.Transport:
		return redisInspector{t}
	}
	return nil
}

type inspectFunc func(ctx context.Context, q string) (dashboard.QueueDetail, error)

func (f inspectFunc) Inspect(ctx context.Context, q string) (dashboard.QueueDetail, error) {
	return f(ctx, q)
}

type redisInspector struct{ t *redistransport.Transport }

func (r redisInspector) Inspect(ctx context.Context, q string) (dashboard.QueueDetail, error) {
	bands, err := r.t.BandLens(ctx, q)
	det := dashboard.QueueDetail{Consumers: -1, MaxPriority: -1, Unacked: -1}
	for _, b := range bands {
		det.Depth += b.Len
		det.Bands = append(det.Bands, dashboard.QueueBand{Priority: b.Priority, Len: b.Len})
	}
	return det, err
}

// maxUnackedScan bounds the entries of kombu's unacked hash read per
// sample: beyond it the dashboard shows lower bounds.
const maxUnackedScan = 10000

// CountUnacked counts by routing key, which names the queue under
// Celery's default routing; kombu records no queue in the hash.
func (r redisInspector) CountUnacked(ctx context.Context) (dashboard.UnackedCounts, error) {
	c, err := r.t.UnackedByRoutingKey(ctx, maxUnackedScan)
	return dashboard.UnackedCounts{ByQueue: c.ByRoutingKey, AtLeast: c.Capped}, err
}

// rabbitAPI is the --broker-api client for the broker's vhost, with the
// broker's credentials unless the API URL has its own.
func rabbitAPI(apiURL, brokerURL string) (*dashboard.RabbitAPI, error) {
	first, _, _ := strings.Cut(brokerURL, ";")
	uri, err := amqptransport.ParseURI(first)
	if err != nil {
		return nil, err
	}
	return dashboard.NewRabbitAPI(apiURL, uri.Vhost, uri.Username, uri.Password)
}

// listenHosts reads a --listen address: the host names its Host headers
// may carry (its own host, when a name or address), whether it listens on
// all interfaces (then any IP address is a valid Host), and whether it is
// loopback only.
func listenHosts(listen string) (hosts []string, anyIP, loopback bool) {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if host == "" {
		return nil, true, false
	}
	if host == "localhost" {
		return []string{host}, false, true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return nil, true, false
		}
		return []string{host}, false, ip.IsLoopback()
	}
	return []string{host}, false, false
}
