package jsondoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"testing"

	"agentmesh.dev/mesh/shared/store"
)

func TestCompare(t *testing.T) {
	n := func(s string) json.Number { return json.Number(s) }
	cases := []struct {
		a, b any
		want int
	}{
		{nil, false, -1},
		{false, true, -1},
		{true, n("0"), -1},
		{n("9007199254740991"), n("9007199254740992"), -1},
		{n("9223372036854775807"), n("9223372036854775806"), 1},
		{n("1"), n("1.0"), 0},
		{n("-1.5"), n("-1"), -1},
		{n("1e300"), n("9223372036854775807"), 1},
		{n("2"), "1", -1},
		{"a", "b", -1},
		{"é", "z", 1}, // UTF-8 bytes
		{"", "a", -1},
		{[]any{"a"}, []any{"a", "b"}, -1},
		{"z", []any{}, -1},
		{[]any{}, map[string]any{}, -1},
	}
	for _, c := range cases {
		if got := Compare(c.a, c.b); got != c.want {
			t.Errorf("Compare(%v, %v) = %d; want %d", c.a, c.b, got, c.want)
		}
		if got := Compare(c.b, c.a); got != -c.want {
			t.Errorf("Compare(%v, %v) = %d; want %d", c.b, c.a, got, -c.want)
		}
	}
}

func TestScalar(t *testing.T) {
	for _, v := range []any{"s", true, 1, int64(-1 << 53), uint8(3), 1.5} {
		if _, err := Scalar(v); err != nil {
			t.Errorf("Scalar(%v): %v", v, err)
		}
	}
	for _, v := range []any{nil, []int{1}, map[string]int{}, struct{}{}, func() {}} {
		if _, err := Scalar(v); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("Scalar(%#v) = %v; want ErrInvalid", v, err)
		}
	}
}

func TestToNative(t *testing.T) {
	_, m, err := Encode(map[string]any{
		"i": 1 << 53, "neg": -3, "f": 0.5, "whole": 2.0, "huge": 1e300,
		"big": uint64(1 << 63), "s": "x", "b": true, "null": nil,
		"list": []any{1, 1.5, map[string]any{"k": 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"i": int64(1 << 53), "neg": int64(-3), "f": 0.5, "whole": int64(2), "huge": 1e300,
		"big": float64(1 << 63), "s": "x", "b": true, "null": nil,
		"list": []any{int64(1), 1.5, map[string]any{"k": int64(2)}},
	}
	if got := ToNative(m); !reflect.DeepEqual(got, want) {
		t.Errorf("ToNative:\n got %#v\nwant %#v", got, want)
	}
}

type plainDoc struct {
	ID     string   `json:"id"`
	N      int64    `json:"n,omitempty"`
	F      float64  `json:"f"`
	OK     bool     `json:"ok"`
	Tags   []string `json:"tags,omitempty"`
	Bytes  []byte   `json:"bytes"`
	Ptr    *int64   `json:"ptr,omitempty"`
	Inner  inner    `json:"inner"`
	NoTag  string
	Quoted int    `json:",string"`
	Dash   string `json:"-,"`
	Hidden string `json:"-"`
	lower  string
}

type inner struct {
	A  [2]int `json:"a"`
	ID string `json:"id"`
}

type withMap struct {
	M map[string]int `json:"m"`
}

type withNested struct {
	L [][]string `json:"l"`
}

type withAny struct {
	V any `json:"v"`
}

type selfEncoded struct{ X string }

func (selfEncoded) MarshalJSON() ([]byte, error) { return []byte(`[1]`), nil }

type withSelfEncoded struct {
	S selfEncoded `json:"s"`
}

type embedding struct {
	inner
	Extra string `json:"extra"`
}

// TestEncodeRawIsEncode: EncodeRaw gives Encode's bytes, and refuses what
// Encode refuses, for documents whose type spares the check and for those
// it does not.
func TestEncodeRawIsEncode(t *testing.T) {
	n := int64(7)
	docs := []any{
		plainDoc{ID: "a", N: 1, F: 1.5, OK: true, Tags: []string{"x", "y"}, Bytes: []byte{1, 2}, Ptr: &n,
			Inner: inner{A: [2]int{1, 2}, ID: "<&>"}, NoTag: "\xff", Quoted: 3, Dash: "d", Hidden: "h", lower: "l"},
		&plainDoc{ID: "p"},
		plainDoc{},
		(*plainDoc)(nil),
		withMap{M: map[string]int{"": 1}},
		withMap{M: map[string]int{"a": 1}},
		withNested{L: [][]string{{"a"}}},
		withNested{},
		withAny{V: []any{[]any{1}}},
		withAny{V: 1},
		withSelfEncoded{},
		selfEncoded{},
		embedding{Extra: "e"},
		map[string]any{"a": 1},
		map[string]any{"": 1},
		[]string{"a"},
		"string",
		nil,
		plainDoc{F: math.NaN()},
	}
	for _, d := range docs {
		want, _, wantErr := Encode(d)
		got, err := EncodeRaw(d)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Errorf("EncodeRaw(%#v) = %s, %v; Encode %s, %v", d, got, err, want, wantErr)
		}
	}
	for _, c := range []struct {
		doc   any
		plain bool
	}{{plainDoc{}, true}, {inner{}, true}, {withMap{}, false}, {withNested{}, false}, {withAny{}, false},
		{withSelfEncoded{}, false}, {selfEncoded{}, false}, {embedding{}, false}} {
		if got := plainType(reflect.TypeOf(c.doc)); got != c.plain {
			t.Errorf("plainType(%T) = %v, want %v", c.doc, got, c.plain)
		}
	}
}

// FuzzEncodeRawIsEncode: for any field values of a plain type, EncodeRaw
// and Encode agree.
func FuzzEncodeRawIsEncode(f *testing.F) {
	f.Add("a", int64(1), 1.5, true, "t", []byte{1})
	f.Fuzz(func(t *testing.T, s string, n int64, x float64, b bool, tag string, raw []byte) {
		d := plainDoc{ID: s, N: n, F: x, OK: b, Tags: []string{tag, s}, Bytes: raw, Ptr: &n, Inner: inner{ID: tag}, NoTag: s}
		want, _, wantErr := Encode(d)
		got, err := EncodeRaw(&d)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("EncodeRaw = %s, %v; Encode %s, %v", got, err, want, wantErr)
		}
	})
}
