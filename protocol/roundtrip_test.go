package protocol_test

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/protocol"
)

// gen builds random messages from a seeded source, so that a failure is
// reproducible from the seed in the subtest name.
type gen struct {
	r *rand.Rand
	// msgpack has no big integers.
	bigInts bool
	// runes are the characters of generated strings: ASCII, escapes that
	// JSON must write, and multi-byte UTF-8 up to astral planes.
	runes []rune
}

func newGen(seed uint64, bigInts bool) *gen {
	return &gen{
		r:       rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
		bigInts: bigInts,
		runes:   []rune("abcXYZ09 _-./:éß☃日本😀\"\\\n\t\x00"),
	}
}

func (g *gen) str(max int) string {
	n := g.r.IntN(max + 1)
	var b strings.Builder
	for range n {
		b.WriteRune(g.runes[g.r.IntN(len(g.runes))])
	}
	return b.String()
}

func (g *gen) nonEmpty(prefix string) string { return prefix + g.str(8) }

func (g *gen) id() string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", g.r.Uint32(), g.r.IntN(1<<16), g.r.IntN(1<<12), g.r.IntN(1<<12), g.r.Uint64()&(1<<48-1))
}

// value returns a random decoded value of the package's JSON-native types.
func (g *gen) value(depth int) any {
	k := g.r.IntN(9)
	if depth <= 0 && k >= 6 {
		k = g.r.IntN(6)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return g.r.IntN(2) == 0
	case 2:
		return g.r.Int64() - g.r.Int64()
	case 3:
		// Finite, non-integral floats of varied magnitude.
		return (g.r.Float64() - 0.5) * float64(int64(1)<<g.r.IntN(60))
	case 4:
		return g.str(12)
	case 5:
		if g.bigInts {
			n := new(big.Int).Lsh(big.NewInt(g.r.Int64N(1<<40)+1), 70)
			if g.r.IntN(2) == 0 {
				n.Neg(n)
			}
			return n
		}
		return int64(g.r.IntN(100))
	case 6, 7:
		return g.list(depth - 1)
	default:
		return g.object(depth - 1)
	}
}

func (g *gen) list(depth int) []any {
	l := make([]any, g.r.IntN(4))
	for i := range l {
		l[i] = g.value(depth)
	}
	return l
}

func (g *gen) object(depth int) map[string]any {
	m := make(map[string]any)
	for range g.r.IntN(4) {
		m[g.str(6)] = g.value(depth)
	}
	return m
}

// when returns a time with microsecond resolution in one of the offsets
// Celery writes, or the zero time.
func (g *gen) when() time.Time {
	if g.r.IntN(3) == 0 {
		return time.Time{}
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("", -(3*3600 + 1800)), time.FixedZone("", 14*3600)}
	sec := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() + g.r.Int64N(100*365*86400)
	return time.Unix(sec, int64(g.r.IntN(1e6))*1000).In(zones[g.r.IntN(len(zones))])
}

func (g *gen) maybe(s string) string {
	if g.r.IntN(2) == 0 {
		return ""
	}
	return s
}

func (g *gen) signature(depth int) protocol.Signature {
	s := protocol.Signature{
		Task:      g.nonEmpty("tasks."),
		Args:      g.list(1),
		Kwargs:    g.object(1),
		Options:   map[string]any{},
		Immutable: g.r.IntN(2) == 0,
	}
	if g.r.IntN(2) == 0 {
		s.Options["task_id"] = g.id()
	}
	if depth > 0 && g.r.IntN(3) == 0 {
		s.SubtaskType = "group"
		s.Kwargs["tasks"] = []any{g.signature(depth - 1).Value()}
	}
	if g.r.IntN(4) == 0 {
		s.Extra = map[string]any{"chord_size": int64(g.r.IntN(10))}
	}
	return s
}

func (g *gen) signatures() []protocol.Signature {
	switch g.r.IntN(3) {
	case 0:
		return nil
	case 1:
		return []protocol.Signature{}
	}
	l := make([]protocol.Signature, 1+g.r.IntN(3))
	for i := range l {
		l[i] = g.signature(1)
	}
	return l
}

// task returns a random message whose fields survive EncodeTask unchanged
// (so encoder defaults do not apply).
func (g *gen) task() protocol.TaskMessage {
	id := g.id()
	t := protocol.TaskMessage{
		Protocol:   2,
		ID:         id,
		Name:       g.nonEmpty("tasks."),
		Lang:       []string{"go", "py"}[g.r.IntN(2)],
		Shadow:     g.maybe(g.nonEmpty("alias.")),
		ETA:        g.when(),
		Expires:    g.when(),
		Group:      g.maybe(g.id()),
		Retries:    g.r.IntN(100),
		RootID:     g.id(),
		ParentID:   g.maybe(g.id()),
		ArgsRepr:   g.nonEmpty("("),
		KwargsRepr: g.nonEmpty("{"),
		Origin:     g.maybe(g.nonEmpty("gen")),
		Args:       g.list(3),
		Kwargs:     g.object(3),
		Embed: protocol.Embed{
			Callbacks: g.signatures(),
			Errbacks:  g.signatures(),
			Chain:     g.signatures(),
		},
		CorrelationID: id,
		ReplyTo:       g.maybe(g.id()),
		Priority:      g.r.IntN(256),
		DeliveryMode:  uint8(1 + g.r.IntN(2)),
		Expiration:    g.maybe(fmt.Sprint(g.r.IntN(1e9))),
	}
	if g.r.IntN(2) == 0 {
		t.GroupIndex = ptr(g.r.IntN(50))
	}
	if g.r.IntN(2) == 0 {
		t.TimeLimit = time.Duration(g.r.Int64N(1e12)) * time.Microsecond
	}
	if g.r.IntN(2) == 0 {
		t.SoftTimeLimit = time.Duration(g.r.IntN(3600)) * time.Second
	}
	if g.r.IntN(3) > 0 {
		t.IgnoreResult = ptr(g.r.IntN(2) == 0)
	}
	if g.r.IntN(3) == 0 {
		t.ReplacedTaskNesting = 1 + g.r.IntN(3)
		t.StampedHeaders = []string{"stamp"}
		t.Stamps = map[string]any{"stamp": g.str(5)}
	}
	if g.r.IntN(2) == 0 {
		t.Headers = map[string]any{"x-" + g.str(5): g.value(2), "ts": int64(1700000000000)}
	}
	if g.r.IntN(2) == 0 {
		c := g.signature(2)
		t.Embed.Chord = &c
	}
	return t
}

// TestTaskRoundTrip checks decode(encode(m)) == m for generated messages,
// directly and through the Redis envelope. Times compare by instant
// (cmp uses time.Time.Equal); EquateEmpty is not used because nil and
// empty differ on the wire (null vs []) and must round-trip as they are.
func TestTaskRoundTrip(t *testing.T) {
	configs := []struct {
		name string
		opts protocol.EncodeOptions
		big  bool
	}{
		{"json", protocol.EncodeOptions{}, true},
		{"json+zlib", protocol.EncodeOptions{Compression: protocol.CompressionZlib}, true},
		{"msgpack", protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack}, false},
		{"msgpack+zlib", protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack, Compression: protocol.CompressionZlib}, false},
	}
	for _, c := range configs {
		for seed := uint64(1); seed <= 200; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", c.name, seed), func(t *testing.T) {
				want := newGen(seed, c.big).task()
				msg, err := protocol.EncodeTask(&want, c.opts)
				if err != nil {
					t.Fatalf("EncodeTask: %v", err)
				}
				got, err := protocol.DecodeTask(msg, protocol.DecodeOptions{})
				if err != nil {
					t.Fatalf("DecodeTask(EncodeTask()): %v", err)
				}
				want.ContentType = msg.ContentType
				want.ContentEncoding = msg.ContentEncoding
				want.Compression = c.opts.Compression
				if diff := valueDiff(want, *got); diff != "" {
					t.Errorf("DecodeTask(EncodeTask(m)) mismatch (-want +got):\n%s", diff)
				}

				// Through the Redis envelope as well.
				env := &protocol.Envelope{Message: *msg, BodyEncoding: protocol.BodyEncodingBase64,
					DeliveryTag: newGen(seed, false).id(), DeliveryInfo: protocol.DeliveryInfo{RoutingKey: "celery"}}
				data, err := protocol.EncodeEnvelope(env)
				if err != nil {
					t.Fatalf("EncodeEnvelope: %v", err)
				}
				back, err := protocol.DecodeEnvelope(data, protocol.DecodeOptions{})
				if err != nil {
					t.Fatalf("DecodeEnvelope(EncodeEnvelope()): %v", err)
				}
				if diff := valueDiff(env, back); diff != "" {
					t.Errorf("envelope round trip mismatch (-want +got):\n%s", diff)
				}
				got, err = protocol.DecodeTask(&back.Message, protocol.DecodeOptions{})
				if err != nil {
					t.Fatalf("DecodeTask(envelope): %v", err)
				}
				if diff := valueDiff(want, *got); diff != "" {
					t.Errorf("DecodeTask(envelope) mismatch (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func (g *gen) result() protocol.ResultMeta {
	states := []protocol.State{protocol.StateSuccess, protocol.StateFailure, protocol.StateRetry,
		protocol.StateRevoked, protocol.StateStarted, protocol.StatePending, "CUSTOM"}
	m := protocol.ResultMeta{
		TaskID:    g.id(),
		Status:    states[g.r.IntN(len(states))],
		Traceback: g.maybe(g.str(40)),
		Children:  []any{},
		DateDone:  g.when(),
		GroupID:   g.maybe(g.id()),
		ParentID:  g.maybe(g.id()),
	}
	for range g.r.IntN(3) {
		m.Children = append(m.Children, protocol.ChildTuple(g.id()))
	}
	switch m.Status {
	case protocol.StateFailure, protocol.StateRetry, protocol.StateRevoked:
		if g.r.IntN(5) > 0 {
			m.Result = &protocol.ExceptionInfo{Type: g.nonEmpty("E"), Message: g.list(2), Module: g.maybe("builtins")}
		}
	default:
		m.Result = g.value(3)
	}
	if g.r.IntN(2) == 0 {
		m.Extended = true
		m.Name = g.nonEmpty("tasks.")
		m.Args = g.list(2)
		m.Kwargs = g.object(2)
		m.Worker = g.maybe("w1@host")
		m.Retries = g.r.IntN(5)
		m.Queue = g.maybe("celery")
	}
	return m
}

func TestResultRoundTrip(t *testing.T) {
	for _, ct := range []string{protocol.ContentTypeJSON, protocol.ContentTypeMsgpack} {
		for seed := uint64(1); seed <= 300; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", ct, seed), func(t *testing.T) {
				want := newGen(seed, ct == protocol.ContentTypeJSON).result()
				data, err := protocol.EncodeResult(&want, ct)
				if err != nil {
					t.Fatalf("EncodeResult: %v", err)
				}
				got, err := protocol.DecodeResult(data, ct, protocol.DecodeOptions{})
				if err != nil {
					t.Fatalf("DecodeResult(EncodeResult()): %v\n%q", err, data)
				}
				if diff := valueDiff(want, *got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("DecodeResult(EncodeResult(m)) mismatch (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestSignatureRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		want := newGen(seed, true).signature(3)
		data, err := protocol.Marshal(protocol.ContentTypeJSON, want.Value())
		if err != nil {
			t.Fatalf("seed %d: Marshal: %v", seed, err)
		}
		v, err := protocol.Unmarshal(protocol.ContentTypeJSON, data, protocol.DecodeOptions{})
		if err != nil {
			t.Fatalf("seed %d: Unmarshal: %v", seed, err)
		}
		got, err := protocol.DecodeSignature(v)
		if err != nil {
			t.Fatalf("seed %d: DecodeSignature: %v", seed, err)
		}
		if diff := valueDiff(want, got); diff != "" {
			t.Errorf("seed %d: DecodeSignature(Value()) mismatch (-want +got):\n%s", seed, diff)
		}
	}
}
