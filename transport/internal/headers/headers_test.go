package headers

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

func TestCheckFinite(t *testing.T) {
	nan := math.NaN()
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	tests := []struct {
		name string
		give any
		want string // "" for finite, else a part of the error
	}{
		{"nil", nil, ""},
		{"values", []any{"s", int64(1), 1.5, float32(0.1), true, []byte("b"), time.Unix(0, 0), big.NewInt(1),
			protocol.Decimal("NaN"), protocol.UUID{}, math.MaxFloat64, -math.SmallestNonzeroFloat64}, ""},
		{"typed", map[string][]float32{"a": {1, 2}}, ""},
		{"NaN", nan, `header "h": protocol: cannot encode value: NaN is not a finite number`},
		{"float32 NaN", float32(nan), "NaN is not a finite number"},
		{"+Inf", math.Inf(1), "+Inf is not a finite number"},
		{"float32 -Inf", float32(math.Inf(-1)), "-Inf is not a finite number"},
		{"in a list", []any{1.5, []any{nan}}, `header "h"[1][0]: protocol`},
		{"in a map", map[string]any{"ok": 1.0, "f": math.Inf(1)}, `header "h"["f"]: protocol`},
		{"typed slice", []float64{0, nan}, `"h"[1]: protocol`},
		{"pointer", &nan, "NaN is not a finite number"},
		{"typed map", map[string]float32{"f": float32(math.Inf(1))}, `"h"["f"]: protocol`},
		// encoding/json refuses the struct's NaN, and so will the encoder.
		{"struct", struct{ F float64 }{nan}, ""},
		{"cyclic", cyclic, "nested more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFinite(map[string]any{"ok": "fine", "h": tt.give})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckFinite() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("CheckFinite() = %v, want an error containing %q", err, tt.want)
			}
			if !errors.Is(err, protocol.ErrUnencodable) && !errors.Is(err, protocol.ErrTooDeep) {
				t.Errorf("CheckFinite() = %v, wraps neither protocol.ErrUnencodable nor protocol.ErrTooDeep", err)
			}
		})
	}
}
