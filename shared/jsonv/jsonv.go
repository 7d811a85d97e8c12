// Package jsonv reads the generic JSON value model that protocol.ParseJSON
// produces (map[string]any, []any, string, float64, bool, nil) the way the
// signed commercial documents need it read: whole numbers only where money
// or counts are meant, lengths in UTF-16 code units (what every other
// implementation of these documents measures), "blank" as JavaScript's
// trim() sees it, and unknown members named deterministically.
//
// A document a runtime enforces is refused when it carries a member the
// runtime does not know: an ignored member is a term nobody enforces.
package jsonv

import (
	"math"
	"slices"
	"strings"
	"unicode"
)

// MaxSafeInteger is the largest integer every JSON implementation reads
// exactly (2^53 - 1). Money and counts above it are refused, never rounded.
const MaxSafeInteger = 1<<53 - 1

// Object returns v as an object.
func Object(v any) (map[string]any, bool) {
	m, ok := v.(map[string]any)
	return m, ok
}

// Array returns v as an array.
func Array(v any) ([]any, bool) {
	a, ok := v.([]any)
	return a, ok
}

// NonNegInt accepts a number that is a whole, non-negative, exactly
// representable integer. 2.0 is whole; 2.5, -1 and 2^53 are not accepted.
func NonNegInt(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f < 0 || f != math.Trunc(f) || f > MaxSafeInteger {
		return 0, false
	}
	return int64(f), true
}

// PosInt is NonNegInt without zero.
func PosInt(v any) (int64, bool) {
	n, ok := NonNegInt(v)
	return n, ok && n > 0
}

// UTF16Len is the length of s in UTF-16 code units, the unit the
// documents' character bounds are stated in.
func UTF16Len(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r > 0xFFFF {
			n++ // a surrogate pair
		}
	}
	return n
}

// Blank reports whether s is empty or only whitespace, as JavaScript's
// String.prototype.trim sees it (Unicode white space, line terminators and
// the byte-order mark).
func Blank(s string) bool {
	return strings.TrimFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == '\uFEFF' }) == ""
}

// Text accepts a string that is not blank and at most max UTF-16 code units
// long (max 0: no bound).
func Text(v any, max int) (string, bool) {
	s, ok := v.(string)
	if !ok || Blank(s) || (max > 0 && UTF16Len(s) > max) {
		return "", false
	}
	return s, true
}

// Unknown returns the first member of m, in sorted order so messages are
// deterministic, that is not one of known.
func Unknown(m map[string]any, known ...string) (string, bool) {
	keys := make([]string, 0, len(m))
	for k := range m {
		if !slices.Contains(known, k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "", false
	}
	slices.Sort(keys)
	return keys[0], true
}

// Strings returns v as a list of strings, or false when it is not an array
// or holds anything but strings.
func Strings(v any) ([]string, bool) {
	a, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(a))
	for _, x := range a {
		s, ok := x.(string)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}
