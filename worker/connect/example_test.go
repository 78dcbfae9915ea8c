package connect_test

import (
	"context"
	"log"

	"github.com/celeriac/celeriac/worker/connect"
)

// Client certificates as Celery's broker_use_ssl and redis_backend_use_ssl
// give them.
func ExampleSSLOptions() {
	c, err := connect.Open(context.Background(), connect.Options{
		BrokerURL:     "amqp://u:p@rabbit-a:5671//;amqp://u:p@rabbit-b:5671//", // TLS: BrokerSSL is set
		ResultBackend: "redis://redis:6380/1",                                  // rediss://, as BackendSSL is set
		BrokerSSL: &connect.SSLOptions{KeyFile: "/etc/celeriac/client.key", CertFile: "/etc/celeriac/client.pem",
			CACerts: "/etc/celeriac/ca.pem", CertReqs: "CERT_REQUIRED"},
		BackendSSL: &connect.SSLOptions{KeyFile: "/etc/celeriac/client.key", CertFile: "/etc/celeriac/client.pem",
			CACerts: "/etc/celeriac/ca.pem"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
