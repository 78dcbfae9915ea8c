package redis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestSentinelURL starts a Redis Sentinel of its own (redis-server
// --sentinel) watching the test Redis, and uses the transport through a
// kombu-style sentinel URL list whose first entry is unreachable.
func TestSentinelURL(t *testing.T) {
	e := newEnv(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed; the Sentinel test needs it")
	}
	master := e.raw.Options().Addr
	host, port, _ := net.SplitHostPort(master)
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		t.Skipf("Sentinel test needs a local Redis, have %s", master)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sport := l.Addr().(*net.TCPAddr).Port
	l.Close()
	name := "rt_master_" + randHex(4)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	cfgText := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\nsentinel monitor %s %s %s 1\n", sport, name, host, port)
	if err := os.WriteFile(conf, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", sport))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sentinel did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}

	cfg := e.config()
	cfg.URL = fmt.Sprintf("sentinel://127.0.0.1:1/%d;sentinel://127.0.0.1:%d", testDB, sport)
	cfg.MasterName = name
	tr := e.dial(cfg)
	ctx := context.Background()
	msg := protocol.Message{ContentType: "application/json", Body: []byte(`[[1], {}, null]`), Headers: map[string]any{"task": "t"}}
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "rt_q", Message: msg}); err != nil {
		t.Fatal(err)
	}
	// The message landed in db 10 of the master, under the prefix.
	if n := e.raw.LLen(ctx, e.key("rt_q")).Val(); n != 1 {
		t.Fatalf("master's list has %d messages", n)
	}
	c := consume(t, tr, 1, "rt_q")
	d := receive(t, c.Deliveries())
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
