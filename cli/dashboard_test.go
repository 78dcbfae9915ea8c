package cli

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadBasicAuth(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          map[string]string
		err           string
	}{
		{"ok", "# ops\nalice:s3cret\n\nbob:pa:ss\n", map[string]string{"alice": "s3cret", "bob": "pa:ss"}, ""},
		{"no colon", "alice\n", nil, "line 1: want user:password"},
		{"empty password", "alice:\n", nil, "line 1"},
		{"empty", "# nobody\n", nil, "no user:password line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readBasicAuth(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("%v %v", got, err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestDashboardUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, a := range [][]string{
		{"dashboard", "extra"},
		{"dashboard", "--max-tasks", "0"},
		{"dashboard", "--basic-auth-file", missing},
		{"dashboard"}, // no broker
	} {
		_, errs, code := cli(t, append([]string{"-b", ""}, a...)...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", a, code, exitUsage, errs)
		}
	}
}

// TestDashboardBrokerAPI: --broker-api is for RabbitMQ only, and it asks
// for the broker's vhost with the broker's credentials unless its URL has
// its own, without quoting a password when the URL does not parse.
func TestDashboardBrokerAPI(t *testing.T) {
	_, errs, code := cli(t, "-b", "memory://", "dashboard", "--broker-api", "http://127.0.0.1:15672/api/")
	if code != exitUsage || !strings.Contains(errs, "RabbitMQ's management API") {
		t.Errorf("--broker-api on the memory broker: exit %d\n%s", code, errs)
	}
	for broker, want := range map[string]string{
		"amqp://u:p@h:5672/h-dash":       "h-dash u:p",
		"pyamqp://u:p@h//":               "/ u:p",
		"amqps://u:p@h/v;amqp://x:y@h2/": "v u:p",
		"amqp://h":                       "/ guest:guest",
	} {
		var gotPath, gotAuth string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, _ := r.BasicAuth()
			gotPath, gotAuth = r.URL.Path, u+":"+p
			w.Write([]byte(`{"messages_unacknowledged": 1}`))
		}))
		api, err := rabbitAPI(srv.URL, broker)
		if err != nil {
			t.Fatalf("%s: %v", broker, err)
		}
		if _, err := api.Queue(t.Context(), "celery"); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		vhost, auth, _ := strings.Cut(want, " ")
		if gotPath != "/api/queues/"+vhost+"/celery" || gotAuth != auth {
			t.Errorf("%s: asked %s as %s, want vhost %s as %s", broker, gotPath, gotAuth, vhost, auth)
		}
	}
	if _, err := rabbitAPI("http://h:15672/", "amqp://u:s3cret@h:port/"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad broker URL: %v", err)
	}
}

// TestDashboardPublicListen (issue 26, finding 6): a --listen address
// that is not loopback needs credentials, or --insecure-no-auth.
func TestDashboardPublicListen(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:5555", "dash.example:5555"} {
		_, errs, code := cli(t, "-b", "memory://", "dashboard", "--listen", listen)
		if code != exitUsage || !strings.Contains(errs, "not a loopback address") {
			t.Errorf("--listen %s without credentials: exit %d\n%s", listen, code, errs)
		}
	}
}

func TestListenHosts(t *testing.T) {
	for _, tc := range []struct {
		listen          string
		hosts           string
		anyIP, loopback bool
	}{
		{"127.0.0.1:5555", "127.0.0.1", false, true},
		{"localhost:5555", "localhost", false, true},
		{"[::1]:5555", "::1", false, true},
		{":5555", "", true, false},
		{"0.0.0.0:5555", "", true, false},
		{"[::]:5555", "", true, false},
		{"10.1.2.3:5555", "10.1.2.3", false, false},
		{"dash.internal:80", "dash.internal", false, false},
	} {
		hosts, anyIP, loopback := listenHosts(tc.listen)
		if strings.Join(hosts, ",") != tc.hosts || anyIP != tc.anyIP || loopback != tc.loopback {
			t.Errorf("%s: %v %v %v", tc.listen, hosts, anyIP, loopback)
		}
	}
}

// TestDashboardCommand runs `celeriac dashboard` in-process on the memory
// broker: it serves the pages on --listen, refuses actions without
// credentials, and saves --persist when it stops.
func TestDashboardCommand(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	persist := filepath.Join(t.TempDir(), "history.json")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-b", "memory://", "dashboard", "--listen", addr, "--persist", persist, "--refresh", "100ms"}, io.Discard, &stderr)
	}()
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/workers")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the dashboard does not answer: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, "<h1>Workers</h1>") || !strings.Contains(body, "read-only (no credentials configured)") {
		t.Errorf("workers page:\n%s", body)
	}
	resp, err := http.PostForm("http://"+addr+"/action/worker", url.Values{"op": {"shutdown"}, "worker": {"w@h"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("an action without credentials configured: %d", resp.StatusCode)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("exit %d\n%s", code, stderr.String())
	}
	if b, err := os.ReadFile(persist); err != nil || !strings.Contains(string(b), `"version":1`) {
		t.Errorf("--persist file: %v %s", err, b)
	}
}
