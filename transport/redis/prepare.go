package redis

import (
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/internal/headers"
)

// PrepareLPush lays out p as Publish would push it onto a queue's list: the
// list's key and the envelope. It is for callers that must push a message
// in the same script as writes of their own, so that both happen or
// neither (celeriac beat records a periodic run and publishes it in one
// step). ok is false when Publish would route p through an exchange
// (fanout, topic, or a direct exchange's bindings): publish those with
// Publish.
func (t *Transport) PrepareLPush(p *transport.Publishing) (key string, data []byte, ok bool, err error) {
	if p.Exchange != "" || p.RoutingKey == "" {
		return "", nil, false, nil
	}
	if err := headers.CheckFinite(p.Message.Headers); err != nil {
		return "", nil, false, fmt.Errorf("redis: %w", err)
	}
	env := &protocol.Envelope{
		Message:      p.Message,
		BodyEncoding: "base64",
		DeliveryTag:  newTag(),
		DeliveryInfo: protocol.DeliveryInfo{Exchange: p.Exchange, RoutingKey: p.RoutingKey},
	}
	data, err = protocol.EncodeEnvelope(env)
	if err != nil {
		return "", nil, false, fmt.Errorf("redis: encode envelope: %w", err)
	}
	return t.keys.list(p.RoutingKey, clampPriority(p.Message.Properties.Priority)), data, true, nil
}

// Client is the transport's Redis client: the server and database its
// queues are on, where a script may write next to them.
func (t *Transport) Client() *goredis.Client { return t.rdb }
