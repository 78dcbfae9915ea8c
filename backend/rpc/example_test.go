package rpc_test

import (
	"context"
	"fmt"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// printer is a Publisher that prints instead of sending; a real program
// passes its transport.
type printer struct{}

func (printer) Publish(_ context.Context, p *transport.Publishing) error {
	fmt.Printf("to %q correlation_id %s delivery_mode %d\n", p.RoutingKey, p.Message.Properties.CorrelationID, p.Message.Properties.DeliveryMode)
	return nil
}

func Example() {
	be, _ := rpc.New(printer{}, rpc.Config{})
	defer be.Close()
	_ = be.Store(context.Background(), backend.StoreRequest{
		Meta:    &protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess, Result: int64(5)},
		ReplyTo: "3f0c0e6a-reply", CorrelationID: "t1",
	})
	// Output: to "3f0c0e6a-reply" correlation_id t1 delivery_mode 1
}
