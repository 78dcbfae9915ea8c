package sql

import (
	"errors"
	"math/big"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestGetReadsPythonRows: rows Python Celery's own DatabaseBackend writes
// (store_result, mark_as_revoked, mark_as_started) read back through Get:
// values of every kind the decoder knows, exceptions as ExceptionInfo,
// None as nil, and pickles it refuses as a PickledResult whose Err says
// why.
func TestGetReadsPythonRows(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	url := "db+postgresql+psycopg2" + strings.TrimPrefix(transporttest.PostgresURL(t), "postgres")
	cmd := exec.CommandContext(t.Context(), python, "testdata/store_rows.py", url, b.s.schema)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("store_rows.py: %v\n%s", err, out)
	}
	big70 := new(big.Int).Lsh(big.NewInt(1), 70)
	want := map[string]struct {
		state  protocol.State
		result any
	}{
		"py-success": {protocol.StateSuccess, map[string]any{
			"n": int64(5), "big": big70, "when": time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
			"aware": time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", -5*3600)),
			"day":   protocol.Date{Year: 2024, Month: 2, Day: 29}, "amount": protocol.Decimal("1.10"),
			"id": protocol.UUID{15: 5}, "tags": []any{"a", "b"}, "blob": []byte{0, 0xff},
			"set": []any{int64(1)}, "none": nil, "f": 1.5,
		}},
		"py-none":    {protocol.StateSuccess, nil},
		"py-failure": {protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing", int64(42)}, Module: "builtins"}},
		"py-retry":   {protocol.StateRetry, &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}},
		"py-revoked": {protocol.StateRevoked, &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"revoked"}, Module: "celery.exceptions"}},
		"py-started": {protocol.StateStarted, map[string]any{"pid": int64(4242), "hostname": "py@host"}},
	}
	for id, w := range want {
		m, err := b.Get(t.Context(), id)
		if err != nil {
			t.Errorf("Get(%s): %v", id, err)
			continue
		}
		if m.Status != w.state {
			t.Errorf("%s: status %s, want %s", id, m.Status, w.state)
		}
		if diff := cmp.Diff(w.result, m.Result, pickleCmp); diff != "" {
			t.Errorf("%s: Result mismatch (-want +got):\n%s", id, diff)
		}
	}
	m, err := b.Get(t.Context(), "py-failure")
	if err == nil && !strings.Contains(m.Traceback, "ValueError") {
		t.Errorf("py-failure: traceback %q", m.Traceback)
	}
	// An application object, and an exception stored with
	// result_serializer = "pickle": refused, never constructed.
	for _, id := range []string{"py-object", "py-pickled-exc"} {
		m, err := b.Get(t.Context(), id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
		p, ok := m.Result.(PickledResult)
		if !ok || p.Size == 0 || !errors.Is(p.Err, ErrUnsafePickle) {
			t.Errorf("%s: Result %#v, want a PickledResult with ErrUnsafePickle", id, m.Result)
		}
	}
}
