package jsonv

import "testing"

func TestNumbers(t *testing.T) {
	for _, c := range []struct {
		v        any
		nonNeg   bool
		pos      bool
		wantNonN int64
	}{
		{0.0, true, false, 0}, {1.0, true, true, 1}, {2.0, true, true, 2}, {2.5, false, false, 0},
		{-1.0, false, false, 0}, {float64(MaxSafeInteger), true, true, MaxSafeInteger},
		{float64(MaxSafeInteger) + 1, false, false, 0}, {"1", false, false, 0}, {nil, false, false, 0}, {true, false, false, 0},
	} {
		n, ok := NonNegInt(c.v)
		if ok != c.nonNeg || (ok && n != c.wantNonN) {
			t.Errorf("NonNegInt(%v) = %d, %v", c.v, n, ok)
		}
		if _, ok := PosInt(c.v); ok != c.pos {
			t.Errorf("PosInt(%v) ok = %v", c.v, ok)
		}
	}
}

func TestText(t *testing.T) {
	for _, c := range []struct {
		s    string
		max  int
		want bool
	}{
		{"a", 1, true}, {"ab", 1, false}, {"   ", 0, false}, {"", 0, false}, {"\u00a0\ufeff\n", 0, false},
		{"😀", 1, false}, {"😀", 2, true}, {"é", 1, true}, {"x", 0, true},
	} {
		if _, ok := Text(c.s, c.max); ok != c.want {
			t.Errorf("Text(%q, %d) = %v, want %v", c.s, c.max, ok, c.want)
		}
	}
	if _, ok := Text(7.0, 0); ok {
		t.Error("a number is not text")
	}
}

func TestUnknownAndStrings(t *testing.T) {
	if k, ok := Unknown(map[string]any{"b": 1, "z": 1, "c": 1, "a": 1}, "a", "b"); !ok || k != "c" {
		t.Errorf("Unknown = %q, %v; want the first unknown in sorted order, c", k, ok)
	}
	if _, ok := Unknown(map[string]any{"a": 1}, "a"); ok {
		t.Error("no unknown member expected")
	}
	if s, ok := Strings([]any{"x", "y"}); !ok || len(s) != 2 {
		t.Errorf("Strings = %v, %v", s, ok)
	}
	if _, ok := Strings([]any{"x", 7.0}); ok {
		t.Error("a list with a number is not a list of strings")
	}
	if _, ok := Strings("x"); ok {
		t.Error("a string is not a list")
	}
}
