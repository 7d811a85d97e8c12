package protocol

import (
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Canonical JSON is RFC 8785 (JCS) with the protocol's two rules
// (upstream-notes §1.3): an unset member is omitted, never written as null;
// a present null is a value and is signed. It is hand-written because the
// two JCS libraries on the module proxy cost 12 µs and 200+ allocations for a
// 600-byte envelope (DESIGN §10), and because encoding/json gets four things
// wrong for JCS: it escapes U+2028/U+2029 and <>&, writes -0, and sorts map
// keys by UTF-8 bytes instead of UTF-16 code units.

// MaxSafeInteger is the largest integer every implementation of the protocol
// represents exactly (2^53 - 1). Go integers beyond it are refused rather
// than silently rounded: such values must travel as strings.
const MaxSafeInteger = 1<<53 - 1

// ErrNotCanonicalizable is wrapped by every canonicalisation failure.
var ErrNotCanonicalizable = errors.New("value cannot be canonicalised")

// Canonical returns the canonical JSON of v. v may be a decoded JSON value
// (map[string]any, []any, string, float64, bool, nil) or any Go value that
// encoding/json could marshal: structs honour `json` tags with omitempty and
// omitzero, json.Marshaler and encoding.TextMarshaler are respected.
func Canonical(v any) ([]byte, error) {
	return AppendCanonical(nil, v)
}

// AppendCanonical appends the canonical JSON of v to dst.
func AppendCanonical(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, v, 0)
}

func canonErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotCanonicalizable, fmt.Sprintf(format, args...))
}

func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	if depth > MaxJSONDepth {
		return dst, canonErr("nesting deeper than %d", MaxJSONDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case string:
		return appendString(dst, x)
	case float64:
		return appendFloat(dst, x)
	case int:
		return appendInt(dst, int64(x))
	case int64:
		return appendInt(dst, x)
	case map[string]any:
		return appendMap(dst, x, depth)
	case []any:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendValue(dst, e, depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case json.RawMessage:
		return appendRaw(dst, x, depth)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return dst, canonErr("number %q: %v", string(x), err)
		}
		return appendFloat(dst, f)
	}
	return appendReflect(dst, reflect.ValueOf(v), depth)
}

// appendRaw canonicalises JSON text that is already encoded.
func appendRaw(dst []byte, raw []byte, depth int) ([]byte, error) {
	if len(raw) == 0 {
		return dst, canonErr("empty JSON text")
	}
	v, err := ParseJSON(raw)
	if err != nil {
		return dst, canonErr("%v", err)
	}
	return appendValue(dst, v, depth)
}

func appendMap(dst []byte, m map[string]any, depth int) ([]byte, error) {
	// The names of a small object are sorted on the stack.
	var small [16]string
	keys := small[:0]
	if len(m) > len(small) {
		keys = make([]string, 0, len(m))
	}
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, CompareUTF16)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = appendString(dst, k); err != nil {
			return dst, err
		}
		dst = append(dst, ':')
		if dst, err = appendValue(dst, m[k], depth+1); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, CompareUTF16)
	return keys
}

// CompareUTF16 orders strings by their UTF-16 code units, the order JCS
// requires for member names (JavaScript's default sort). UTF-8 byte order is
// code point order, which differs only when an astral character (encoded in
// UTF-16 as a surrogate, 0xD800-0xDFFF) meets a BMP character at or above
// U+E000: UTF-16 puts the astral one first.
func CompareUTF16(a, b string) int { return compareUTF16(a, b) }

// compareUTF16 is CompareUTF16 on strings or byte slices (the canonicalizer
// sorts names where they lie in its buffer). Only a first difference
// outside ASCII converts, and for byte slices copies, what follows it.
func compareUTF16[T ~string | ~[]byte](a, b T) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	if a[i] < 0x80 && b[i] < 0x80 {
		return int(a[i]) - int(b[i])
	}
	// Back up to the start of the rune containing the first difference.
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, rb := string(a[i:]), string(b[i:])
	r1, _ := utf8.DecodeRuneInString(ra)
	r2, _ := utf8.DecodeRuneInString(rb)
	return compareRunesUTF16(r1, r2, strings.Compare(ra, rb))
}

// compareRunesUTF16 orders two different runes by their UTF-16 code units.
// Two astral runes with the same high surrogate differ in the low one,
// whose order is theirs. tie decides between runes that decode alike
// (invalid UTF-8, which canonical JSON never holds).
func compareRunesUTF16(ra, rb rune, tie int) int {
	if d := int(utf16Unit(ra)) - int(utf16Unit(rb)); d != 0 {
		return d
	}
	if ra != rb {
		return int(ra - rb)
	}
	return tie
}

// utf16Unit is the first UTF-16 code unit of r.
func utf16Unit(r rune) rune {
	if r >= 0x10000 {
		return 0xD800 + ((r - 0x10000) >> 10)
	}
	return r
}

const hexDigits = "0123456789abcdef"

// plainASCII marks the bytes JCS writes as they are and that never need a
// UTF-8 check: printable ASCII but '"' and '\\'.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString writes s with JCS escaping: only '"', '\\' and U+0000-U+001F
// are escaped (short forms where JSON has them, lowercase \u00hh otherwise);
// everything else, including '/', DEL, U+2028 and U+2029, is raw UTF-8.
func appendString(dst []byte, s string) ([]byte, error) {
	// Fast path: printable ASCII without '"' or '\\' is its own form.
	i := 0
	for i < len(s) && plainASCII[s[i]] {
		i++
	}
	if i == len(s) {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"'), nil
	}
	if !utf8.ValidString(s[i:]) {
		return dst, canonErr("string is not valid UTF-8")
	}
	dst = append(dst, '"')
	start := 0
	for ; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), nil
}

// appendFloat writes f as ECMAScript's Number.prototype.toString does:
// shortest round-trip digits, plain decimal in [1e-6, 1e21), exponent form
// with an explicit sign outside it, and -0 as 0. NaN and infinities have no
// JSON form and are refused.
func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, canonErr("%v has no JSON representation", f)
	}
	if f == 0 {
		return append(dst, '0'), nil
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// Go writes e-07 / e+07; ECMAScript writes e-7 / e+7.
		n := len(dst)
		if n >= 4 && dst[n-4] == 'e' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, nil
}

func appendInt(dst []byte, i int64) ([]byte, error) {
	if i > MaxSafeInteger || i < -MaxSafeInteger {
		return dst, canonErr("integer %d is beyond 2^53-1; carry it as a string", i)
	}
	return strconv.AppendInt(dst, i, 10), nil
}

func appendUint(dst []byte, u uint64) ([]byte, error) {
	if u > MaxSafeInteger {
		return dst, canonErr("integer %d is beyond 2^53-1; carry it as a string", u)
	}
	return strconv.AppendUint(dst, u, 10), nil
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func appendReflect(dst []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > MaxJSONDepth {
		return dst, canonErr("nesting deeper than %d", MaxJSONDepth)
	}
	if !v.IsValid() {
		return append(dst, "null"...), nil
	}
	t := v.Type()
	if t.Implements(jsonMarshalerType) && !(v.Kind() == reflect.Pointer && v.IsNil()) {
		raw, err := v.Interface().(json.Marshaler).MarshalJSON()
		if err != nil {
			return dst, canonErr("%s: %v", t, err)
		}
		return appendRaw(dst, raw, depth)
	}
	if v.Kind() != reflect.Pointer && v.CanAddr() && reflect.PointerTo(t).Implements(jsonMarshalerType) {
		return appendReflect(dst, v.Addr(), depth)
	}
	if t.Implements(textMarshalerType) && !(v.Kind() == reflect.Pointer && v.IsNil()) {
		txt, err := v.Interface().(encoding.TextMarshaler).MarshalText()
		if err != nil {
			return dst, canonErr("%s: %v", t, err)
		}
		return appendString(dst, string(txt))
	}
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return appendInt(dst, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return appendUint(dst, v.Uint())
	case reflect.Float32, reflect.Float64:
		return appendFloat(dst, v.Float())
	case reflect.String:
		return appendString(dst, v.String())
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		return appendValue(dst, v.Elem().Interface(), depth)
	case reflect.Slice:
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		if t.Elem().Kind() == reflect.Uint8 && !t.Elem().Implements(jsonMarshalerType) {
			// []byte is base64 text, as in encoding/json.
			return appendString(dst, base64.StdEncoding.EncodeToString(v.Bytes()))
		}
		fallthrough
	case reflect.Array:
		dst = append(dst, '[')
		for i := range v.Len() {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendReflect(dst, v.Index(i), depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case reflect.Map:
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		if t.Key().Kind() != reflect.String {
			return dst, canonErr("map key type %s is not a string", t.Key())
		}
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			keys = append(keys, k.String())
		}
		slices.SortFunc(keys, CompareUTF16)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendString(dst, k); err != nil {
				return dst, err
			}
			dst = append(dst, ':')
			if dst, err = appendReflect(dst, v.MapIndex(reflect.ValueOf(k).Convert(t.Key())), depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	case reflect.Struct:
		return appendStruct(dst, v, depth)
	default:
		return dst, canonErr("%s has no JSON representation", t)
	}
}

// structField is one member of a struct's canonical plan.
type structField struct {
	name      string
	index     []int
	omitEmpty bool
	omitZero  bool
}

var structPlans sync.Map // reflect.Type -> []structField

// structPlan lists t's JSON members in canonical order, computed once per
// type. It follows encoding/json's rules for names, "-", omitempty and
// omitzero, and promotes the fields of untagged embedded structs.
func structPlan(t reflect.Type) []structField {
	if p, ok := structPlans.Load(t); ok {
		return p.([]structField)
	}
	var fields []structField
	seen := map[string]bool{}
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			idx := append(append([]int(nil), index...), i)
			if f.Anonymous && name == "" {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					walk(ft, idx)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if seen[name] {
				continue // the shallower field wins, as in encoding/json
			}
			seen[name] = true
			fields = append(fields, structField{
				name:      name,
				index:     idx,
				omitEmpty: strings.Contains(","+opts+",", ",omitempty,"),
				omitZero:  strings.Contains(","+opts+",", ",omitzero,"),
			})
		}
	}
	walk(t, nil)
	slices.SortFunc(fields, func(a, b structField) int { return CompareUTF16(a.name, b.name) })
	structPlans.Store(t, fields)
	return fields
}

func appendStruct(dst []byte, v reflect.Value, depth int) ([]byte, error) {
	dst = append(dst, '{')
	first := true
	for _, f := range structPlan(v.Type()) {
		fv, ok := fieldByIndex(v, f.index)
		if !ok {
			continue // nil embedded pointer: its fields are absent
		}
		if f.omitEmpty && isEmpty(fv) {
			continue
		}
		if f.omitZero && isZero(fv) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		var err error
		if dst, err = appendString(dst, f.name); err != nil {
			return dst, err
		}
		dst = append(dst, ':')
		if dst, err = appendReflect(dst, fv, depth+1); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}

func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Interface, reflect.Pointer:
		return v.IsNil()
	}
	return false
}

func isZero(v reflect.Value) bool {
	if z, ok := v.Interface().(interface{ IsZero() bool }); ok {
		if v.Kind() == reflect.Pointer && v.IsNil() {
			return true
		}
		return z.IsZero()
	}
	return v.IsZero()
}

// Compact returns the compact JSON of v (no insignificant whitespace) for
// measurement. It is the canonical form: key order cannot change a length,
// and JCS escaping is the minimal RFC 8259 escaping.
func Compact(v any) ([]byte, error) { return Canonical(v) }
