package protocol

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnmarshal(t *testing.T) {
	json := []byte(`{"a": [1, 2.0]}`)
	msgp := []byte{0x81, 0xa1, 'a', 0x92, 0x01, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0}
	want := map[string]any{"a": []any{int64(1), 2.0}}
	tests := []struct {
		name string
		ct   string
		data []byte
		opts DecodeOptions
		want any
	}{
		{"json", ContentTypeJSON, json, DecodeOptions{}, want},
		{"json with parameters", "Application/JSON; charset=utf-8", json, DecodeOptions{}, want},
		{"msgpack", ContentTypeMsgpack, msgp, DecodeOptions{}, want},
		{"accept by name", ContentTypeMsgpack, msgp, DecodeOptions{Accept: []string{"msgpack"}}, want},
		{"raw data", ContentTypeData, []byte{0xff}, DecodeOptions{}, []byte{0xff}},
		{"empty type is raw data", "", []byte("x"), DecodeOptions{Accept: []string{"json"}}, []byte("x")},
		{"empty raw data", ContentTypeData, nil, DecodeOptions{}, []byte{}},
		{"text", ContentTypeText, []byte("héllo"), DecodeOptions{}, "héllo"},
		{"application/text", "application/text", []byte("x"), DecodeOptions{}, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Unmarshal(tt.ct, tt.data, tt.opts)
			if err != nil {
				t.Fatalf("Unmarshal(%q): %v", tt.ct, err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("Unmarshal(%q) mismatch (-want +got):\n%s", tt.ct, diff)
			}
		})
	}
}

func TestUnmarshalRefused(t *testing.T) {
	tests := []struct {
		name string
		ct   string
		opts DecodeOptions
	}{
		{"pickle", ContentTypePickle, DecodeOptions{}},
		{"pickle even if accepted", ContentTypePickle, DecodeOptions{Accept: []string{"pickle", ContentTypePickle}}},
		{"yaml", ContentTypeYAML, DecodeOptions{Accept: []string{"yaml"}}},
		{"not accepted", ContentTypeMsgpack, DecodeOptions{Accept: []string{"json"}}},
		{"unknown", "application/x-protobuf", DecodeOptions{Accept: []string{"application/x-protobuf"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Unmarshal(tt.ct, []byte("x"), tt.opts)
			var cte *ContentTypeError
			if !errors.As(err, &cte) || cte.ContentType != tt.ct {
				t.Fatalf("Unmarshal(%q) = %v, %v; want a *ContentTypeError naming it", tt.ct, got, err)
			}
			if !errors.Is(err, ErrUnsupportedContentType) {
				t.Errorf("error %v does not match ErrUnsupportedContentType", err)
			}
		})
	}
	_, err := Unmarshal(ContentTypePickle, nil, DecodeOptions{})
	if err == nil || !strings.Contains(err.Error(), "pickle is never decoded") {
		t.Errorf("pickle error %v, want it to say pickle is never decoded", err)
	}
	_, err = Unmarshal(ContentTypeText, []byte{0xff}, DecodeOptions{})
	if err == nil || !strings.Contains(err.Error(), "not valid UTF-8") {
		t.Errorf("Unmarshal(text, 0xff) error %v", err)
	}
	_, err = Unmarshal(ContentTypeData, make([]byte, 11), DecodeOptions{MaxBodySize: 10})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Unmarshal(data, 11 bytes, max 10) error %v, want ErrTooLarge", err)
	}
}

func TestMarshal(t *testing.T) {
	v := map[string]any{"a": []any{int64(1), 2.0}}
	tests := []struct {
		ct   string
		give any
		want string
	}{
		{ContentTypeJSON, v, `{"a": [1, 2.0]}`},
		{"", v, `{"a": [1, 2.0]}`},
		{"json", v, `{"a": [1, 2.0]}`},
		{ContentTypeMsgpack, v, "\x81\xa1a\x92\x01\xcb\x40\x00\x00\x00\x00\x00\x00\x00"},
		{ContentTypeData, []byte{0xff}, "\xff"},
		{ContentTypeText, "x", "x"},
	}
	for _, tt := range tests {
		got, err := Marshal(tt.ct, tt.give)
		if err != nil {
			t.Fatalf("Marshal(%q): %v", tt.ct, err)
		}
		if string(got) != tt.want {
			t.Errorf("Marshal(%q) = %q, want %q", tt.ct, got, tt.want)
		}
	}
	for _, ct := range []string{ContentTypePickle, ContentTypeYAML, "application/x-nope"} {
		var cte *ContentTypeError
		if _, err := Marshal(ct, v); !errors.As(err, &cte) {
			t.Errorf("Marshal(%q) error %v, want *ContentTypeError", ct, err)
		}
	}
	if _, err := Marshal(ContentTypeData, 5); err == nil {
		t.Error("Marshal(application/data, 5) succeeded")
	}
}
