package amqp

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestParseURLs(t *testing.T) {
	tests := []struct {
		name    string
		primary string
		more    []string
		want    []brokerURL
		wantErr string
	}{
		{
			name:    "celery default",
			primary: "amqp://guest:guest@localhost:5672//",
			want: []brokerURL{{dial: "amqp://guest:guest@localhost:5672//", redacted: "amqp://guest:xxxxx@localhost:5672//",
				host: "localhost"}},
		},
		{
			name:    "failover form, spaces and empty parts",
			primary: "amqp://a:5672//; pyamqp://u:p@b//;;",
			more:    []string{"amqps://c"},
			want: []brokerURL{
				{dial: "amqp://a:5672//", redacted: "amqp://a:5672//", host: "a"},
				{dial: "amqp://u:p@b//", redacted: "pyamqp://u:xxxxx@b//", host: "b"},
				{dial: "amqp://c:5671", redacted: "amqps://c", host: "c", tls: true},
			},
		},
		{
			name:    "amqps keeps an explicit port",
			primary: "amqps://u:secret@rabbit.example:15671/vh",
			want: []brokerURL{{dial: "amqp://u:secret@rabbit.example:15671/vh",
				redacted: "amqps://u:xxxxx@rabbit.example:15671/vh", host: "rabbit.example", tls: true}},
		},
		{name: "empty", primary: " ; ", wantErr: "no broker URL"},
		{name: "redis scheme", primary: "redis://localhost:6379/0", wantErr: `scheme "redis": must be`},
		{name: "opaque", primary: "amqp:guest:secret@host", wantErr: "malformed"},
		{name: "bad port", primary: "amqp://u:secret@h:notaport/", wantErr: "malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseURLs(tt.primary, tt.more)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("error leaks the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(brokerURL{})); diff != "" {
				t.Errorf("parseURLs() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSettingsDefaults(t *testing.T) {
	s, err := newSettings(Config{URL: "amqp://localhost//"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Heartbeat != 10*time.Second || s.DialTimeout != 10*time.Second || s.ConnectionName != "celeriac" ||
		s.ReconnectInitial != 2*time.Second || s.ReconnectStep != 2*time.Second || s.ReconnectMax != 30*time.Second ||
		s.ReconnectJitter != 0 || s.FailoverStrategy != FailoverRoundRobin || s.ConfirmTimeout != 30*time.Second || s.log == nil {
		t.Errorf("defaults not applied: %+v", s.Config)
	}
	if got := s.DeadLetterQueue("celery"); got != "celery.dlq" {
		t.Errorf("DeadLetterQueue(celery) = %q", got)
	}
	for _, bad := range []Config{
		{URL: "amqp://h//", ReconnectJitter: 2},
		{URL: "amqp://h//", FailoverStrategy: "random"},
		{URL: "amqp://h//", Declare: 7},
		{URL: "amqp://h//", QoS: 9},
		{URL: "amqp://h//", QueueArguments: map[string]any{"x": struct{}{}}},
		{},
	} {
		if _, err := newSettings(bad); err == nil {
			t.Errorf("newSettings(%+v) accepted a bad config", bad)
		}
	}
}

func TestBackoff(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name   string
		n      int
		step   time.Duration
		jitter float64
		r      float64
		want   time.Duration
	}{
		// Celery's schedule: 2 s, 4 s, 6 s, ... 30 s, 30 s.
		{"celery first", 0, 2 * time.Second, 0, 0.9, 2 * time.Second},
		{"celery second", 1, 2 * time.Second, 0, 0, 4 * time.Second},
		{"celery 14", 14, 2 * time.Second, 0, 0, 30 * time.Second},
		{"celery capped", 15, 2 * time.Second, 0, 0, 30 * time.Second},
		{"celery huge n", 1 << 40, 2 * time.Second, 0, 0, 30 * time.Second},
		// Doubling, with a negative step.
		{"doubling 0", 0, -1, 0, 0.9, 2 * time.Second},
		{"doubling 3", 3, -1, 0, 0, 16 * time.Second},
		{"doubling capped", 10, -1, 0, 0, 30 * time.Second},
		{"doubling huge n", 1000, -1, 0, 0, 30 * time.Second},
		// Jitter takes up to its fraction off.
		{"jitter none drawn", 1, 2 * time.Second, 0.5, 0, 4 * time.Second},
		{"jitter all drawn", 1, 2 * time.Second, 0.5, 1, 2 * time.Second},
		{"jitter 1", 0, 2 * time.Second, 1, 0.5, 1000 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := backoff(tt.n, 2*time.Second, tt.step, 30*time.Second, tt.jitter, tt.r); got != tt.want {
				t.Errorf("backoff(%d) = %v, want %v", tt.n, got, tt.want)
			}
		})
	}
}

func TestFailoverOrder(t *testing.T) {
	urls := "amqp://a//;amqp://b//;amqp://c//"
	rr, err := newSettings(Config{URL: urls})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		lost int
		want []int
	}{
		{-1, []int{0, 1, 2}}, // first connection: in the order given
		{0, []int{1, 2, 0}},  // a lost node is tried last
		{1, []int{2, 0, 1}},
		{2, []int{0, 1, 2}},
	}
	for _, tt := range tests {
		if got := rr.order(tt.lost); !slices.Equal(got, tt.want) {
			t.Errorf("round-robin order(%d) = %v, want %v", tt.lost, got, tt.want)
		}
	}
	sh, err := newSettings(Config{URL: urls, FailoverStrategy: FailoverShuffle})
	if err != nil {
		t.Fatal(err)
	}
	firsts := map[int]int{}
	for range 300 {
		got := sh.order(0)
		if s := slices.Sorted(slices.Values(got)); !slices.Equal(s, []int{0, 1, 2}) {
			t.Fatalf("shuffle order %v is not a permutation of every URL", got)
		}
		firsts[got[0]]++
	}
	// 300 draws: each URL comes first about 100 times; below 50 is a
	// one-in-10^9 accident.
	for i := range 3 {
		if firsts[i] < 50 {
			t.Errorf("shuffle put URL %d first %d times in 300 rounds: %v", i, firsts[i], firsts)
		}
	}
}

func TestParseMismatch(t *testing.T) {
	// Reasons captured from RabbitMQ 3.10.
	tests := []struct {
		reason string
		want   MismatchError
		quorum bool
	}{
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'at_probe1' in vhost '/': received none but current is the value '10' of type 'signedint'",
			want: MismatchError{Kind: "queue", Name: "at_probe1", Vhost: "/", Argument: "x-max-priority",
				Current: "10", CurrentType: "signedint", CurrentSet: true},
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'at_probe2' in vhost '/': received the value '10' of type 'signedint' but current is none",
			want: MismatchError{Kind: "queue", Name: "at_probe2", Vhost: "/", Argument: "x-max-priority",
				Declared: "10", DeclaredType: "signedint", DeclaredSet: true},
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'at_probe3' in vhost '/': received '5' but current is '10'",
			want: MismatchError{Kind: "queue", Name: "at_probe3", Vhost: "/", Argument: "x-max-priority",
				Declared: "5", DeclaredSet: true, Current: "10", CurrentSet: true},
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'at_probe4' in vhost '/': received none but current is the value 'dlx' of type 'longstr'",
			want: MismatchError{Kind: "queue", Name: "at_probe4", Vhost: "/", Argument: "x-dead-letter-exchange",
				Current: "dlx", CurrentType: "longstr", CurrentSet: true},
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'at_probe5' in vhost '/': received none but current is the value 'quorum' of type 'longstr'",
			want: MismatchError{Kind: "queue", Name: "at_probe5", Vhost: "/", Argument: "x-queue-type",
				Current: "quorum", CurrentType: "longstr", CurrentSet: true},
			quorum: true,
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'at_probe6' in vhost '/': received 'classic' but current is 'quorum'",
			want: MismatchError{Kind: "queue", Name: "at_probe6", Vhost: "/", Argument: "x-queue-type",
				Declared: "classic", DeclaredSet: true, Current: "quorum", CurrentSet: true},
			quorum: true,
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'at_probex' in vhost '/': received 'direct' but current is 'fanout'",
			want: MismatchError{Kind: "exchange", Name: "at_probex", Vhost: "/", Argument: "type",
				Declared: "direct", DeclaredSet: true, Current: "fanout", CurrentSet: true},
		},
		{
			reason: "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'it's' in vhost 'a': b': received 'true' but current is 'false'",
			want: MismatchError{Kind: "queue", Name: "it's", Vhost: "a': b", Argument: "durable",
				Declared: "true", DeclaredSet: true, Current: "false", CurrentSet: true},
		},
		{reason: "PRECONDITION_FAILED - something else", want: MismatchError{}},
	}
	for _, tt := range tests {
		t.Run(tt.want.Name, func(t *testing.T) {
			got := parseMismatch(tt.reason)
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("parseMismatch() mismatch (-want +got):\n%s", diff)
			}
			if got.Quorum() != tt.quorum {
				t.Errorf("Quorum() = %v, want %v", got.Quorum(), tt.quorum)
			}
		})
	}
}

func TestAsMismatch(t *testing.T) {
	ae := &amqp091.Error{Code: amqp091.PreconditionFailed, Server: true,
		Reason: "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'q' in vhost '/': received none but current is the value '10' of type 'signedint'"}
	mm := asMismatch(fmt.Errorf("declare: %w", ae), "queue", "q")
	if mm == nil {
		t.Fatal("not recognised")
	}
	var err error = mm
	if !errors.Is(err, transport.ErrTopologyMismatch) {
		t.Error("errors.Is(ErrTopologyMismatch) is false")
	}
	var got *amqp091.Error
	if !errors.As(err, &got) || got != ae {
		t.Error("errors.As does not reach the broker's error")
	}
	want := `amqp: queue "q" in vhost "/" exists with x-max-priority = "10" (signedint), but celeriac declared absent`
	if err.Error() != want {
		t.Errorf("Error() = %q\nwant      %q", err.Error(), want)
	}
	for _, other := range []error{
		errors.New("x"),
		&amqp091.Error{Code: amqp091.NotFound, Reason: "NOT_FOUND - no queue 'q'"},
		&amqp091.Error{Code: amqp091.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 1"},
	} {
		if asMismatch(other, "queue", "q") != nil {
			t.Errorf("asMismatch(%v) recognised a mismatch", other)
		}
	}
}

func FuzzParseMismatch(f *testing.F) {
	f.Add("PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'at_probe1' in vhost '/': received none but current is the value '10' of type 'signedint'")
	f.Add("PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'at_probe6' in vhost '/': received 'classic' but current is 'quorum'")
	f.Add("inequivalent arg '' for  '' in vhost '': received the value ' but current is the value '")
	f.Fuzz(func(t *testing.T, reason string) {
		defer fuzzwatch.Watch(t, reason)()
		m := parseMismatch(reason)
		if m == nil {
			t.Fatal("nil result")
		}
		if len(m.Name)+len(m.Argument)+len(m.Vhost)+len(m.Declared)+len(m.Current) > len(reason) {
			t.Fatalf("parsed parts longer than the input: %+v", m)
		}
		m.Err = &amqp091.Error{Reason: reason}
		_ = m.Error()
	})
}

func FuzzParseURLs(f *testing.F) {
	f.Add("amqp://guest:guest@localhost:5672//;amqps://u:secret@h:5671/vh?heartbeat=5")
	f.Add("pyamqp://u:secret@[::1]:5672/%2f; ;amqp://")
	f.Add("amqps://u:secret@h:99999/")
	f.Add("amqps://::/:secret@")        // found by CI's fuzzing: the "password" is in the vhost
	f.Add("amqp://u:se/cret@h:5672/vh") // an unescaped "/" puts half the password in the port
	f.Add("seCret://:secret@")          // the scheme, not the password, is named
	f.Fuzz(func(t *testing.T, raw string) {
		defer fuzzwatch.Watch(t, raw)()
		urls, err := parseURLs(raw, nil)
		if err != nil {
			// Only where "secret" is nowhere else in the input: a scheme
			// or host spelt "seCret" may be named in the error (CI's
			// fuzzing found "seCret://:secret@").
			if strings.Contains(raw, ":secret@") && strings.Count(strings.ToLower(raw), "secret") == 1 &&
				strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks the password: %v", err)
			}
			return
		}
		for _, u := range urls {
			r, err := url.Parse(u.redacted)
			if err != nil {
				t.Fatalf("redacted URL %q does not parse: %v", u.redacted, err)
			}
			if pw, ok := r.User.Password(); ok && pw != "xxxxx" || r.Opaque != "" || r.Fragment != "" {
				t.Fatalf("redacted URL may show a password: %s", u.redacted)
			}
			if _, err := parseURL(u.dial); err != nil {
				t.Fatalf("dial URL %q does not parse again: %v", u.dial, err)
			}
		}
	})
}
