package main

import (
	"context"
	"testing"

	"github.com/celeriac/celeriac/protocol"
)

// TestDemo keeps the README's demo command working: the whole demo on the
// embedded broker, each task reaching the state and result it shows.
func TestDemo(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	rows, err := demo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status protocol.State
		show   string
	}{
		{protocol.StateSuccess, "5"},
		{protocol.StateSuccess, "{'top': {'age': 2, 'it': 8, 'of': 8, 'the': 8, 'was': 8}, 'words': 16}"},
		{protocol.StateSuccess, "148933"},
		{protocol.StateSuccess, "'14b4bd196927880da257f3a9149add1354a1404d794b5f4fa76f9009718d57e8'"},
		{protocol.StateFailure, "ValueError('bad input')"},
		{protocol.StateSuccess, "'succeeded after 2 retries'"},
		{protocol.StateSuccess, "42"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, w := range want {
		if rows[i].meta.Status != w.status || show(rows[i].meta) != w.show {
			t.Errorf("%s: %s %s, want %s %s", rows[i].label, rows[i].meta.Status, show(rows[i].meta), w.status, w.show)
		}
	}
}
