package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Control sends remote-control commands to workers — Python Celery workers
// and celeriac workers alike — as Python's app.control and `celery
// inspect` do: a broadcast on the celery.pidbox exchange, replies collected
// on a private reply queue.
type Control struct {
	tr transport.Transport
	// clock is the Lamport clock kombu's pidbox messages carry.
	clock publish.Clock
}

// The exchanges of Celery's remote control (kombu's pidbox).
const (
	pidboxExchange = "celery.pidbox"
	replyExchange  = "reply.celery.pidbox"
)

// NewControl returns a Control that talks through tr.
func NewControl(tr transport.Transport) *Control { return &Control{tr: tr} }

// ControlOptions select workers and bound the wait for replies.
type ControlOptions struct {
	// Destination lists node names (celery@host); empty means all.
	Destination []string
	// Pattern selects node names by a glob (Matcher "glob", the default) or
	// a regular expression (Matcher "pcre").
	Pattern string
	Matcher string
	// Timeout is how long replies are collected. Default 1 s.
	Timeout time.Duration
	// Limit stops collecting after this many replies (0: until Timeout).
	Limit int
}

// Reply is one worker's answer.
type Reply struct {
	Hostname string
	Value    any
}

// Call broadcasts method with arguments and returns the replies received
// before the timeout (or the limit), in arrival order.
func (c *Control) Call(ctx context.Context, method string, args map[string]any, o ControlOptions) ([]Reply, error) {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	oid := protocol.NewID()
	cons, err := c.tr.Consume(ctx, []transport.Queue{{
		Name:         oid + ".reply.celery.pidbox",
		Exchange:     replyExchange,
		ExchangeType: transport.Direct,
		RoutingKey:   oid,
		// kombu's reply queue: gone 10 s after the client, replies kept 5 min.
		Arguments: map[string]any{"x-expires": int64(10000), "x-message-ttl": int64(300000)},
	}}, transport.ConsumeOptions{})
	if err != nil {
		return nil, fmt.Errorf("client: control reply queue: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = cons.Stop(stopCtx)
		if a, ok := c.tr.(interface {
			Purge(context.Context, string) (int, error)
		}); ok {
			_, _ = a.Purge(stopCtx, oid+".reply.celery.pidbox")
		}
	}()
	ticket := protocol.NewID()
	if err := publishControl(ctx, c.tr, &c.clock, method, args, o, ticket, oid); err != nil {
		return nil, err
	}
	var replies []Reply
	timer := time.NewTimer(o.Timeout)
	defer timer.Stop()
	for {
		select {
		case d, ok := <-cons.Deliveries():
			if !ok {
				if err := cons.Err(); err != nil {
					return replies, err
				}
				return replies, nil
			}
			_ = d.Ack(ctx)
			if t, _ := d.Message.Headers["ticket"].(string); t != ticket {
				continue
			}
			if v, ok := publish.ToInt(d.Message.Headers["clock"]); ok {
				c.clock.Adjust(int64(v))
			}
			body, err := protocol.Unmarshal(d.Message.ContentType, d.Message.Body, protocol.DecodeOptions{})
			if err != nil {
				continue
			}
			m, _ := body.(map[string]any)
			for host, v := range m {
				replies = append(replies, Reply{Hostname: host, Value: v})
			}
			if o.Limit > 0 && len(replies) >= o.Limit {
				return replies, nil
			}
		case <-timer.C:
			return replies, nil
		case <-ctx.Done():
			return replies, ctx.Err()
		}
	}
}

// Cast broadcasts a command without waiting for replies (shutdown,
// rate_limit, ...).
func (c *Control) Cast(ctx context.Context, method string, args map[string]any, o ControlOptions) error {
	return publishControl(ctx, c.tr, &c.clock, method, args, o, "", "")
}

// publishControl broadcasts one pidbox command; with a ticket, replies go
// to the reply queue routed by oid.
func publishControl(ctx context.Context, pub transport.Publisher, clock *publish.Clock, method string, args map[string]any, o ControlOptions, ticket, oid string) error {
	if method == "" {
		return errors.New("client: empty control method")
	}
	if args == nil {
		args = map[string]any{}
	}
	if o.Timeout <= 0 {
		// kombu discards a command whose expires header has passed; a cast
		// gets the 1 s Python's broadcast gives it.
		o.Timeout = time.Second
	}
	body := map[string]any{
		"method": method, "arguments": args, "destination": nil, "pattern": nil, "matcher": nil,
	}
	if len(o.Destination) > 0 {
		d := make([]any, len(o.Destination))
		for i, s := range o.Destination {
			d[i] = s
		}
		body["destination"] = d
	}
	if o.Pattern != "" {
		body["pattern"] = o.Pattern
		m := o.Matcher
		if m == "" {
			m = "glob"
		}
		body["matcher"] = m
	}
	if ticket != "" {
		body["ticket"] = ticket
		body["reply_to"] = map[string]any{"exchange": replyExchange, "routing_key": oid}
	}
	data, err := protocol.Marshal(protocol.ContentTypeJSON, body)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	return pub.Publish(ctx, &transport.Publishing{
		Exchange: pidboxExchange, ExchangeType: transport.Fanout, NoConfirm: true,
		Message: protocol.Message{
			ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			Headers: map[string]any{
				"clock":   clock.Tick(),
				"expires": float64(time.Now().Add(o.Timeout).UnixNano()) / 1e9,
			},
			Properties: protocol.Properties{DeliveryMode: 1, ReplyTo: "gen" + strconv.Itoa(os.Getpid()) + "@" + host},
			Body:       data,
		},
	})
}
