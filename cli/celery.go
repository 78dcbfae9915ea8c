package cli

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// Celery's command line, flag for flag (celery/bin/celery.py, base.py and
// worker.py of Celery 5.2): every option of `celery worker` and the global
// ones either work with Celery's meaning or are accepted with one warning
// that says what celeriac does instead. None is "unknown": command lines
// of systemd units and Kubernetes manifests written for Celery run as they
// are.

// celeryGlobals are Celery's global options that celeriac has no use for.
type celeryGlobals struct {
	app, loader, workdir string
	noColor, quiet       bool
}

func (c *celeryGlobals) register(fl *pflag.FlagSet) {
	fl.StringVarP(&c.app, "app", "A", "", "Celery's application module: accepted and ignored (the tasks are the Go handlers compiled into this program)")
	fl.StringVar(&c.loader, "loader", "", "Celery's loader: accepted and ignored")
	fl.StringVar(&c.workdir, "workdir", "", "change to this directory first (Celery's --workdir)")
	fl.BoolVarP(&c.noColor, "no-color", "C", false, "accepted for Celery compatibility (logs have no colour)")
	fl.BoolVarP(&c.quiet, "quiet", "q", false, "log only warnings and errors (client commands do by default)")
}

// apply changes directory and notes what is ignored. It runs before the
// config file is read: --workdir makes a relative --config relative to it,
// as in Celery.
func (c *celeryGlobals) apply(log *zap.Logger) error {
	if c.workdir != "" {
		if err := os.Chdir(c.workdir); err != nil {
			return usagef("--workdir: %v", err)
		}
	}
	if c.app != "" {
		log.Info("-A/--app is ignored: there is no Python app to import, the tasks are the Go handlers compiled into this program", zap.String("app", c.app))
	}
	if c.loader != "" {
		log.Warn("--loader is ignored: celeriac has no Python loader", zap.String("loader", c.loader))
	}
	return nil
}

// celeryWorker holds the `celery worker` options celeriac's own flags do
// not cover.
type celeryWorker struct {
	pool, optimization, autoscale, excludeQueues, include string
	statedb, schedule, scheduler, executable, umask       string
	uid, gid, pidfile                                     string
	maxTasksPerChild, maxMemoryPerChild                   int
	heartbeatInterval                                     float64
	detach, beat, purge, events                           bool
}

// pools are Celery 5.2's pool names (celery.concurrency.ALIASES).
var pools = []string{"prefork", "eventlet", "gevent", "solo", "processes", "threads", "custom"}

func (c *celeryWorker) register(fl *pflag.FlagSet) {
	fl.StringVarP(&c.pool, "pool", "P", "", "Celery's pool: every pool runs tasks on goroutines, -c of them; solo runs one at a time")
	fl.StringVarP(&c.optimization, "optimization", "O", "", "Celery's -O default|fair: tasks go only to free slots either way (Celery's fair)")
	fl.StringVar(&c.autoscale, "autoscale", "", "MAX[,MIN]: grow the pool up to MAX while tasks wait, shrink back to MIN after 30 s idle (Celery's autoscaler)")
	fl.StringVarP(&c.excludeQueues, "exclude-queues", "X", "", "comma-separated queues not to consume (of -Q or the configured ones)")
	fl.StringVarP(&c.include, "include", "I", "", "Celery's modules to import: accepted and ignored")
	fl.StringVarP(&c.statedb, "statedb", "S", "", "Celery's state database: accepted and ignored (revoked ids are kept in memory)")
	fl.IntVar(&c.maxTasksPerChild, "max-tasks-per-child", 0, "Celery's child recycling: accepted and ignored (tasks run on goroutines of one process; see --max-memory-per-child)")
	fl.IntVar(&c.maxMemoryPerChild, "max-memory-per-child", 0, "KiB of Go heap above which the worker stops taking tasks, lets the running ones finish, frees memory and consumes again")
	fl.Float64Var(&c.heartbeatInterval, "heartbeat-interval", 0, "seconds between worker-heartbeat events (default 2)")
	fl.BoolVarP(&c.detach, "detach", "D", false, "refused: run the worker in the foreground under systemd, supervisord or Kubernetes")
	fl.BoolVarP(&c.beat, "beat", "B", false, "refused: run `beat` as its own process")
	fl.StringVarP(&c.schedule, "schedule-filename", "s", "", "Celery's beat schedule file (with -B): accepted")
	fl.StringVar(&c.scheduler, "scheduler", "", "Celery's beat scheduler (with -B): accepted")
	fl.BoolVar(&c.purge, "purge", false, "purge the worker's queues before starting (Celery's --purge; the messages are gone for good)")
	fl.BoolVar(&c.purge, "discard", false, "alias of --purge")
	fl.BoolVar(&c.events, "events", false, "alias of -E/--task-events")
	fl.StringVar(&c.pidfile, "pidfile", "", "write the process id to this file; refuse to start while it names a live process")
	fl.StringVar(&c.uid, "uid", "", "user (name or id) to run as once started (needs root)")
	fl.StringVar(&c.gid, "gid", "", "group (name or id) to run as once started (needs root)")
	fl.StringVar(&c.umask, "umask", "", "umask of the process, octal (Celery's --umask)")
	fl.StringVar(&c.executable, "executable", "", "Celery's --executable (for --detach): accepted and ignored")
	for _, n := range []string{"discard", "events", "schedule-filename", "scheduler", "executable", "statedb", "include", "loader"} {
		if fl.Lookup(n) != nil {
			_ = fl.MarkHidden(n)
		}
	}
}

// parseAutoscale reads Celery's --autoscale: "MAX,MIN" or "MAX", the two
// in either order (Celery sorts them), MIN 0 when missing.
func parseAutoscale(s string) (maxN, minN int, err error) {
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return 0, 0, fmt.Errorf("--autoscale %q: want MAX[,MIN]", s)
	}
	var n []int
	for _, p := range parts {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v < 0 {
			return 0, 0, fmt.Errorf("--autoscale %q: want MAX[,MIN], whole numbers", s)
		}
		n = append(n, v)
	}
	if len(n) == 1 {
		n = append(n, 0)
	}
	slices.Sort(n)
	if n[1] == 0 {
		return 0, 0, fmt.Errorf("--autoscale %q: MAX must be at least 1", s)
	}
	return n[1], n[0], nil
}

// celeryHostname is Celery's -n: a name without "@" gets "celery@" in
// front (default_nodename), and %i and %I, the pool process index, are
// "0" and "" as in Celery's main process. %h, %n and %d are left to the
// worker.
func celeryHostname(s string) string {
	if s == "" {
		return ""
	}
	if !strings.Contains(s, "@") {
		s = "celery@" + s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case 'i':
			b.WriteString("0")
		case 'I':
		default:
			b.WriteByte('%')
			b.WriteByte(s[i+1])
		}
		i++
	}
	return b.String()
}

// refusals are the options celeriac will not do, as usage errors that say
// what to do instead.
func (c *celeryWorker) refusals() error {
	if c.detach {
		return usagef("--detach: celeriac does not daemonize; run it in the foreground under a service manager " +
			"(systemd Type=simple with Restart=always, supervisord, or a Kubernetes Deployment) and let it handle logs and restarts")
	}
	if c.beat {
		return usagef("-B/--beat: celeriac does not embed a scheduler in the worker; run `beat` as its own process " +
			"(one replica), as Celery recommends for production")
	}
	return nil
}

// apply maps the Celery options onto the worker's configuration and logs
// one warning for each that celeriac accepts without Celery's effect.
func (c *celeryWorker) apply(set func(string) bool, log *zap.Logger, concurrency *int) error {
	if err := c.refusals(); err != nil {
		return err
	}
	if set("pool") {
		if !slices.Contains(pools, c.pool) {
			return usagef("-P/--pool %q: want one of %s", c.pool, strings.Join(pools, ", "))
		}
		if c.pool == "solo" {
			if set("concurrency") && *concurrency != 1 {
				log.Warn("-P solo runs one task at a time: -c is ignored", zap.Int("concurrency", *concurrency))
			}
			*concurrency = 1
		} else {
			log.Info("tasks run on goroutines in this process, whatever the pool", zap.String("pool", c.pool))
		}
	}
	switch c.optimization {
	case "", "default", "fair":
	default:
		return usagef("-O %q: want default or fair", c.optimization)
	}
	if set("include") {
		log.Warn("-I/--include is ignored: there are no Python modules to import", zap.String("include", c.include))
	}
	if set("statedb") {
		log.Warn("-S/--statedb is ignored: celeriac keeps revoked task ids in memory (other workers share theirs at start)", zap.String("statedb", c.statedb))
	}
	if set("max-tasks-per-child") {
		if c.maxTasksPerChild < 0 {
			return usagef("--max-tasks-per-child must not be negative")
		}
		log.Warn("--max-tasks-per-child is ignored: tasks run on goroutines of one process, there is no child to recycle (--max-memory-per-child bounds memory)",
			zap.Int("max_tasks_per_child", c.maxTasksPerChild))
	}
	if c.maxMemoryPerChild < 0 {
		return usagef("--max-memory-per-child must not be negative")
	}
	if set("schedule-filename") || set("scheduler") {
		log.Warn("-s/--schedule and --scheduler go with -B, which celeriac refuses: ignored")
	}
	if set("executable") {
		log.Warn("--executable goes with --detach, which celeriac refuses: ignored")
	}
	if set("umask") {
		m, err := strconv.ParseUint(c.umask, 8, 32)
		if err != nil {
			return usagef("--umask %q: want an octal number", c.umask)
		}
		syscall.Umask(int(m))
	}
	return nil
}

// writePidfile writes the process id to path, refusing when the file names
// another live process, as Celery's Pidfile does; a stale file (its
// process gone) is replaced. The returned func removes it.
func writePidfile(path string) (func(), error) {
	if b, err := os.ReadFile(path); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && pid != os.Getpid() {
			if syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM) {
				return nil, fmt.Errorf("--pidfile %s: process %d is running (remove the file if it is not a worker)", path, pid)
			}
		}
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("--pidfile: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}

// dropPrivileges is Celery's --uid/--gid: the group first, while still
// allowed to change it.
func dropPrivileges(uid, gid string) error {
	if gid != "" {
		g, err := lookupID(gid, func(n string) (string, error) {
			gr, err := user.LookupGroup(n)
			if err != nil {
				return "", err
			}
			return gr.Gid, nil
		})
		if err != nil {
			return fmt.Errorf("--gid %s: %w", gid, err)
		}
		if err := syscall.Setgroups([]int{g}); err != nil {
			return fmt.Errorf("--gid %s: %w", gid, err)
		}
		if err := syscall.Setgid(g); err != nil {
			return fmt.Errorf("--gid %s: %w", gid, err)
		}
	}
	if uid != "" {
		u, err := lookupID(uid, func(n string) (string, error) {
			us, err := user.Lookup(n)
			if err != nil {
				return "", err
			}
			return us.Uid, nil
		})
		if err != nil {
			return fmt.Errorf("--uid %s: %w", uid, err)
		}
		if err := syscall.Setuid(u); err != nil {
			return fmt.Errorf("--uid %s: %w", uid, err)
		}
	}
	return nil
}

func lookupID(s string, byName func(string) (string, error)) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	id, err := byName(s)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(id)
}

// isDaemon reports whether cmd runs until stopped (worker, dashboard):
// those log at info by default; the client commands at warning, as
// Celery's are quiet.
func isDaemon(cmd *cobra.Command) bool {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Annotations[daemonAnnotation] != "" {
			return true
		}
	}
	return false
}

// daemonAnnotation marks a long-running command (see isDaemon); a command
// added with Commands may set it too.
const daemonAnnotation = "celeriac.daemon"
