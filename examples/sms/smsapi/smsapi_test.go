package smsapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/examples/sms/smsapi"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// fakeClock is a settable clock for the Server.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestServer(t *testing.T) {
	type call struct {
		after      time.Duration // since the previous call
		to, key    string
		fail       bool // the random draw says 503
		want       int
		retryAfter string
		replayed   bool
	}
	ok := "+15550001234"
	for _, tt := range []struct {
		name  string
		calls []call
	}{
		{"sends", []call{{to: ok, want: 200}, {to: "+442071838750", want: 200}}},
		{"bad numbers are 400", []call{
			{to: "555-1234", want: 400}, {to: "+0123456789", want: 400}, {to: "+1234567", want: 400},
			{to: "+1234567890123456", want: 400}, {to: "", want: 400},
		}},
		{"more than 5 in a second are 429", []call{
			{to: ok, want: 200}, {after: 100 * time.Millisecond, to: ok, want: 200}, {to: ok, want: 200},
			{to: ok, want: 200}, {to: ok, want: 200},
			{to: ok, want: 429, retryAfter: "1"},
			// The window slides: the first admission leaves it at 1 s.
			{after: 899 * time.Millisecond, to: ok, want: 429, retryAfter: "1"},
			{after: time.Millisecond, to: ok, want: 200},
			{to: ok, want: 429, retryAfter: "1"},
		}},
		{"a 429 does not count", []call{
			{to: ok, want: 200}, {to: ok, want: 200}, {to: ok, want: 200}, {to: ok, want: 200}, {to: ok, want: 200},
			{after: 500 * time.Millisecond, to: ok, want: 429, retryAfter: "1"}, {to: ok, want: 429, retryAfter: "1"},
			{after: 500 * time.Millisecond, to: ok, want: 200},
		}},
		{"503 when the draw fails", []call{{to: ok, fail: true, want: 503}, {to: ok, want: 200}}},
		{"idempotency key replays the send", []call{
			{to: ok, key: "m1", want: 200},
			{to: ok, key: "m1", want: 200, replayed: true},
			{to: ok, key: "m2", fail: true, want: 503},
			{to: ok, key: "m2", want: 200},
			{to: "bad", key: "m3", want: 400},
			{after: time.Second, to: "bad", key: "m3", want: 400},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{t: epoch}
			var fail bool
			s := smsapi.NewServer(smsapi.Config{FailureRate: 0.5, Now: clock.now, Rand: func() float64 {
				if fail {
					return 0
				}
				return 0.9
			}})
			for i, c := range tt.calls {
				clock.t = clock.t.Add(c.after)
				fail = c.fail
				req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(fmt.Sprintf(`{"message_id": "m-%d", "to": %q, "body": "hi"}`, i, c.to)))
				if c.key != "" {
					req.Header.Set("Idempotency-Key", c.key)
				}
				w := httptest.NewRecorder()
				s.ServeHTTP(w, req)
				if w.Code != c.want || w.Header().Get("Retry-After") != c.retryAfter {
					t.Errorf("call %d: %d Retry-After %q, want %d %q (%s)", i, w.Code, w.Header().Get("Retry-After"), c.want, c.retryAfter, w.Body)
				}
				if c.want == 200 && c.replayed != strings.Contains(w.Body.String(), `"replayed":true`) {
					t.Errorf("call %d: body %s, replayed want %v", i, w.Body, c.replayed)
				}
			}
			recs := s.Records()
			if len(recs) != len(tt.calls) {
				t.Fatalf("%d records for %d calls", len(recs), len(tt.calls))
			}
			for i, r := range recs {
				if r.Status != tt.calls[i].want || r.MessageID != fmt.Sprintf("m-%d", i) || r.Replayed != tt.calls[i].replayed {
					t.Errorf("record %d = %+v", i, r)
				}
			}
		})
	}
}

func TestServerRoutes(t *testing.T) {
	s := smsapi.NewServer(smsapi.Config{})
	for _, tt := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodGet, "/", "", 404},
		{http.MethodPost, "/x", `{}`, 404},
		{http.MethodPost, "/", `{"to": `, 400},
		{http.MethodPost, "/", `[1]`, 400},
		{http.MethodGet, "/records", "", 200},
	} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body)))
		if w.Code != tt.want {
			t.Errorf("%s %s %s: %d, want %d", tt.method, tt.path, tt.body, w.Code, tt.want)
		}
	}
}

func TestClient(t *testing.T) {
	srv := httptest.NewServer(smsapi.NewServer(smsapi.Config{Limit: 2}))
	defer srv.Close()
	c := &smsapi.Client{URL: srv.URL}
	ctx := t.Context()
	r, err := c.Send(ctx, smsapi.Message{MessageID: "a", To: "+15550001111", Body: "x"}, "a")
	if err != nil || r.SID == "" || r.Replayed {
		t.Fatalf("send: %+v %v", r, err)
	}
	if r2, err := c.Send(ctx, smsapi.Message{MessageID: "a", To: "+15550001111", Body: "x"}, "a"); err != nil || r2.SID != r.SID || !r2.Replayed {
		t.Fatalf("replay: %+v %v, want %s replayed", r2, err, r.SID)
	}
	_, err = c.Send(ctx, smsapi.Message{MessageID: "b", To: "+15550001111"}, "")
	var se *smsapi.StatusError
	if !errors.As(err, &se) || se.Status != 429 || se.RetryAfter == "" || smsapi.Transient(err) {
		t.Fatalf("third send in a second: %v, want a non-transient 429 with Retry-After", err)
	}

	// Status classes.
	for _, tt := range []struct {
		status    int
		body      string
		transient bool
		message   string
	}{
		{400, `{"error": "invalid phone number"}`, false, "invalid phone number"},
		{404, `nope`, false, "nope"},
		{408, ``, true, ""},
		{500, `{}`, true, "{}"},
		{503, `{"error": "down"}`, true, "down"},
		{200, `{"sid": ""}`, true, "unreadable 200 answer"},
		{200, `<html>`, true, "unreadable 200 answer"},
	} {
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tt.status)
			fmt.Fprint(w, tt.body)
		}))
		_, err := (&smsapi.Client{URL: fake.URL}).Send(ctx, smsapi.Message{To: "+15550001111"}, "")
		fake.Close()
		if !errors.As(err, &se) || smsapi.Transient(err) != tt.transient || !strings.Contains(se.Message, tt.message) {
			t.Errorf("%d %s: %v (transient %v), want transient %v", tt.status, tt.body, err, smsapi.Transient(err), tt.transient)
		}
	}
	// Network errors are transient.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	if _, err := (&smsapi.Client{URL: dead.URL}).Send(ctx, smsapi.Message{}, ""); err == nil || !smsapi.Transient(err) {
		t.Errorf("connection refused: %v, want transient", err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-cctx.Done()
	if _, err := c.Send(cctx, smsapi.Message{}, ""); err == nil || !smsapi.Transient(err) {
		t.Errorf("timeout: %v, want transient", err)
	}
}

func TestPerWindow(t *testing.T) {
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, epoch.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	for _, tt := range []struct {
		name  string
		times []time.Time
		want  []int
	}{
		{"none", nil, nil},
		{"one", at(5), []int{1}},
		{"5/s", at(0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000), []int{5, 5, 1}},
		{"gap", at(0, 999, 3000), []int{2, 0, 0, 1}},
		{"burst", at(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), []int{10}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, smsapi.PerWindow(tt.times, time.Second)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func ExamplePerWindow() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var sends []time.Time
	for i := range 12 {
		sends = append(sends, start.Add(time.Duration(i)*200*time.Millisecond))
	}
	fmt.Println(smsapi.PerWindow(sends, time.Second))
	// Output: [5 5 2]
}

// FuzzServer: no request body or key makes the provider panic or answer
// anything but its documented statuses.
func FuzzServer(f *testing.F) {
	f.Add([]byte(`{"message_id": "m", "to": "+15550001234", "body": "hi"}`), "k")
	f.Add([]byte(`{"message_id": 1, "to": ["x"]}`), "")
	f.Add([]byte(`{"to": "+1555000123\u0000"}`), "\xff")
	f.Add([]byte(`{`), "k")
	f.Add([]byte(strings.Repeat("[", 100000)), "")
	f.Fuzz(func(t *testing.T, body []byte, key string) {
		defer fuzzwatch.Watch(t, body, key)()
		s := smsapi.NewServer(smsapi.Config{Limit: 1 << 20, FailureRate: 0.3})
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		req.Header["Idempotency-Key"] = []string{key}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		switch w.Code {
		case 200, 400, 503:
		default:
			t.Errorf("status %d", w.Code)
		}
	})
}
