package cli

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/beat"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

type beatFlags struct {
	maxInterval float64
	scheduler   string
	leaseTTL    time.Duration
}

func newBeatCmd(g *globalFlags) *cobra.Command {
	f := &beatFlags{}
	cmd := &cobra.Command{
		Use:         "beat",
		Annotations: map[string]string{daemonAnnotation: "beat"},
		Short:       "send periodic tasks: Celery's beat_schedule, with failover between replicas",
		Long: `beat sends the periodic tasks of beat_schedule (--config) as Python's
celery beat does: intervals, crontab in Celery's syntax, solar events, with
Celery's entry fields (task, schedule, args, kwargs, options, relative) and
settings (beat_max_loop_interval, timezone, enable_utc,
beat_cron_starting_deadline).

With a Redis broker (or redbeat_redis_url) any number of beat replicas may
run: one holds a lease in Redis and sends, the others take over within the
lease's TTL when it dies; the last run of each entry is kept in Redis
(RedBeat's keys), so a new leader neither repeats nor skips a run.
--scheduler memory runs a single beat that keeps its state in memory;
--scheduler django reads django-celery-beat's tables (database_url), with
a PostgreSQL advisory lock between replicas. See docs/periodic-tasks.md.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runBeat(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.Float64Var(&f.maxInterval, "max-interval", 0, "seconds between looks at the schedule at most (default beat_max_loop_interval, else 300)")
	fl.StringVarP(&f.scheduler, "scheduler", "S", "", "where the schedule's state and lease live: redis (default with a Redis broker or redbeat_redis_url), memory, or django (django-celery-beat's tables at database_url); Celery's class names are taken too")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 0, "how long a dead leader's lease blocks a standby (default redbeat_lock_timeout, else 5s)")
	return cmd
}

// beatSettings turns the config file's settings into the schedule's.
func (g *globalFlags) beatSettings() (beat.Settings, error) {
	var s beat.Settings
	d, err := beat.ParseDialect(g.file.BeatCelery)
	if err != nil {
		return s, usagef("celeriac_beat_celery: %v", err)
	}
	s.Zone.Dialect = d
	switch {
	case g.file.Timezone != "":
		loc, err := time.LoadLocation(g.file.Timezone)
		if err != nil {
			return s, usagef("timezone %q: %v", g.file.Timezone, err)
		}
		s.Zone.Location = loc
	case g.file.EnableUTC != nil && !*g.file.EnableUTC:
		s.Zone.Location = time.Local
	}
	if v := g.file.BeatCronStartingDeadline; v != nil {
		s.CronStartingDeadline = seconds(*v)
	}
	return s, nil
}

// schedulerAliases maps Celery's -S/--scheduler class names to celeriac's.
var schedulerAliases = map[string]string{
	"redbeat.RedBeatScheduler":                        "redis",
	"redbeat.schedulers.RedBeatScheduler":             "redis",
	"django_celery_beat.schedulers:DatabaseScheduler": "django",
	"django_celery_beat.schedulers.DatabaseScheduler": "django",
	"celery.beat:PersistentScheduler":                 "memory",
	"celery.beat.PersistentScheduler":                 "memory",
}

func runBeat(cmd *cobra.Command, g *globalFlags, f *beatFlags) error {
	if a, ok := schedulerAliases[f.scheduler]; ok {
		f.scheduler = a
	}
	django := f.scheduler == "django"
	if len(g.file.BeatSchedule) == 0 && !django {
		return usagef("no beat_schedule in --config: nothing to send")
	}
	settings, err := g.beatSettings()
	if err != nil {
		return err
	}
	var entries []*beat.Entry
	if len(g.file.BeatSchedule) > 0 {
		if django {
			return usagef("--scheduler django reads the periodic tasks from the database; beat_schedule is not merged into it")
		}
		if entries, err = beat.ParseSchedule(g.file.BeatSchedule, settings); err != nil {
			return usagef("--config %s: %v", g.configFile, err)
		}
	}
	maxInterval := seconds(f.maxInterval)
	if maxInterval <= 0 && g.file.BeatMaxLoopInterval != nil {
		maxInterval = seconds(*g.file.BeatMaxLoopInterval)
	}
	if maxInterval <= 0 && django {
		maxInterval = 5 * time.Second // DatabaseScheduler's default
	}
	leaseTTL := f.leaseTTL
	if leaseTTL <= 0 && g.file.RedbeatLockTimeout != nil {
		leaseTTL = seconds(*g.file.RedbeatLockTimeout)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	var store beat.Store
	rtr, brokerIsRedis := conn.Transport.(*redistransport.Transport)
	switch f.scheduler {
	case "django":
		if g.file.DatabaseURL == "" {
			return usagef("--scheduler django needs database_url in --config: the PostgreSQL database of django-celery-beat's tables")
		}
		pool, err := pgxpool.New(ctx, g.file.DatabaseURL)
		if err != nil {
			return usagef("database_url: %v", err)
		}
		defer pool.Close()
		store = beat.NewDjangoStore(pool, beat.DjangoStoreConfig{Settings: settings})
	case "memory":
		store = beat.NewMemoryStore()
	case "", "redis":
		var rdb *goredis.Client
		cfg := beat.RedisStoreConfig{KeyPrefix: g.file.RedbeatKeyPrefix, LeaseTTL: leaseTTL}
		switch {
		case g.file.RedbeatRedisURL != "":
			opt, err := goredis.ParseURL(g.file.RedbeatRedisURL)
			if err != nil {
				return usagef("redbeat_redis_url: %v", err)
			}
			rdb = goredis.NewClient(opt)
			defer rdb.Close()
		case brokerIsRedis:
			// The broker's own client: the run's record and its
			// message are written by one script.
			rdb = rtr.Client()
			cfg.PrepareLPush = rtr.PrepareLPush
		case f.scheduler == "redis":
			return usagef("--scheduler redis needs a Redis broker or redbeat_redis_url")
		}
		if rdb != nil {
			store = beat.NewRedisStore(rdb, cfg)
		} else {
			g.log.Warn("beat: no Redis for a lease (broker is not Redis, no redbeat_redis_url): " +
				"this beat keeps its state in memory, and a second replica would send every run twice")
			store = beat.NewMemoryStore()
		}
	default:
		return usagef("--scheduler must be redis, memory or django, not %q", f.scheduler)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = fmt.Sprintf("%s (%s, %v)", e.Name, e.Task, e.Schedule)
	}
	g.log.Info("beat: starting", zap.Strings("entries", names), zap.String("scheduler", fmt.Sprintf("%T", store)))
	s := beat.New(beat.Config{
		Entries:         entries,
		Publisher:       conn.Transport,
		Store:           store,
		MaxLoopInterval: maxInterval,
		DefaultQueue:    g.file.TaskDefaultQueue,
		Routes:          staticRoutes(g.file.TaskRoutes),
		Logger:          g.log,
	})
	return s.Run(ctx)
}

// staticRoutes is the task -> queue part of task_routes that names a
// queue per task ({"proj.add": {"queue": "q"}} or {"proj.add": "q"}).
func staticRoutes(r map[string]any) map[string]string {
	out := map[string]string{}
	for task, v := range r {
		switch v := v.(type) {
		case string:
			out[task] = v
		case map[string]any:
			if q, ok := v["queue"].(string); ok {
				out[task] = q
			}
		}
	}
	return out
}
