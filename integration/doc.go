// Package integration holds celeriac's end-to-end tests: real RabbitMQ and
// Redis brokers, with real Python Celery (Debian's python3-celery under
// /usr/bin/python3) publishing tasks and reading results on the other side.
//
// It is a separate module so that testcontainers-go and its Docker client
// never enter the dependency graph of celeriac's users.
//
// Brokers are found in this order: the URLs in CELERIAC_AMQP_URL and
// CELERIAC_REDIS_URL; the local defaults (amqp://guest:guest@127.0.0.1:5672//
// and redis://127.0.0.1:6379); testcontainers-go when a Docker engine is
// available. When none works the test is skipped, or fails when
// CELERIAC_REQUIRE_BROKERS=1 (CI sets it). Python Celery is required the same
// way: CELERIAC_PYTHON names the interpreter (default /usr/bin/python3).
package integration
