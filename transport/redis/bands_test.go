package redis

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestBandLens: messages of each priority are counted in the band kombu
// puts them in, and the bands add up to Len.
func TestBandLens(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	for _, p := range []int{0, 0, 2, 3, 5, 9, 9, 9} {
		if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "bq", Message: protocol.Message{
			ContentType: "application/json", Body: []byte("[]"), Properties: protocol.Properties{Priority: p},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tr.BandLens(ctx, "bq")
	if err != nil {
		t.Fatal(err)
	}
	want := []BandLen{{0, 3}, {3, 2}, {6, 0}, {9, 3}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("bands (-want +got):\n%s", d)
	}
	if n, _ := tr.Len(ctx, "bq"); n != 8 {
		t.Errorf("Len = %d", n)
	}
}
