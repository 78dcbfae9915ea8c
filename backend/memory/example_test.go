package memory_test

import (
	"context"
	"fmt"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
)

func Example() {
	ctx := context.Background()
	be := memory.New()
	defer be.Close()

	_ = be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess, Result: int64(5)}})
	// A late FAILURE (say, from a redelivered copy of the task) is ignored.
	_ = be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t1", Status: protocol.StateFailure}})

	m, _ := be.Wait(ctx, "t1")
	fmt.Println(m.Status, m.Result)
	// Output: SUCCESS 5
}

func ExampleBackend_ChordPartReturn() {
	ctx := context.Background()
	be := memory.New()
	defer be.Close()

	_ = be.SetChordSize(ctx, "g1", 3)
	for _, i := range []int{2, 0, 1} {
		r, _ := be.ChordPartReturn(ctx, backend.ChordPart{
			GroupID: "g1", GroupIndex: &i, TaskID: fmt.Sprint("t", i),
			State: protocol.StateSuccess, Result: int64(i * 10),
		})
		if r.Ready {
			for _, p := range r.Results {
				fmt.Print(p.Result, " ")
			}
			fmt.Println()
		}
	}
	// Output: 0 10 20
}
