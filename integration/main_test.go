package integration

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks, after every test ran and the containers stopped, that no
// goroutine outlived its test: workers, transports, backends and consumers
// started in-process must all have shut down.
func TestMain(m *testing.M) {
	code := m.Run()
	stopContainers()
	stopTopologies()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
