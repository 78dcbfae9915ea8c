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
		// toxiproxy (the gray-failure matrix) leaves a link's toxic
		// goroutines blocked on a channel when its reader went away with
		// the connection; they belong to the library, not to celeriac.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
			goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).RemoveToxic.func1"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
