package jsondoc

import (
	"encoding/json"
	"errors"
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
