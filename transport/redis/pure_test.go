package redis

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    Endpoint
		wantErr string
	}{
		{name: "default port and db", give: "redis://localhost", want: Endpoint{Network: "tcp", Addrs: []string{"localhost:6379"}}},
		{name: "password and db", give: "redis://:s3cret@10.0.0.1:6380/12", want: Endpoint{Network: "tcp", Addrs: []string{"10.0.0.1:6380"}, Password: "s3cret", DB: 12}},
		{name: "user", give: "redis://bob:pw@h/3", want: Endpoint{Network: "tcp", Addrs: []string{"h:6379"}, Username: "bob", Password: "pw", DB: 3}},
		{name: "tls with kombu options", give: "rediss://h:6390/1?ssl_cert_reqs=CERT_NONE&ssl_ca_certs=/ca.pem",
			want: Endpoint{Network: "tcp", Addrs: []string{"h:6390"}, TLS: true, DB: 1, CertReqs: "CERT_NONE", CACerts: "/ca.pem"}},
		{name: "sentinels as kombu spells them", give: "sentinel://:pw@s1:26379/2;sentinel://s2:26380;sentinel://s3",
			want: Endpoint{Network: "tcp", Addrs: []string{"s1:26379", "s2:26380", "s3:26379"}, Sentinel: true, Password: "pw", DB: 2}},
		{name: "unix socket", give: "redis+socket:///run/redis.sock?virtual_host=4", want: Endpoint{Network: "unix", Addrs: []string{"/run/redis.sock"}, DB: 4}},
		{name: "bad db", give: "redis://h/x", wantErr: "database is an integer"},
		{name: "bad scheme", give: "amqp://h", wantErr: "unsupported URL scheme"},
		{name: "bad cert reqs", give: "rediss://h?ssl_cert_reqs=MAYBE", wantErr: "ssl_cert_reqs"},
		{name: "redis list", give: "redis://a;redis://b", wantErr: "only sentinel"},
		{name: "empty", give: "", wantErr: "no address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseURL(tt.give)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseURL(%q) error = %v, want %q", tt.give, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("ParseURL() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    Config
		wantErr string
	}{
		{name: "zero is valid", give: Config{}},
		{name: "strategy", give: Config{QueueOrderStrategy: "random"}, wantErr: "QueueOrderStrategy"},
		{name: "steps", give: Config{PrioritySteps: []int{0, 12}}, wantErr: "priority step"},
		{name: "batch", give: Config{BatchSize: 5000}, wantErr: "BatchSize"},
		{name: "sentinel needs master", give: Config{URL: "sentinel://s1"}, wantErr: "MasterName"},
		{name: "sentinel", give: Config{URL: "sentinel://s1", MasterName: "m"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestKeysAsKombu(t *testing.T) {
	k := newKeys(Config{}.withDefaults(), 12)
	// Python: [steps[bisect(steps, p) - 1] for p in range(10)].
	var bands []int
	for p := range 10 {
		bands = append(bands, k.band(p))
	}
	if diff := cmp.Diff([]int{0, 0, 0, 3, 3, 3, 6, 6, 6, 9}, bands); diff != "" {
		t.Fatalf("bands (-want +got):\n%s", diff)
	}
	odd := keys{steps: []int{1, 5}}
	bands = bands[:0]
	for p := range 10 {
		bands = append(bands, odd.band(p))
	}
	if diff := cmp.Diff([]int{5, 1, 1, 1, 1, 5, 5, 5, 5, 5}, bands); diff != "" {
		t.Fatalf("bands of [1, 5] (-want +got):\n%s", diff)
	}
	// The captured BRPOP of a 5.2 worker on two queues.
	want := []string{"exp_other", "exp_celery", "exp_other\x06\x163", "exp_celery\x06\x163",
		"exp_other\x06\x166", "exp_celery\x06\x166", "exp_other\x06\x169", "exp_celery\x06\x169"}
	if diff := cmp.Diff(want, k.consumeOrder([]string{"exp_other", "exp_celery"})); diff != "" {
		t.Fatalf("consume order (-want +got):\n%s", diff)
	}
	if got := k.list("exp_celery", 5); got != "exp_celery\x06\x163" {
		t.Fatalf("list(5) = %q", got)
	}
	if got := k.list("q", 42); got != "q\x06\x169" {
		t.Fatalf("list(42) = %q", got)
	}
	if got := k.publishChannel("celeryev", "worker.heartbeat"); got != "/12.celeryev/worker.heartbeat" {
		t.Fatalf("publish channel %q", got)
	}
	if got := k.subscribePattern("celeryev", "worker.#"); got != "/12.celeryev/worker.*" {
		t.Fatalf("subscribe pattern %q", got)
	}
	if got := k.subscribePattern("celery.pidbox", ""); got != "/12.celery.pidbox" {
		t.Fatalf("pidbox pattern %q", got)
	}
	p := newKeys(Config{GlobalKeyPrefix: "app:"}.withDefaults(), 0)
	for got, want := range map[string]string{
		p.unacked: "app:unacked", p.unackedIndex: "app:unacked_index", p.unackedMutex: "app:unacked_mutex",
		p.binding("celery"): "app:_kombu.binding.celery", p.publishChannel("celery.pidbox", ""): "app:/0.celery.pidbox",
		p.list("celery", 9): "app:celery\x06\x169", p.deadList("celery"): "app:celeriac.dead.celery",
		p.queueOfKey("app:celery\x06\x166"): "celery",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestTopicPatternAsKombu(t *testing.T) {
	// Python: TopicExchange(None).key_to_pattern(k), kombu 5.2.4.
	tests := map[string]string{
		"worker.#":        `^worker\..*?$`,
		"a.*.c":           `^a\..*?[^\.]\.c$`,
		"#":               `^.*?$`,
		"*":               `^.*?[^\.]$`,
		"foo-bar.baz_qux": `^foo\-bar\.baz\_qux$`,
		"x@y.*":           `^x\@y\..*?[^\.]$`,
		"a b":             `^a\ b$`,
		"é.#":             `^é\..*?$`,
	}
	for k, want := range tests {
		if got := topicPattern(k); got != want {
			t.Errorf("topicPattern(%q) = %q, want %q", k, got, want)
		}
	}
	var m topicMatcher
	matches := []struct {
		key, rk string
		want    bool
	}{
		{"worker.#", "worker.heartbeat", true},
		{"worker.#", "worker.", true},
		{"worker.#", "task.succeeded", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.x.c", true}, // kombu's '*' is .*?[^.]: it spans dots
		{"a.*.c", "a..c", false},
		{"#", "", true},
		{"x+y", "x+y", true},
		{"x+y", "xxy", false},
	}
	for _, tt := range matches {
		if got := m.match(tt.key, tt.rk); got != tt.want {
			t.Errorf("match(%q, %q) = %v, want %v", tt.key, tt.rk, got, tt.want)
		}
	}
}

func TestAppendPyString(t *testing.T) {
	// Python: json.dumps(s).
	tests := map[string]string{
		"":           `""`,
		"exp_celery": `"exp_celery"`,
		"a/b":        `"a/b"`,
		`q"x`:        `"q\"x"`,
		"tab\there":  `"tab\there"`,
		"é€":         `"\u00e9\u20ac"`,
		"😀":          `"\ud83d\ude00"`,
		"\x7f\x01":   `"\u007f\u0001"`,
	}
	for s, want := range tests {
		if got := string(appendPyString(nil, s)); got != want {
			t.Errorf("appendPyString(%q) = %s, want %s", s, got, want)
		}
	}
}

func TestMarkRedelivered(t *testing.T) {
	tests := []struct {
		name, give, want string
	}{
		{name: "both flags",
			give: `{"body": "e30=", "headers": {"task": "t", "n": 12345678901234567890}, "properties": {"delivery_info": {"exchange": "", "routing_key": "q"}, "delivery_tag": "x", "priority": 6}}`,
			want: `{"body":"e30=","headers":{"n":12345678901234567890,"redelivered":true,"task":"t"},"properties":{"delivery_info":{"exchange":"","redelivered":true,"routing_key":"q"},"delivery_tag":"x","priority":6}}`},
		{name: "no headers", give: `{"properties": {"delivery_info": {}}}`,
			want: `{"properties":{"delivery_info":{"redelivered":true}}}`},
		{name: "null headers", give: `{"headers": null, "properties": {"delivery_info": null}}`,
			want: `{"headers":null,"properties":{"delivery_info":null}}`},
		{name: "html kept", give: `{"headers": {"x": "<&>"}}`, want: `{"headers":{"redelivered":true,"x":"<&>"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := markRedelivered([]byte(tt.give))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Fatalf("markRedelivered() mismatch (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := markRedelivered([]byte(`[1]`)); err == nil {
		t.Fatal("markRedelivered accepted an array")
	}
}

func TestUnackedValueRoundTrip(t *testing.T) {
	env := `{"body": "e30=", "properties": {"delivery_tag": "t"}}`
	v := unackedValue([]byte(env), "", "exp_celery")
	// kombu: json.dumps([payload, "", "exp_celery"]) of a Python-written payload.
	if want := `[{"body": "e30=", "properties": {"delivery_tag": "t"}}, "", "exp_celery"]`; string(v) != want {
		t.Fatalf("unackedValue = %s, want %s", v, want)
	}
	gotEnv, ex, rk, err := parseUnacked(v)
	if err != nil || string(gotEnv) != env || ex != "" || rk != "exp_celery" {
		t.Fatalf("parseUnacked = %s %q %q %v", gotEnv, ex, rk, err)
	}
	if _, _, rk, err := parseUnacked([]byte(`[{}, null, null]`)); err != nil || rk != "" {
		t.Fatalf("parseUnacked(nulls) = %q, %v", rk, err)
	}
	for _, bad := range []string{`{}`, `[{}, "", ""`, `[{}, "", "", 1]`, `["x", "", ""]`, `[{}, 1, ""]`} {
		if _, _, _, err := parseUnacked([]byte(bad)); err == nil {
			t.Errorf("parseUnacked(%s) accepted", bad)
		}
	}
}

func TestParseMeta(t *testing.T) {
	tests := []struct {
		give    string
		want    envMeta
		wantErr bool
	}{
		{give: `{"properties": {"delivery_tag": "t", "priority": 7, "delivery_info": {"exchange": "e", "routing_key": "r", "redelivered": true}}}`,
			want: envMeta{Tag: "t", Exchange: "e", RoutingKey: "r", Priority: 7, Redelivered: true}},
		{give: `{"properties": {"delivery_tag": "t", "priority": "12"}}`, want: envMeta{Tag: "t", Priority: 9}},
		{give: `{"properties": {"delivery_tag": "t", "priority": null}}`, want: envMeta{Tag: "t"}},
		{give: `{"properties": {"delivery_tag": "t", "priority": -3.5}}`, want: envMeta{Tag: "t"}},
		{give: `{"properties": {"delivery_tag": 5}}`, wantErr: true},
		{give: `{"properties": {}}`, wantErr: true},
		{give: `{}`, wantErr: true},
		{give: `nope`, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseMeta([]byte(tt.give))
		if (err != nil) != tt.wantErr {
			t.Fatalf("parseMeta(%s) error = %v", tt.give, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Fatalf("parseMeta(%s) mismatch (-want +got):\n%s", tt.give, diff)
		}
	}
}

func TestDeadItemRoundTrip(t *testing.T) {
	env := `{"body": "e30=", "headers": {"x": "<&>"}}`
	raw, err := encodeDeadItem(&deadItem{ID: "t1", Envelope: json.RawMessage(env), Queue: "q", Reason: "max-retries",
		Error: "boom", Time: json.RawMessage(`"2026-11-29T12:00:00Z"`)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(raw), `,"envelope":`+env+`}`) {
		t.Fatalf("envelope not kept byte for byte: %s", raw)
	}
	d, err := decodeDeadItem(raw)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != "t1" || string(d.envelopeBytes()) != env || d.Reason != "max-retries" || parseDeadTime(d.Time).IsZero() {
		t.Fatalf("decoded %+v", d)
	}
	str, _ := marshalJSON("not json")
	d2 := &deadItem{ID: "x", Envelope: str}
	if string(d2.envelopeBytes()) != "not json" {
		t.Fatalf("raw envelope = %q", d2.envelopeBytes())
	}
	if _, err := encodeDeadItem(&deadItem{ID: "x", Envelope: json.RawMessage("{")}); err == nil {
		t.Fatal("invalid envelope accepted")
	}
}

func TestSweepPeriod(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"defaults: kombu's 100 s", Config{}, 100 * time.Second},
		{"visibility 5 s: every second", Config{VisibilityTimeout: 5 * time.Second}, time.Second},
		{"visibility 60 s: a tenth", Config{VisibilityTimeout: time.Minute}, 6 * time.Second},
		{"visibility 1 h: kombu's bound", Config{VisibilityTimeout: time.Hour}, 100 * time.Second},
		{"kombu options win when shorter", Config{VisibilityTimeout: 5 * time.Second, RestoreInterval: 200 * time.Millisecond, RestoreThrottle: 1}, 200 * time.Millisecond},
		{"kombu options bound a long timeout", Config{VisibilityTimeout: 10 * time.Hour, RestoreInterval: 5 * time.Second, RestoreThrottle: 2}, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.SweepPeriod(); got != tt.want {
				t.Errorf("SweepPeriod() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestConnWatchNodes: a new connection to another address than the last
// one is a failover, counted and logged; reconnecting to the same server is
// not.
func TestConnWatchNodes(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	w := &connWatch{log: zap.New(core)}
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.2:6379", "10.0.0.1:6379"} {
		w.sawNode(addr)
	}
	if got := w.failovers.Load(); got != 2 {
		t.Errorf("failovers = %d, want 2", got)
	}
	if got := w.current(); got != "10.0.0.1:6379" {
		t.Errorf("current() = %q", got)
	}
	entries := logs.FilterMessageSnippet("the master changed").All()
	if len(entries) != 2 || entries[0].ContextMap()["from"] != "10.0.0.1:6379" || entries[0].ContextMap()["to"] != "10.0.0.2:6379" {
		t.Errorf("failover log lines: %+v", entries)
	}
}
