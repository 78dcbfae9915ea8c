package integration

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExamplePyinterop runs the README's Python interop example as a user
// would: the examples/pyinterop binary, and examples/pyinterop/client.py
// under Python Celery, on both brokers.
func TestExamplePyinterop(t *testing.T) {
	bin := buildBin(t, "./examples/pyinterop")
	client, err := filepath.Abs("../examples/pyinterop/client.py")
	if err != nil {
		t.Fatal(err)
	}
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		env := []string{"CELERY_BROKER_URL=" + bc.broker, "CELERY_RESULT_BACKEND=" + bc.backend, "CELERY_QUEUE=" + q}
		w := exec.Command(bin)
		w.Env = append(os.Environ(), env...)
		logs, err := w.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		ready := make(chan struct{})
		exited := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(logs)
			once := false
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				if !once && strings.Contains(sc.Text(), "worker ready") {
					once = true
					close(ready)
				}
			}
			exited <- w.Wait()
		}()
		t.Cleanup(func() { _ = w.Process.Kill() })
		select {
		case <-ready:
		case err := <-exited:
			t.Fatalf("pyinterop exited: %v\n%s", err, log.String())
		case <-time.After(30 * time.Second):
			t.Fatal("pyinterop not ready after 30 s")
		}
		cmd := exec.Command(pythonBin(t), client)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client.py: %v\n%s", err, out)
		}
		for _, want := range []string{
			"add(2, 3) = 5\n",
			"wordcount = {'top': {'brown': 1, 'dog': 1, 'end': 1, 'fox': 1, 'the': 3}, 'words': 9}\n",
			"chain = 10\n",
			"group = [0, 2, 4, 6, 8]\n",
			"chord = 90\n",
			"fail raised ValueError: bad input\n",
			"'ok': 'pong'",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("client.py output lacks %q:\n%s", want, out)
			}
		}
		if err := w.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("pyinterop after SIGTERM: %v\n%s", err, log.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("pyinterop did not exit after SIGTERM")
		}
	})
}
