package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// celery multi: start, stop and restart several workers in the background,
// as the systemd unit and init script of Celery's documentation do
// (Type=forking, `celery multi start $CELERYD_NODES ...` and `celery multi
// stopwait`). The node names, the per-node options (-c:1-3 10, -Q:image
// a), the default pid and log files and what each subcommand prints follow
// celery/apps/multi.py and celery/bin/multi.py, so those units run
// unchanged with celeriac in place of celery. celeriac's worker does not
// daemonize itself (--detach is refused): multi starts each worker in a
// session of its own, its output appended to the node's log file, and
// reports FAILED when the worker exits before it has written its pid file.

const multiUsage = `usage: %[1]s multi start <node1 node2 nodeN|range> [worker options]
       %[1]s multi stop <n1 n2 nN|range> [-SIG (default: -TERM)]
       %[1]s multi restart <n1 n2 nN|range> [-SIG] [worker options]
       %[1]s multi kill <n1 n2 nN|range>

       %[1]s multi show <n1 n2 nN|range> [worker options]
       %[1]s multi get hostname <n1 n2 nN|range> [-qv] [worker options]
       %[1]s multi names <n1 n2 nN|range>
       %[1]s multi expand template <n1 n2 nN|range>
       %[1]s multi help

additional options (must appear after command name):

    * --nosplash:   Don't display program info.
    * --quiet:      Don't show as much output.
    * --verbose:    Show more output.
    * --no-color:   Don't display colors (celeriac never does).
`

func newMultiCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "multi start|stop|stopwait|restart|kill|show|names|expand|get NODES... [worker options]",
		Short: "Start, stop and restart workers in the background, as celery multi",
		Long: `multi starts one worker per node name in the background, each with a pid
file and a log file (default /var/run/celery/%n.pid and /var/log/celery/%n%I.log),
and stops, restarts or kills them through those pid files, as celery multi does.
Options take a node suffix to apply to some nodes only: -c:1-3 10, -Q:image images.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			m := &multiTool{exe: exe, prog: cmd.Root().Name(), stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr()}
			if code := m.run(args); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
}

var multiCommands = map[string]bool{"start": true, "stop": true, "stopwait": true, "stop_verify": true,
	"restart": true, "kill": true, "names": true, "show": true, "get": true, "expand": true, "help": true}

// exitCode ends the program with a status and no message: multi has
// printed what went wrong.
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// multiTool is celery multi's MultiTool.
type multiTool struct {
	exe, prog      string
	stdout, stderr io.Writer
	nosplash       bool
	quiet          bool
	verbose        bool
	// startWait bounds how long start waits for a worker's pid file.
	startWait time.Duration
	// stopPoll is how often stopwait looks whether a worker is gone.
	stopPoll time.Duration
}

func (m *multiTool) note(format string, a ...any) {
	if !m.quiet {
		fmt.Fprintf(m.stdout, format, a...)
	}
}

func (m *multiTool) splash() {
	if !m.nosplash {
		m.note("%s multi v%s\n", m.prog, version())
	}
}

func (m *multiTool) run(argv []string) int {
	// The options Celery reserves for multi itself, wherever they are.
	var rest []string
	for _, a := range argv {
		switch a {
		case "--nosplash":
			m.nosplash = true
		case "--quiet", "-q":
			m.quiet = true
		case "--verbose":
			m.verbose = true
		case "--no-color":
		default:
			rest = append(rest, a)
		}
	}
	// Options given before the subcommand (celeriac -A proj multi start
	// ...) go after it, as Celery 5 rearranges them.
	for i, a := range rest {
		if multiCommands[a] {
			rest = append(rest[i:], rest[:i]...)
			break
		}
	}
	if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
		fmt.Fprintf(m.stderr, multiUsage, m.prog)
		return 1
	}
	cmd, args := rest[0], rest[1:]
	switch cmd {
	case "help", "--help", "-h":
		fmt.Fprintf(m.stdout, multiUsage, m.prog)
		return 0
	case "start":
		m.splash()
		return m.start(parseMulti(args))
	case "stop":
		m.splash()
		c := parseMulti(args)
		m.stop(c, c.sig(), false, nil)
		return 0
	case "stopwait", "stop_verify":
		m.splash()
		c := parseMulti(args)
		m.stop(c, c.sig(), true, nil)
		return 0
	case "restart":
		m.splash()
		return m.restart(parseMulti(args))
	case "kill":
		m.splash()
		c := parseMulti(args)
		for _, n := range c.nodes {
			pid := n.pid()
			if pid == 0 {
				m.note("> %s: DOWN\n", n.name)
				continue
			}
			m.note("Sending SIGKILL to node %s (%d)\n", n.name, pid)
			if !processAlive(pid) || !n.signal(syscall.SIGKILL) {
				m.note("Could not signal %s (%d): No such process\n", n.name, pid)
			}
		}
		return 0
	case "names":
		for _, n := range parseMulti(args).nodes {
			fmt.Fprintln(m.stdout, n.name)
		}
		return 0
	case "show":
		for _, n := range parseMulti(args).nodes {
			fmt.Fprintln(m.stdout, strings.Join(append([]string{m.exe}, n.argv...), " "))
		}
		return 0
	case "get":
		if len(args) == 0 {
			fmt.Fprintf(m.stderr, multiUsage, m.prog)
			return 1
		}
		for _, n := range parseMulti(args[1:]).nodes {
			if n.name == args[0] {
				fmt.Fprintln(m.stdout, strings.Join(n.argv, " "))
				return 0
			}
		}
		return 1
	case "expand":
		if len(args) == 0 {
			fmt.Fprintf(m.stderr, multiUsage, m.prog)
			return 1
		}
		for _, n := range parseMulti(args[1:]).nodes {
			fmt.Fprintln(m.stdout, n.expand(args[0]))
		}
		return 0
	}
	fmt.Fprintf(m.stderr, "Invalid command: %s\n", cmd)
	fmt.Fprintf(m.stderr, multiUsage, m.prog)
	return 1
}

func (m *multiTool) start(c *multiCluster) int {
	m.note("> Starting nodes...\n")
	failed := 0
	for _, n := range c.nodes {
		m.note("\t> %s: ", n.name)
		if !m.startNode(n) {
			failed = 1
		}
	}
	return failed
}

// startNode starts one worker in a session of its own and waits until it
// has written its pid file (it is running), or has exited (FAILED).
func (m *multiTool) startNode(n *multiNode) bool {
	for _, p := range []string{n.pidfile(), n.logfile()} {
		if dir := filepath.Dir(p); dir != "" {
			// As Celery's Node: the directories of the pid and log files
			// are created.
			if err := os.MkdirAll(dir, 0o755); err != nil {
				m.note("FAILED\n* %v\n", err)
				return false
			}
		}
	}
	logf, err := os.OpenFile(n.logfile(), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		m.note("FAILED\n* %v\n", err)
		return false
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		m.note("FAILED\n* %v\n", err)
		return false
	}
	defer devnull.Close()
	if m.verbose {
		m.note("\n  %s %s\n", m.exe, strings.Join(n.argv, " "))
	}
	cmd := exec.Command(m.exe, n.argv...)
	// What the worker prints before its logger writes to --logfile (a
	// usage error, a panic) goes to the log file too.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		m.note("FAILED\n* %v\n", err)
		return false
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	wait := m.startWait
	if wait == 0 {
		wait = 30 * time.Second
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			m.note("FAILED\n")
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() > 0 {
				m.note("* Child terminated with exit code %d\n", ee.ExitCode())
			} else if err != nil {
				m.note("* Child terminated: %v\n", err)
			}
			m.note("* its output is in %s\n", n.logfile())
			return false
		case <-tick.C:
			if readPid(n.pidfile()) == cmd.Process.Pid {
				m.note("OK\n")
				return true
			}
		case <-deadline.C:
			// Running, but no pid file yet: a worker that is slow to
			// start is not a failure (nor would it be to celery multi,
			// which does not wait at all).
			m.note("OK (no pid file after %s)\n", wait)
			return true
		}
	}
}

// stop signals every node that has a pid file; with wait it waits until
// each process is gone, calling down for it (restart starts it again
// there). Nodes without a pid file are down at once. The wait is on the
// process signalled, not on its pid file: a worker removes the file a
// moment before it exits, and a restart must not start the next one
// beside it.
func (m *multiTool) stop(c *multiCluster, sig syscall.Signal, wait bool, down func(*multiNode)) {
	type target struct {
		n   *multiNode
		pid int
	}
	var live []target
	for _, n := range c.nodes {
		pid := n.pid()
		if pid == 0 {
			if down != nil {
				down(n)
			} else {
				m.note("> %s: DOWN\n", n.name)
			}
			continue
		}
		live = append(live, target{n, pid})
	}
	if len(live) == 0 {
		return
	}
	m.note("> Stopping nodes...\n")
	var waiting []target
	for _, x := range live {
		m.note("\t> %s: %s -> %d\n", x.n.name, signalName(sig), x.pid)
		if !processAlive(x.pid) || syscall.Kill(x.pid, sig) != nil {
			m.note("Could not signal %s (%d): No such process\n", x.n.name, x.pid)
			if down != nil {
				down(x.n)
			}
			continue
		}
		waiting = append(waiting, x)
	}
	if !wait || len(waiting) == 0 {
		return
	}
	poll := m.stopPoll
	if poll == 0 {
		poll = 500 * time.Millisecond
	}
	pids := func() string {
		var s []string
		for _, x := range waiting {
			s = append(s, strconv.Itoa(x.pid))
		}
		return strings.Join(s, ", ")
	}
	m.note("> Waiting for %s -> %s...", plural(len(waiting), "node"), pids())
	for len(waiting) > 0 {
		time.Sleep(poll)
		m.note(".")
		for i, x := range waiting {
			if !processAlive(x.pid) {
				m.note("\n\t> %s: OK\n", x.n.name)
				waiting = append(waiting[:i], waiting[i+1:]...)
				if down != nil {
					down(x.n)
				}
				if len(waiting) > 0 {
					m.note("> Waiting for %s -> %s...", plural(len(waiting), "node"), pids())
				}
				break
			}
		}
	}
	m.note("\n")
}

// processAlive reports whether pid is a process that has not exited: a
// zombie (exited, not yet reaped by its parent) is gone.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		// Reaped between the two looks (a killed zombie, say): gone. Any
		// other failure to read leaves kill's answer standing.
		return !errors.Is(err, fs.ErrNotExist) && syscall.Kill(pid, 0) == nil
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

func (m *multiTool) restart(c *multiCluster) int {
	failed := 0
	m.stop(c, c.sig(), true, func(n *multiNode) {
		m.note("> Restarting node %s: ", n.name)
		if !m.startNode(n) {
			failed = 1
		}
	})
	return failed
}

func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGKILL:
		return "KILL"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGQUIT:
		return "QUIT"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGUSR1:
		return "USR1"
	case syscall.SIGUSR2:
		return "USR2"
	}
	return strconv.Itoa(int(sig))
}

// readPid is Celery's Pidfile.read_pid: the number on the file's first
// line, 0 when there is no file or no number.
func readPid(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// multiOpt is one option: its name with the dashes ("-c", "--loglevel")
// and its value, "" when it has none.
type multiOpt struct {
	name, value string
	hasValue    bool
}

// multiOpts keeps options in the order they were first given, as Celery's
// OrderedDict: a later value replaces an earlier one in place.
type multiOpts []multiOpt

func (o *multiOpts) set(name, value string, hasValue bool) {
	for i := range *o {
		if (*o)[i].name == name {
			(*o)[i].value, (*o)[i].hasValue = value, hasValue
			return
		}
	}
	*o = append(*o, multiOpt{name, value, hasValue})
}

func (o multiOpts) get(names ...string) (string, bool) {
	for _, n := range names {
		for _, x := range o {
			if x.name == n {
				return x.value, true
			}
		}
	}
	return "", false
}

func (o *multiOpts) pop(name string) (string, bool) {
	for i, x := range *o {
		if x.name == name {
			*o = append((*o)[:i], (*o)[i+1:]...)
			return x.value, true
		}
	}
	return "", false
}

// multiArgs is Celery's NamespacedOptionParser: positional values (node
// names), options, and options for some nodes only (-c:1-3 10).
type multiArgs struct {
	args        []string
	values      []string
	options     multiOpts
	namespaces  map[string]*multiOpts
	nsOrder     []string
	passthrough []string
}

func parseMultiArgs(args []string) *multiArgs {
	p := &multiArgs{args: args, namespaces: map[string]*multiOpts{}}
	var rargs []string
	for _, a := range args {
		if a != "" {
			rargs = append(rargs, a)
		}
	}
	for pos := 0; pos < len(rargs); pos++ {
		arg := rargs[pos]
		switch {
		case arg == "--":
			p.passthrough = rargs[pos:]
			return p
		case strings.HasPrefix(arg, "--"):
			name, value, has := strings.Cut(arg[2:], "=")
			p.add("--", name, value, has)
		case strings.HasPrefix(arg, "-") && len(arg) > 1:
			// A short option takes the next argument as its value unless
			// that one is an option too (Celery's rule: "-E w2" gives -E
			// the value w2).
			value, has := "", false
			if pos+1 < len(rargs) && !strings.HasPrefix(rargs[pos+1], "-") {
				value, has = rargs[pos+1], true
				pos++
			}
			p.add("-", arg[1:], value, has)
		default:
			p.values = append(p.values, arg)
		}
	}
	return p
}

func (p *multiArgs) add(prefix, name, value string, has bool) {
	if n, ns, ok := strings.Cut(name, ":"); ok {
		p.ns(ns).set(prefix+n, value, has)
		return
	}
	p.options.set(prefix+name, value, has)
}

func (p *multiArgs) ns(name string) *multiOpts {
	o, ok := p.namespaces[name]
	if !ok {
		o = &multiOpts{}
		p.namespaces[name] = o
		p.nsOrder = append(p.nsOrder, name)
	}
	return o
}

// multiNode is one worker of the cluster: its node name and command line.
type multiNode struct {
	name      string // w1@host
	shortname string // w1
	hostname  string // host
	options   multiOpts
	argv      []string // after the executable
}

// multiCluster is the nodes of one command line, and the arguments they
// came from (for the signal of stop and restart).
type multiCluster struct {
	p     *multiArgs
	nodes []*multiNode
}

// parseMulti is Celery's MultiParser.parse.
func parseMulti(args []string) *multiCluster {
	p := parseMultiArgs(args)
	names := p.values
	options := append(multiOpts(nil), p.options...)
	ranges := len(names) == 1
	prefix := ""
	options.pop("--cmd")
	options.pop("--append")
	hostname, ok := options.pop("--hostname")
	if n, ok2 := options.pop("-n"); !ok {
		hostname, ok = n, ok2
	}
	if !ok || hostname == "" {
		hostname, _ = os.Hostname()
	}
	if v, ok := options.pop("--prefix"); ok {
		prefix = v
	}
	suffix, _ := options.pop("--suffix")
	if suffix == "" {
		suffix = hostname
	}
	if suffix == `""` || suffix == "''" {
		suffix = ""
	}
	rangePrefix, _ := options.pop("--range-prefix")
	if rangePrefix == "" {
		rangePrefix = "celery"
	}
	if ranges {
		if k, err := strconv.Atoi(names[0]); err == nil {
			names = nil
			for i := 1; i <= k; i++ {
				names = append(names, strconv.Itoa(i))
			}
			prefix = rangePrefix
		}
	}
	// Numbers in namespaces are indexes into the names (-c:1 is the first
	// node), then lists and ranges (-c:1-3, -c:a,b) spread to each.
	for _, ns := range append([]string(nil), p.nsOrder...) {
		if i, err := strconv.Atoi(ns); err == nil && i >= 1 && i <= len(names) {
			for _, o := range *p.namespaces[ns] {
				p.ns(names[i-1]).set(o.name, o.value, o.hasValue)
			}
		}
	}
	for _, ns := range append([]string(nil), p.nsOrder...) {
		if !strings.Contains(ns, ",") && !(ranges && strings.Contains(ns, "-")) {
			continue
		}
		for _, sub := range nsRange(ns, ranges) {
			for _, o := range *p.namespaces[ns] {
				p.ns(sub).set(o.name, o.value, o.hasValue)
			}
		}
		delete(p.namespaces, ns)
	}
	c := &multiCluster{p: p}
	for _, name := range names {
		ns, nodename, host := buildNodename(name, prefix, suffix)
		if _, ok := p.namespaces[nodename]; ok {
			ns = nodename
		}
		opts := append(multiOpts(nil), options...)
		if nso, ok := p.namespaces[ns]; ok {
			for _, o := range *nso {
				opts.set(o.name, o.value, o.hasValue)
			}
		}
		c.nodes = append(c.nodes, newMultiNode(nodename, host, opts, p.passthrough))
	}
	return c
}

func nsRange(ns string, ranges bool) []string {
	var out []string
	for _, space := range strings.Split(ns, ",") {
		if a, b, ok := strings.Cut(space, "-"); ranges && ok {
			lo, err1 := strconv.Atoi(a)
			hi, err2 := strconv.Atoi(b)
			if err1 == nil && err2 == nil {
				for i := lo; i <= hi; i++ {
					out = append(out, strconv.Itoa(i))
				}
				continue
			}
		}
		out = append(out, space)
	}
	return out
}

// buildNodename is Celery's: a name with "@" is a full node name (its %h
// expanded), else prefix+name@suffix.
func buildNodename(name, prefix, suffix string) (ns, nodename, hostname string) {
	if strings.Contains(name, "@") {
		nodename = hostFormat(name)
		short, host, _ := strings.Cut(nodename, "@")
		return short, nodename, host
	}
	short := prefix + name
	return name, hostFormat(short + "@" + suffix), suffix
}

// hostFormat is Celery's host_format for a node name: %h the host name,
// %n its first label, %d its domain.
func hostFormat(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	host, _ := os.Hostname()
	name, domain, _ := strings.Cut(host, ".")
	return simpleFormat(s, map[byte]string{'h': host, 'n': name, 'd': domain})
}

var formatKey = regexp.MustCompile(`%\w`)

// simpleFormat is Celery's simple_format: %x replaced by keys[x], unknown
// keys left as they are.
func simpleFormat(s string, keys map[byte]string) string {
	return formatKey.ReplaceAllStringFunc(s, func(k string) string {
		if v, ok := keys[k[1]]; ok {
			return v
		}
		return k
	})
}

func newMultiNode(nodename, host string, opts multiOpts, passthrough []string) *multiNode {
	short, _, _ := strings.Cut(nodename, "@")
	n := &multiNode{name: nodename, shortname: short, hostname: host}
	opts.set("-n", nodename, true)
	if _, ok := opts.get("-p"); !ok {
		if _, ok := opts.get("--pidfile"); !ok {
			opts.set("--pidfile", "/var/run/celery/%n.pid", true)
		}
	}
	if _, ok := opts.get("-f"); !ok {
		if _, ok := opts.get("--logfile"); !ok {
			opts.set("--logfile", "/var/log/celery/%n%I.log", true)
		}
	}
	// Celery passes its interpreter as --executable; a Go worker has no
	// use for one.
	opts.pop("--executable")
	n.options = opts
	n.argv = []string{"worker"}
	for _, o := range opts {
		switch {
		case !o.hasValue || o.value == "":
			n.argv = append(n.argv, o.name)
		case strings.HasPrefix(o.name, "--"):
			n.argv = append(n.argv, o.name+"="+n.expand(o.value))
		default:
			n.argv = append(n.argv, o.name, n.expand(o.value))
		}
	}
	n.argv = append(n.argv, passthrough...)
	return n
}

// expand is the node's expander (Celery's build_expander): %h and %p the
// node name, %n and %N its name part, %d its host; %i and %I stay for the
// worker to expand.
func (n *multiNode) expand(s string) string {
	return simpleFormat(s, map[byte]string{'h': n.name, 'p': n.name, 'n': n.shortname, 'N': n.shortname, 'd': n.hostname})
}

// file is an option's path as the worker writes it: the node's expansion,
// then the worker's own (%i "0" and %I "" in its main process).
func (n *multiNode) file(names ...string) string {
	v, _ := n.options.get(names...)
	return strings.NewReplacer("%i", "0", "%I", "").Replace(n.expand(v))
}

func (n *multiNode) pidfile() string { return n.file("-p", "--pidfile") }
func (n *multiNode) logfile() string { return n.file("-f", "--logfile") }
func (n *multiNode) pid() int        { return readPid(n.pidfile()) }

// signal sends sig to the node's process; false when there is none.
func (n *multiNode) signal(sig syscall.Signal) bool {
	pid := n.pid()
	if pid == 0 {
		return false
	}
	return syscall.Kill(pid, sig) == nil
}

// alive reports whether the node's process still runs. A worker removes
// its pid file when it exits; a file left by one that was killed names a
// process that is gone.
func (n *multiNode) alive() bool {
	pid := n.pid()
	return pid != 0 && processAlive(pid)
}

// sig is Celery's _find_sig_argument: the last -NUMBER or -SIGNAME after
// the node names (stop w1 -KILL), TERM when there is none.
func (c *multiCluster) sig() syscall.Signal {
	args := c.p.args
	if len(c.p.values) <= len(args) {
		args = args[len(c.p.values):]
	}
	for i := len(args) - 1; i >= 0; i-- {
		a := args[i]
		if len(a) < 2 || a[0] != '-' || a[1] == '-' {
			continue
		}
		if n, err := strconv.Atoi(a[1:]); err == nil && n > 0 && len(a) == 2 {
			return syscall.Signal(n)
		}
		name := strings.TrimPrefix(strings.ToUpper(a[1:]), "SIG")
		for _, s := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGINT, syscall.SIGQUIT,
			syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2} {
			if signalName(s) == name {
				return s
			}
		}
	}
	return syscall.SIGTERM
}
