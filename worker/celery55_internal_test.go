package worker

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestStampedSignatureMessage: the next step of a stamped chain, built from
// the signature a real Celery 5.5.2 client embedded, carries the stamps in
// its headers exactly as the 5.5.2 worker published them (golden captures
// in protocol/testdata/golden/celery55).
func TestStampedSignatureMessage(t *testing.T) {
	load := func(name string) *protocol.TaskMessage {
		t.Helper()
		data, err := os.ReadFile("../protocol/testdata/golden/celery55/" + name)
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
	p := NewProducer(nil, ProducerConfig{})
	m, _, _, err := p.signatureMessage(next, []any{int64(3)}, callOptions{
		parentID: first.ID, rootID: first.RootID, chain: chain[:len(chain)-1], hasChain: true,
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
	m, _, _, err = p.signatureMessage(protocol.Signature{Task: "t", Options: map[string]any{}}, nil, callOptions{}, time.Now())
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
// delay levels); without ExchangeKind the type is left to the transport.
func TestExchangeKind(t *testing.T) {
	rec := &publishRecorder{}
	p := NewProducer(rec, ProducerConfig{})
	ctx := context.Background()
	if _, err := p.SendTask(ctx, "t", nil, nil, ToExchange("ex", "rk"), ExchangeKind(transport.Topic), Countdown(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendTask(ctx, "t", nil, nil, ToExchange("ex", "rk")); err != nil {
		t.Fatal(err)
	}
	if got := rec.got[0]; got.Exchange != "ex" || got.RoutingKey != "rk" || got.ExchangeType != transport.Topic {
		t.Errorf("with ExchangeKind: %q/%q type %q, want ex/rk type topic", got.Exchange, got.RoutingKey, got.ExchangeType)
	}
	if got := rec.got[1].ExchangeType; got != "" {
		t.Errorf("without ExchangeKind: type %q, want none", got)
	}
}
