module github.com/celeriac/celeriac

go 1.25.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/rabbitmq/amqp091-go v1.16.0
	go.uber.org/goleak v1.3.0
	go.uber.org/zap v1.28.0
)

require go.uber.org/multierr v1.10.0 // indirect
