package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// TestParseRabbitQueue: the counts and rates RabbitMQ's management API
// gives for a queue; counts it leaves out are unknown, and figures no
// queue can have are refused rather than shown.
func TestParseRabbitQueue(t *testing.T) {
	tests := []struct {
		name, give string
		want       RabbitQueue
		wantErr    string
	}{
		{name: "busy queue", give: `{"name":"celery","messages":7,"messages_ready":4,"messages_unacknowledged":3,"consumers":2,"consumer_details":[],
			"message_stats":{"publish":90,"publish_details":{"rate":1.5},"ack":80,"ack_details":{"rate":1.25}}}`,
			want: RabbitQueue{Ready: 4, Unacked: 3, Consumers: 2, PublishRate: 1.5, AckRate: 1.25, HasRates: true}},
		{name: "no traffic yet", give: `{"messages_ready":0,"messages_unacknowledged":0,"consumers":0}`, want: RabbitQueue{}},
		{name: "no statistics yet", give: `{"name":"q","consumers":1}`, want: RabbitQueue{Ready: -1, Unacked: -1, Consumers: 1}},
		{name: "publish rate only", give: `{"messages_ready":1,"messages_unacknowledged":0,"consumers":0,"message_stats":{"publish_details":{"rate":0.2}}}`,
			want: RabbitQueue{Ready: 1, PublishRate: 0.2, HasRates: true}},
		{name: "negative rate", give: `{"messages_ready":1,"messages_unacknowledged":0,"consumers":0,"message_stats":{"ack_details":{"rate":-3}}}`,
			want: RabbitQueue{Ready: 1}},
		{name: "negative count", give: `{"messages_ready":1,"messages_unacknowledged":-1,"consumers":0}`, wantErr: "messages_unacknowledged is -1"},
		{name: "fractional count", give: `{"messages_ready":1.5}`, wantErr: "messages_ready is 1.5"},
		{name: "huge count", give: `{"consumers":1e300}`, wantErr: "consumers is 1e+300"},
		{name: "string count", give: `{"messages_ready":"7"}`, wantErr: "not a queue object"},
		{name: "a list", give: `[]`, wantErr: "not a queue object"},
		{name: "html", give: `<html>`, wantErr: "not a queue object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRabbitQueue([]byte(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestRabbitAPIQueue: the request names the vhost and queue escaped, with
// the URL's credentials (else the broker's); an error status, an answer
// too large or a redirect is an error that names no password.
func TestRabbitAPIQueue(t *testing.T) {
	var gotPath, gotUser, gotPass string
	big := `{"messages_ready":1,"x":"` + strings.Repeat("a", maxRabbitAnswer) + `"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.EscapedPath()
		gotUser, gotPass, _ = r.BasicAuth()
		switch {
		case strings.HasSuffix(r.URL.Path, "/missing"):
			http.Error(w, `{"error":"Object Not Found"}`, http.StatusNotFound)
		case strings.HasSuffix(r.URL.Path, "/big"):
			w.Write([]byte(big))
		case strings.HasSuffix(r.URL.Path, "/moved"):
			http.Redirect(w, r, "http://elsewhere.invalid/", http.StatusFound)
		default:
			json.NewEncoder(w).Encode(map[string]any{"messages_ready": 2, "messages_unacknowledged": 5, "consumers": 1})
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a, err := NewRabbitAPI(strings.Replace(srv.URL, "http://", "http://mon:s3cret@", 1)+"/api/", "/", "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	q, err := a.Queue(ctx, "a/b c")
	if err != nil {
		t.Fatal(err)
	}
	if q.Unacked != 5 || q.Ready != 2 || q.Consumers != 1 {
		t.Errorf("queue = %+v", q)
	}
	if gotPath != "/api/queues/%2F/a%2Fb%20c" || gotUser != "mon" || gotPass != "s3cret" {
		t.Errorf("asked %s as %s:%s", gotPath, gotUser, gotPass)
	}
	if strings.Contains(a.String(), "s3cret") {
		t.Errorf("String() shows the password: %s", a)
	}

	a, err = NewRabbitAPI(srv.URL, "h-dash", "guest", "pw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Queue(ctx, "celery"); err != nil || gotPath != "/api/queues/h-dash/celery" || gotUser != "guest" || gotPass != "pw" {
		t.Errorf("without /api/ and credentials: %v, asked %s as %s:%s", err, gotPath, gotUser, gotPass)
	}
	for q, want := range map[string]string{"missing": "404", "big": "larger than", "moved": "302"} {
		if _, err := a.Queue(ctx, q); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: err = %v, want %q", q, err, want)
		}
	}
	for _, bad := range []string{"ftp://h/api/", "localhost:15672", "http://"} {
		if _, err := NewRabbitAPI(bad, "/", "", ""); err == nil {
			t.Errorf("NewRabbitAPI(%q) accepted", bad)
		}
	}
}

// FuzzParseRabbitQueue: whatever the management API answers, parsing
// returns an error or figures a queue can have.
func FuzzParseRabbitQueue(f *testing.F) {
	f.Add([]byte(`{"messages_ready":4,"messages_unacknowledged":3,"consumers":2,"message_stats":{"publish_details":{"rate":1.5},"ack_details":{"rate":1.25}}}`))
	f.Add([]byte(`{"consumers":1e300}`))
	f.Add([]byte(`{"message_stats":{"ack_details":{"rate":-1e308}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		defer fuzzwatch.Watch(t, b)()
		q, err := parseRabbitQueue(b)
		if err != nil {
			return
		}
		for _, n := range []int{q.Ready, q.Unacked, q.Consumers} {
			if n < -1 {
				t.Fatalf("count %d from %q", n, b)
			}
		}
		for _, r := range []float64{q.PublishRate, q.AckRate} {
			if r < 0 || r > 1e12 || r != r {
				t.Fatalf("rate %v from %q", r, b)
			}
		}
	})
}
