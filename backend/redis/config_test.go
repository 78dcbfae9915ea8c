package redis

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
)

func TestSettings(t *testing.T) {
	tests := []struct {
		name    string
		give    Config
		want    settings
		wantErr bool
	}{
		{name: "defaults", give: Config{}, want: settings{expires: 86400, taskPrefix: "celery-task-meta-", groupPrefix: "celery-taskset-meta-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch}},
		{name: "no expiry", give: Config{ResultExpires: NoExpiry}, want: settings{expires: 0, taskPrefix: "celery-task-meta-", groupPrefix: "celery-taskset-meta-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch}},
		{name: "sub-second expiry rounds up to one second", give: Config{ResultExpires: 300 * time.Millisecond}, want: settings{expires: 1, taskPrefix: "celery-task-meta-", groupPrefix: "celery-taskset-meta-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch}},
		{name: "global prefix gets underscore", give: Config{GlobalKeyPrefix: "app", ResultExpires: time.Hour + 500*time.Millisecond}, want: settings{expires: 3600, taskPrefix: "app_celery-task-meta-", groupPrefix: "app_celery-taskset-meta-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch, globalPrefix: "app_"}},
		{name: "global prefix ending in colon", give: Config{GlobalKeyPrefix: "app:"}, want: settings{expires: 86400, taskPrefix: "app:celery-task-meta-", groupPrefix: "app:celery-taskset-meta-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch, globalPrefix: "app:"}},
		{name: "global prefix ending in dot", give: Config{GlobalKeyPrefix: "a.", KeyPrefix: "k-", GroupKeyPrefix: "g-"}, want: settings{expires: 86400, taskPrefix: "a.k-", groupPrefix: "a.g-", contentType: protocol.ContentTypeJSON, luaFormat: "json", maxBatch: DefaultMaxBatch, globalPrefix: "a."}},
		{name: "msgpack by name", give: Config{Serializer: "msgpack", MaxBatch: 1}, want: settings{expires: 86400, taskPrefix: "celery-task-meta-", groupPrefix: "celery-taskset-meta-", contentType: protocol.ContentTypeMsgpack, luaFormat: "msgpack", maxBatch: 1}},
		{name: "msgpack by content type", give: Config{Serializer: protocol.ContentTypeMsgpack}, want: settings{expires: 86400, taskPrefix: "celery-task-meta-", groupPrefix: "celery-taskset-meta-", contentType: protocol.ContentTypeMsgpack, luaFormat: "msgpack", maxBatch: DefaultMaxBatch}},
		{name: "pickle refused", give: Config{Serializer: "pickle"}, wantErr: true},
		{name: "yaml refused", give: Config{Serializer: protocol.ContentTypeYAML}, wantErr: true},
		{name: "negative batch", give: Config{MaxBatch: -1}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.give.settings()
			if (err != nil) != tt.wantErr {
				t.Fatalf("settings() err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			got.log = nil
			if d := cmp.Diff(tt.want, got, cmp.AllowUnexported(settings{})); d != "" {
				t.Errorf("settings() mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestNewClientURLs(t *testing.T) {
	tests := []struct {
		name     string
		url      string
		wantAddr string
		wantDB   int
		wantTLS  bool
		insecure bool
		wantErr  bool
	}{
		{name: "default", url: "", wantAddr: "127.0.0.1:6379"},
		{name: "db and password", url: "redis://:secret@example.com:6380/3", wantAddr: "example.com:6380", wantDB: 3},
		{name: "go-redis option", url: "redis://h/1?pool_size=5", wantAddr: "h:6379", wantDB: 1},
		{name: "rediss", url: "rediss://h:6390/2?ssl_cert_reqs=required", wantAddr: "h:6390", wantDB: 2, wantTLS: true},
		{name: "rediss cert none", url: "rediss://h/0?ssl_cert_reqs=CERT_NONE", wantAddr: "h:6379", wantTLS: true, insecure: true},
		{name: "socket", url: "socket:///run/redis.sock?virtual_host=4", wantAddr: "/run/redis.sock", wantDB: 4},
		{name: "unix", url: "unix:///run/redis.sock?db=5", wantAddr: "/run/redis.sock", wantDB: 5},
		{name: "ssl option without tls", url: "redis://h/0?ssl_cert_reqs=none", wantErr: true},
		{name: "bad cert reqs", url: "rediss://h/0?ssl_cert_reqs=maybe", wantErr: true},
		{name: "missing ca file", url: "rediss://h/0?ssl_ca_certs=/nonexistent/ca.pem", wantErr: true},
		{name: "unknown scheme", url: "memcached://h", wantErr: true},
		{name: "bad db", url: "redis://h/x", wantErr: true},
		{name: "unknown option", url: "redis://h/0?frobnicate=1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := (&Config{URL: tt.url}).newClient()
			if (err != nil) != tt.wantErr {
				t.Fatalf("newClient(%q) err = %v, wantErr %v", tt.url, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			defer c.Close()
			o := c.Options()
			if o.Addr != tt.wantAddr || o.DB != tt.wantDB {
				t.Errorf("addr %q db %d, want %q db %d", o.Addr, o.DB, tt.wantAddr, tt.wantDB)
			}
			if (o.TLSConfig != nil) != tt.wantTLS {
				t.Errorf("TLS = %v, want %v", o.TLSConfig != nil, tt.wantTLS)
			}
			if tt.wantTLS && o.TLSConfig.InsecureSkipVerify != tt.insecure {
				t.Errorf("InsecureSkipVerify = %v, want %v", o.TLSConfig.InsecureSkipVerify, tt.insecure)
			}
			if tt.wantTLS && o.TLSConfig.ServerName != "h" {
				t.Errorf("ServerName = %q, want h", o.TLSConfig.ServerName)
			}
		})
	}
}

func TestFailoverOptions(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		wantAddrs []string
		wantPass  string
		wantDB    int
		wantErr   bool
	}{
		{name: "celery list", cfg: Config{URL: "sentinel://:pw@s1:26379/2;sentinel://s2;sentinel://s3:26380/2", MasterName: "mymaster"},
			wantAddrs: []string{"s1:26379", "s2:26379", "s3:26380"}, wantPass: "pw", wantDB: 2},
		{name: "master in query", cfg: Config{URL: "sentinel://s1:26379?master_name=m"}, wantAddrs: []string{"s1:26379"}},
		{name: "no master", cfg: Config{URL: "sentinel://s1:26379"}, wantErr: true},
		{name: "mixed schemes", cfg: Config{URL: "sentinel://s1;redis://s2", MasterName: "m"}, wantErr: true},
		{name: "bad db", cfg: Config{URL: "sentinel://s1/x", MasterName: "m"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.cfg.failoverOptions(tt.cfg.URL)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if d := cmp.Diff(tt.wantAddrs, o.SentinelAddrs); d != "" {
				t.Errorf("sentinel addrs (-want +got):\n%s", d)
			}
			if o.Password != tt.wantPass || o.DB != tt.wantDB || o.MasterName == "" {
				t.Errorf("password %q db %d master %q", o.Password, o.DB, o.MasterName)
			}
		})
	}
	b, err := New(Config{URL: "sentinel://127.0.0.1:1", MasterName: "m"})
	if err != nil {
		t.Fatalf("New with a sentinel URL: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
