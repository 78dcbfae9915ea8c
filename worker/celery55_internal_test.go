package worker

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestStampedSignatureMessage: the next step of a stamped chain, built from
// the signature a real Celery 5.5.2 client embedded, carries the stamps in
// its headers exactly as the 5.5.2 worker published them (golden captures
// in protocol/testdata/golden/celery55; the same for 5.6.3 in celery56).
func TestStampedSignatureMessage(t *testing.T) {
	for _, dir := range []string{"celery55", "celery56"} {
		t.Run(dir, func(t *testing.T) { testStampedSignatureMessage(t, dir) })
	}
}

func testStampedSignatureMessage(t *testing.T, dir string) {
	load := func(name string) *protocol.TaskMessage {
		t.Helper()
		data, err := os.ReadFile("../protocol/testdata/golden/" + dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		env, err := protocol.DecodeEnvelope(data, protocol.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(m.StampedHeaders)
		return m
	}
	// chain(add.s(1, 2), add.s(3), tsum.s()) stamped: embed.chain holds the
	// remaining steps, reversed.
	first := load("stamped_chain.redis.json")
	chain := first.Embed.Chain
	next := chain[len(chain)-1]
	p := publish.New(nil, publish.Config{})
	m, _, _, err := p.Message(next, []any{int64(3)}, publish.Call{
		ParentID: first.ID, RootID: first.RootID, Chain: chain[:len(chain)-1], HasChain: true,
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m.StampedHeaders)
	// What the 5.5 worker published for the same step of the same canvas
	// (run separately: ids differ, stamps do not).
	want := load("chain_next_stamped.redis.json")
	if diff := cmp.Diff(want.StampedHeaders, m.StampedHeaders); diff != "" {
		t.Errorf("stamped_headers mismatch (-5.5 worker +celeriac):\n%s", diff)
	}
	if diff := cmp.Diff(want.Stamps, m.Stamps); diff != "" {
		t.Errorf("stamps mismatch (-5.5 worker +celeriac):\n%s", diff)
	}
	// The steps after it keep their own stamped options.
	if got := m.Embed.Chain[0].Options["stamped_headers"]; got == nil {
		t.Errorf("remaining chain step lost its stamped options: %v", m.Embed.Chain[0].Options)
	}

	// An unstamped signature makes an unstamped message.
	m, _, _, err = p.Message(protocol.Signature{Task: "t", Options: map[string]any{}}, nil, publish.Call{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if m.StampedHeaders != nil || m.Stamps != nil {
		t.Errorf("unstamped signature gave stamped_headers %v, stamps %v", m.StampedHeaders, m.Stamps)
	}
}

type publishRecorder struct{ got []*transport.Publishing }

func (r *publishRecorder) Publish(_ context.Context, p *transport.Publishing) error {
	r.got = append(r.got, p)
	return nil
}

// TestExchangeKind: a producer that names its exchange's type passes it to
// the transport (which routes a countdown to a topic exchange through the
// delay levels); with an empty kind the type is left to the transport.
func TestExchangeKind(t *testing.T) {
	rec := &publishRecorder{}
	p := client.New(rec, client.Config{})
	ctx := context.Background()
	if _, err := p.Send(ctx, "t", nil, nil, client.Exchange("ex", "rk", transport.Topic), client.Countdown(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, "t", nil, nil, client.Exchange("ex", "rk", "")); err != nil {
		t.Fatal(err)
	}
	if got := rec.got[0]; got.Exchange != "ex" || got.RoutingKey != "rk" || got.ExchangeType != transport.Topic {
		t.Errorf("with ExchangeKind: %q/%q type %q, want ex/rk type topic", got.Exchange, got.RoutingKey, got.ExchangeType)
	}
	if got := rec.got[1].ExchangeType; got != "" {
		t.Errorf("without ExchangeKind: type %q, want none", got)
	}
}
