package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestSentinelACLUser: Celery 5.6 passes the username of a sentinel://
// URL on to the master (celery/celery#10013; 5.5 sent the password only,
// which authenticates as the default user). A Redis master whose default
// user is off and whose only user is an ACL user, behind a Sentinel that
// reaches it with that user (auth-user/auth-pass) and that has an ACL user
// of its own (sentinel_kwargs): a celeriac worker consumes through the
// Sentinel with the URL's user, and a Python client sends tasks and reads
// their results through the same URLs. On 5.2 and 5.5 the Python side can
// only be the producer (their backends cannot log in as an ACL user), so
// the test reads the results itself there.
func TestSentinelACLUser(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not installed: the test starts a master and a Sentinel of its own")
	}
	sentinel := []string{server, "--sentinel"}
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		sentinel = []string{p}
	}
	base := t.TempDir()
	const user, pass, suser, spass, master = "app", "app-pw-1", "sentineluser", "sentinel-pw-1", "acl_master"
	mport, sport := freePort(t), freePort(t)
	var nodes []*redisNode
	t.Cleanup(func() {
		for _, n := range nodes {
			n.signal(syscall.SIGTERM)
		}
	})
	mdir := filepath.Join(base, "master")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		t.Fatal(err)
	}
	// ACL users can only be given in a configuration file.
	mconf := filepath.Join(mdir, "redis.conf")
	if err := os.WriteFile(mconf, fmt.Appendf(nil, "user default off\nuser %s on >%s ~* &* +@all\n", user, pass), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &redisNode{port: mport, dir: mdir, args: []string{server, mconf, "--bind", "127.0.0.1", "--port", strconv.Itoa(mport),
		"--dir", mdir, "--save", "", "--appendonly", "no"}}
	nodes = append(nodes, m)
	if err := m.start(); err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Join(base, "sentinel")
	if err := os.MkdirAll(sdir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(sdir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel auth-user %s %s\nsentinel auth-pass %s %s\n"+
		"user default off\nuser %s on >%s allchannels +@all\n",
		sport, sdir, master, mport, master, user, master, pass, suser, spass)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &redisNode{port: sport, dir: sdir, args: append([]string{sentinel[0], conf}, sentinel[1:]...)}
	nodes = append(nodes, s)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	// The Sentinel knows the master once it has logged in to it.
	ctx := context.Background()
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: s.addr(), Username: suser, Password: spass})
	defer sc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mm, err := sc.Master(ctx, master).Result()
		if err == nil && !strings.Contains(mm["flags"], "down") && mm["role-reported"] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel does not see its master: %v %v", mm, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	url := func(db int) string {
		return fmt.Sprintf("sentinel://%s:%s@127.0.0.1:%d/%d", user, pass, sport, db)
	}
	topts := map[string]any{"master_name": master, "sentinel_kwargs": map[string]any{"username": suser, "password": spass}}
	cfg, _ := json.Marshal(map[string]any{"broker_transport_options": topts, "result_backend_transport_options": topts})
	file := filepath.Join(base, "celeryconfig.json")
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	q := "it_acl_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	startProc(t, "celeriac worker", "./cmd/celeriac", procOptions{},
		"worker", "--broker", url(0), "--result-backend", url(1), "--config", file, "-Q", q,
		"-n", q+"@%h", "--without-heartbeat", "--without-mingle", "--without-gossip")

	// The Python side: the producer always; on 5.6 also the result reader.
	readResults := celeryVersion() >= "5.6"
	out := runPython(t, 90*time.Second, map[string]string{
		"IT_BROKER": url(0), "IT_BACKEND": url(1), "IT_QUEUE": q, "IT_TOPTS": mustJSON(topts),
		"IT_READ": strconv.FormatBool(readResults)}, `
import json, os, celery
topts = json.loads(os.environ["IT_TOPTS"])
read = os.environ["IT_READ"] == "true"
app = celery.Celery(broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"] if read else None)
app.conf.broker_transport_options = topts
app.conf.result_backend_transport_options = topts
rs = [app.send_task("tasks.add", args=[i, i], queue=os.environ["IT_QUEUE"]) for i in range(10)]
print("IDS", " ".join(r.id for r in rs))
if read:
    print("SUM", sum(r.get(timeout=60) for r in rs))
`)
	ids := outputIDs(out)
	if len(ids) != 10 {
		t.Fatalf("python printed %q, want 10 ids", out)
	}
	if readResults && !strings.Contains(out, "SUM 90") {
		t.Errorf("Python Celery %s read %q through the Sentinel as ACL user %s, want SUM 90", celeryVersion(), out, user)
	}
	// The results, read straight from the master as the ACL user.
	rc := goredis.NewClient(&goredis.Options{Addr: m.addr(), Username: user, Password: pass, DB: 1})
	defer rc.Close()
	sum := 0
	deadline = time.Now().Add(60 * time.Second)
	for _, id := range ids {
		for {
			raw, err := rc.Get(ctx, "celery-task-meta-"+id).Bytes()
			if err == nil {
				var meta struct {
					Status string
					Result int
				}
				if err := json.Unmarshal(raw, &meta); err != nil || meta.Status != "SUCCESS" {
					t.Fatalf("result of %s: %s (%v)", id, raw, err)
				}
				sum += meta.Result
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no result for %s on the master: %v", id, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if sum != 90 {
		t.Errorf("sum of the stored results %d, want 90", sum)
	}
}
