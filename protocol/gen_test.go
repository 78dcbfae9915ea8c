package protocol

// Random value generators for round-trip tests. They use a seeded
// math/rand/v2 source owned by each test, so failures reproduce.

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"time"
)

type valueGen struct {
	r *rand.Rand
	// typed allows the kombu typed values (times, Decimal, UUID, bytes);
	// otherwise only JSON-native values are made.
	typed bool
	// bytes allows []byte without the other typed values (msgpack).
	bytes bool
	// bigInts allows *big.Int; fits64 limits them to the uint64 range.
	bigInts, fits64 bool
}

func newValueGen(seed uint64) *valueGen {
	return &valueGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), bigInts: true}
}

func (g *valueGen) value(depth int) any {
	n := 12
	if depth <= 0 {
		n = 9 // scalars only
	}
	switch g.r.IntN(n) {
	case 0:
		return nil
	case 1:
		return g.r.IntN(2) == 0
	case 2:
		return g.int()
	case 3:
		if g.bigInts {
			return g.bigInt()
		}
		return g.int()
	case 4:
		return g.float()
	case 5, 6:
		return g.str()
	case 7:
		if g.typed || g.bytes {
			b := make([]byte, g.r.IntN(8))
			for i := range b {
				b[i] = byte(g.r.IntN(256))
			}
			return b
		}
		return g.str()
	case 8:
		if g.typed {
			return g.typedValue()
		}
		return g.int()
	case 9, 10:
		out := make([]any, g.r.IntN(5))
		for i := range out {
			out[i] = g.value(depth - 1)
		}
		return out
	default:
		out := map[string]any{}
		for range g.r.IntN(5) {
			out[g.str()] = g.value(depth - 1)
		}
		return out
	}
}

func (g *valueGen) int() int64 {
	switch g.r.IntN(4) {
	case 0:
		return int64(g.r.IntN(512)) - 256
	case 1:
		return math.MaxInt64 - int64(g.r.IntN(3))
	case 2:
		return math.MinInt64 + int64(g.r.IntN(3))
	}
	return int64(g.r.Uint64())
}

func (g *valueGen) bigInt() *big.Int {
	if g.fits64 {
		return new(big.Int).SetUint64(math.MaxInt64 + 1 + g.r.Uint64N(math.MaxInt64))
	}
	n := new(big.Int).SetUint64(g.r.Uint64())
	n.Lsh(n, 64+uint(g.r.IntN(200)))
	if g.r.IntN(2) == 0 {
		n.Neg(n)
	}
	return n
}

func (g *valueGen) float() float64 {
	switch g.r.IntN(6) {
	case 0:
		return math.Float64frombits(g.r.Uint64()) // anything, NaN and Inf included
	case 1:
		return float64(g.r.IntN(1000))
	case 2:
		return math.Copysign(0, -1)
	case 3:
		return g.r.NormFloat64() * math.Pow(10, float64(g.r.IntN(40)-20))
	}
	return g.r.Float64()
}

// str makes valid UTF-8 with the characters escaping cares about.
func (g *valueGen) str() string {
	pool := []string{"a", "Z", "0", " ", "'", `"`, `\`, "/", "\n", "\t", "\x00", "\x1f", "\x7f",
		"é", "\u00a0", "\u200b", "\u2028", "日", "\U0001F600", "\ufffd", "\uffff", "__type__"}
	var sb strings.Builder
	for range g.r.IntN(8) {
		sb.WriteString(pool[g.r.IntN(len(pool))])
	}
	return sb.String()
}

func (g *valueGen) typedValue() any {
	switch g.r.IntN(6) {
	case 0:
		off := (g.r.IntN(48) - 24) * 30 * 60
		loc := time.UTC
		if off != 0 {
			loc = time.FixedZone("", off)
		}
		return time.Date(1+g.r.IntN(9999), time.Month(1+g.r.IntN(12)), 1+g.r.IntN(28),
			g.r.IntN(24), g.r.IntN(60), g.r.IntN(60), g.r.IntN(1e6)*1000, loc)
	case 1:
		return Date{Year: 1 + g.r.IntN(9999), Month: time.Month(1 + g.r.IntN(12)), Day: 1 + g.r.IntN(28)}
	case 2:
		return TimeOfDay{Hour: g.r.IntN(24), Minute: g.r.IntN(60), Second: g.r.IntN(60), Nanosecond: g.r.IntN(1e6) * 1000}
	case 3:
		return []Decimal{"1.50", "-0", "1E+3", "NaN", "-Infinity", "123456789012345678901234567890.5", "sNaN12"}[g.r.IntN(7)]
	case 4:
		var u UUID
		for i := range u {
			u[i] = byte(g.r.IntN(256))
		}
		return u
	}
	return g.bigInt()
}
