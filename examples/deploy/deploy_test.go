package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/prommetrics"
)

// The deployment examples are checked against the real command and the
// real HTTP server: every command line parses with the worker's own flag
// definitions, every probe path is a route of the metrics handler, every
// port is the one --metrics-addr listens on, and the grace periods cover
// the warm shutdown. The manifests are decoded strictly (a misspelt field
// is an error) into the part of the Kubernetes and KEDA schemas they use.

// settleMargin is what a stop timeout must leave beyond --shutdown-timeout:
// 5 s for handlers that ignore their context, and a margin for settling.
const settleMargin = 10 * time.Second

// parseWorker parses a worker command line (without the program name)
// with the real command tree and returns the command it reached.
func parseWorker(t *testing.T, args []string) *cobra.Command {
	t.Helper()
	root := cli.New(worker.NewMux(), cli.Output(io.Discard, io.Discard))
	cmd, rest, err := root.Find(args)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if cmd.Name() != "worker" {
		t.Fatalf("%q runs %q, want worker", args, cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if extra := cmd.Flags().Args(); len(extra) > 0 {
		t.Fatalf("%q: unexpected arguments %q", args, extra)
	}
	return cmd
}

func shutdownTimeout(t *testing.T, cmd *cobra.Command) time.Duration {
	t.Helper()
	d, err := cmd.Flags().GetDuration("shutdown-timeout")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// metricsPort is the port of --metrics-addr.
func metricsPort(t *testing.T, cmd *cobra.Command) int {
	t.Helper()
	addr, err := cmd.Flags().GetString("metrics-addr")
	if err != nil || addr == "" {
		t.Fatalf("no --metrics-addr: %q, %v", addr, err)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkRoute fails unless path is a route of the worker's metrics and
// health handler that answers 200 when the broker is up.
func checkRoute(t *testing.T, path string) {
	t.Helper()
	h := prommetrics.New(nil).Handler(func(context.Context) error { return nil })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Errorf("GET %s on the worker's metrics server: %d, want 200", path, rec.Code)
	}
}

// envNames are the environment variables the command tree reads, as its
// flags' help names them ($CELERY_BROKER_URL), plus the Go runtime's.
func envNames() map[string]bool {
	names := map[string]bool{"GOMEMLIMIT": true, "GOGC": true, "GOMAXPROCS": true}
	re := regexp.MustCompile(`\$([A-Z][A-Z0-9_]+)`)
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		visit := func(f *pflag.Flag) {
			for _, m := range re.FindAllStringSubmatch(f.Usage, -1) {
				names[m[1]] = true
			}
		}
		c.Flags().VisitAll(visit)
		c.PersistentFlags().VisitAll(visit)
		for _, m := range re.FindAllStringSubmatch(c.Long, -1) {
			names[m[1]] = true
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(cli.New(worker.NewMux(), cli.Output(io.Discard, io.Discard)))
	return names
}

func TestSystemdUnit(t *testing.T) {
	unit := readUnit(t, "systemd/celeriac.service")
	exec := strings.Fields(unit["Service.ExecStart"])
	if len(exec) < 2 || filepath.Base(exec[0]) != "celeriac" {
		t.Fatalf("ExecStart = %q", unit["Service.ExecStart"])
	}
	cmd := parseWorker(t, exec[1:])
	stop, err := time.ParseDuration(unit["Service.TimeoutStopSec"] + "s")
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	if st := shutdownTimeout(t, cmd); stop < st+settleMargin {
		t.Errorf("TimeoutStopSec %v < --shutdown-timeout %v + %v: systemd would kill running tasks", stop, st, settleMargin)
	}
	if unit["Service.KillSignal"] != "SIGTERM" {
		t.Errorf("KillSignal %q: the warm shutdown starts on SIGTERM", unit["Service.KillSignal"])
	}
	metricsPort(t, cmd)
}

// readUnit reads a systemd unit as Section.Key -> value (last wins).
func readUnit(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: not a unit line: %q", path, line)
			}
			out[section+"."+strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// The parts of the Kubernetes and KEDA schemas the manifests use.
type (
	meta struct {
		Name        string            `yaml:"name"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	secretKeyRef struct {
		Name string `yaml:"name"`
		Key  string `yaml:"key"`
	}
	envVar struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			SecretKeyRef     *secretKeyRef `yaml:"secretKeyRef"`
			ResourceFieldRef *struct {
				Resource string `yaml:"resource"`
			} `yaml:"resourceFieldRef"`
		} `yaml:"valueFrom"`
	}
	probe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port any    `yaml:"port"` // a name or a number
		} `yaml:"httpGet"`
		InitialDelaySeconds int `yaml:"initialDelaySeconds"`
		PeriodSeconds       int `yaml:"periodSeconds"`
		FailureThreshold    int `yaml:"failureThreshold"`
	}
	container struct {
		Name    string   `yaml:"name"`
		Image   string   `yaml:"image"`
		Command []string `yaml:"command"`
		Args    []string `yaml:"args"`
		Env     []envVar `yaml:"env"`
		Ports   []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		LivenessProbe  *probe `yaml:"livenessProbe"`
		ReadinessProbe *probe `yaml:"readinessProbe"`
		Lifecycle      struct {
			PreStop *struct {
				Sleep *struct {
					Seconds int `yaml:"seconds"`
				} `yaml:"sleep"`
			} `yaml:"preStop"`
		} `yaml:"lifecycle"`
		Resources struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
	}
	deployment struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata meta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	}
	triggerAuth struct {
		SecretTargetRef []struct {
			Parameter string `yaml:"parameter"`
			Name      string `yaml:"name"`
			Key       string `yaml:"key"`
		} `yaml:"secretTargetRef"`
	}
	scaledObject struct {
		ScaleTargetRef struct {
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicaCount int `yaml:"minReplicaCount"`
		MaxReplicaCount int `yaml:"maxReplicaCount"`
		CooldownPeriod  int `yaml:"cooldownPeriod"`
		Triggers        []struct {
			Type              string            `yaml:"type"`
			Metadata          map[string]string `yaml:"metadata"`
			AuthenticationRef struct {
				Name string `yaml:"name"`
			} `yaml:"authenticationRef"`
		} `yaml:"triggers"`
	}
)

// object is one manifest: its kind and its spec decoded strictly.
type object struct {
	kind, name string
	spec       any
}

// readManifests decodes every document of a file; a field the schema
// above does not have is an error.
func readManifests(t *testing.T, path string) []object {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(b), -1) {
		var head struct {
			APIVersion string    `yaml:"apiVersion"`
			Kind       string    `yaml:"kind"`
			Metadata   meta      `yaml:"metadata"`
			Spec       yaml.Node `yaml:"spec"`
		}
		if err := strictDecode(doc, &head); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var spec any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			spec = &deployment{}
		case "keda.sh/v1alpha1 ScaledObject":
			spec = &scaledObject{}
		case "keda.sh/v1alpha1 TriggerAuthentication":
			spec = &triggerAuth{}
		default:
			t.Fatalf("%s: unexpected %s %s", path, head.APIVersion, head.Kind)
		}
		raw, err := yaml.Marshal(&head.Spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := strictDecode(string(raw), spec); err != nil {
			t.Fatalf("%s: %s %s: spec: %v", path, head.Kind, head.Metadata.Name, err)
		}
		out = append(out, object{head.Kind, head.Metadata.Name, spec})
	}
	return out
}

func strictDecode(doc string, v any) error {
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func find[T any](t *testing.T, objs []object, kind string) (string, *T) {
	t.Helper()
	for _, o := range objs {
		if o.kind == kind {
			return o.name, o.spec.(*T)
		}
	}
	t.Fatalf("no %s", kind)
	return "", nil
}

func TestKubernetesWorker(t *testing.T) {
	name, d := find[deployment](t, readManifests(t, "kubernetes/worker.yaml"), "Deployment")
	if name != "celeriac-worker" {
		t.Errorf("Deployment %q: the ScaledObjects name celeriac-worker", name)
	}
	for k, v := range d.Selector.MatchLabels {
		if d.Template.Metadata.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod's labels %v", k, v, d.Template.Metadata.Labels)
		}
	}
	spec := d.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	args := c.Args
	if len(c.Command) > 0 {
		args = append(c.Command[1:], args...)
	}
	cmd := parseWorker(t, args)

	port := metricsPort(t, cmd)
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		if p.ContainerPort != port {
			t.Errorf("containerPort %d (%s): the worker listens on %d (--metrics-addr)", p.ContainerPort, p.Name, port)
		}
	}
	if a := d.Template.Metadata.Annotations["prometheus.io/port"]; a != strconv.Itoa(port) {
		t.Errorf("prometheus.io/port %q, want %d", a, port)
	}
	checkRoute(t, d.Template.Metadata.Annotations["prometheus.io/path"])
	for what, p := range map[string]*probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil {
			t.Errorf("no %s probe", what)
			continue
		}
		checkRoute(t, p.HTTPGet.Path)
		switch v := p.HTTPGet.Port.(type) {
		case string:
			if _, ok := ports[v]; !ok {
				t.Errorf("%s probe: no container port named %q", what, v)
			}
		case int:
			if v != port {
				t.Errorf("%s probe: port %d, the worker listens on %d", what, v, port)
			}
		default:
			t.Errorf("%s probe: port %v", what, v)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet.Path == "/readyz" {
		t.Error("liveness on /readyz: a broker outage would restart every worker")
	}

	preStop := 0
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		preStop = ps.Sleep.Seconds
	} else {
		t.Error("no preStop sleep")
	}
	grace := time.Duration(spec.TerminationGracePeriodSeconds) * time.Second
	if need := time.Duration(preStop)*time.Second + shutdownTimeout(t, cmd) + settleMargin; grace < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %ds + --shutdown-timeout + %v = %v: Kubernetes would kill running tasks", grace, preStop, settleMargin, need)
	}

	known := envNames()
	for _, e := range c.Env {
		if !known[e.Name] {
			t.Errorf("env %s: the command reads no such variable", e.Name)
		}
	}
}

func TestKEDAScaledObjects(t *testing.T) {
	_, d := find[deployment](t, readManifests(t, "kubernetes/worker.yaml"), "Deployment")
	c := d.Template.Spec.Containers[0]
	queues, err := parseWorker(t, c.Args).Flags().GetString("queues")
	if err != nil {
		t.Fatal(err)
	}
	brokerSecret := secretKeyRef{}
	for _, e := range c.Env {
		if e.Name == "CELERY_BROKER_URL" && e.ValueFrom.SecretKeyRef != nil {
			brokerSecret = *e.ValueFrom.SecretKeyRef
		}
	}
	for file, tc := range map[string]struct{ trigger, queueKey string }{
		"kubernetes/keda-rabbitmq.yaml": {"rabbitmq", "queueName"},
		"kubernetes/keda-redis.yaml":    {"redis", "listName"},
	} {
		objs := readManifests(t, file)
		_, so := find[scaledObject](t, objs, "ScaledObject")
		authName, auth := find[triggerAuth](t, objs, "TriggerAuthentication")
		if so.ScaleTargetRef.Name != "celeriac-worker" {
			t.Errorf("%s: scales %q, not the worker Deployment", file, so.ScaleTargetRef.Name)
		}
		if so.MinReplicaCount < 1 || so.MaxReplicaCount < so.MinReplicaCount {
			t.Errorf("%s: replicas %d..%d", file, so.MinReplicaCount, so.MaxReplicaCount)
		}
		if len(so.Triggers) != 1 || so.Triggers[0].Type != tc.trigger {
			t.Fatalf("%s: triggers %+v, want one %s", file, so.Triggers, tc.trigger)
		}
		tr := so.Triggers[0]
		if q := tr.Metadata[tc.queueKey]; !strings.Contains(","+queues+",", ","+q+",") {
			t.Errorf("%s: %s %q is not a queue the worker consumes (-Q %s)", file, tc.queueKey, q, queues)
		}
		if tr.AuthenticationRef.Name != authName {
			t.Errorf("%s: authenticationRef %q, the file defines %q", file, tr.AuthenticationRef.Name, authName)
		}
		if tc.trigger == "rabbitmq" {
			if tr.Metadata["mode"] != "QueueLength" {
				t.Errorf("%s: mode %q", file, tr.Metadata["mode"])
			}
			ok := false
			for _, r := range auth.SecretTargetRef {
				ok = ok || r.Parameter == "host" && r.Name == brokerSecret.Name && r.Key == brokerSecret.Key
			}
			if !ok {
				t.Errorf("%s: the host parameter does not come from the worker's broker URL (%+v)", file, brokerSecret)
			}
		}
		for _, k := range []string{"value", "listLength"} {
			if v, ok := tr.Metadata[k]; ok {
				if n, err := strconv.Atoi(v); err != nil || n <= 0 {
					t.Errorf("%s: %s %q", file, k, v)
				}
			}
		}
	}
}

// TestDockerfile: the image builds the command the manifests run, and
// starts it as its entrypoint.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`go build .*-o (\S+) (\S+)`).FindStringSubmatch(string(b))
	if build == nil {
		t.Fatal("no go build line")
	}
	if _, err := os.Stat(filepath.Join("../..", build[2])); err != nil {
		t.Errorf("builds %s: %v", build[2], err)
	}
	entry := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindStringSubmatch(string(b))
	if entry == nil || filepath.Base(entry[1]) != filepath.Base(build[1]) {
		t.Errorf("ENTRYPOINT %v does not run the binary built as %s", entry, build[1])
	}
}
