// Package jsondoc holds what both store backends share: name validation,
// the JSON normalisation of documents and query values, and the ordering
// of JSON values (Firestore's ordering restricted to what JSON can hold).
package jsondoc

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/store"
)

// MaxNameBytes is the longest collection name or document id accepted.
const MaxNameBytes = store.MaxIDBytes

// CheckName validates a collection name with the rules of a document id
// (store.CheckID). A bad name is a bug in the caller's code, so it is a
// plain ErrInvalid, not the caller's-input *store.IDError.
func CheckName(kind, name string) error {
	err := store.CheckID(name)
	if err == nil {
		return nil
	}
	var ie *store.IDError // only on a refusal: errors.As makes it escape
	if errors.As(err, &ie) {
		return fmt.Errorf("%w: %s %s", store.ErrInvalid, kind, ie.Reason)
	}
	return nil
}

// CheckPath validates a collection name and a document id; a bad id is a
// *store.IDError.
func CheckPath(coll, id string) error {
	if err := CheckName("collection name", coll); err != nil {
		return err
	}
	return store.CheckID(id)
}

// CheckField validates a top-level field name used in a query or update.
func CheckField(field string) error {
	if field == "" {
		return fmt.Errorf("%w: empty field name", store.ErrInvalid)
	}
	if !utf8.ValidString(field) {
		return fmt.Errorf("%w: field name is not valid UTF-8", store.ErrInvalid)
	}
	return nil
}

// Decode parses JSON keeping numbers as json.Number.
func Decode(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

// Encode marshals doc, which must encode to a JSON object Firestore can
// store, and returns the JSON and the decoded object (numbers as
// json.Number).
func Encode(doc any) ([]byte, map[string]any, error) {
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: document does not encode to JSON: %v", store.ErrInvalid, err)
	}
	v, err := Decode(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: document JSON: %v", store.ErrInvalid, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, fmt.Errorf("%w: document must encode to a JSON object, not %s", store.ErrInvalid, kindOf(v))
	}
	if err := checkValue(m, false); err != nil {
		return nil, nil, err
	}
	return raw, m, nil
}

// EncodeRaw is Encode's JSON alone, for a backend that stores the JSON
// itself. When the document's type alone guarantees what Encode checks of
// the decoded object (plainType), it is not decoded again to check it.
func EncodeRaw(doc any) ([]byte, error) {
	if v := reflect.ValueOf(doc); v.Kind() == reflect.Struct && plainType(v.Type()) ||
		v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct && plainType(v.Elem().Type()) {
		raw, err := json.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("%w: document does not encode to JSON: %v", store.ErrInvalid, err)
		}
		return raw, nil
	}
	raw, _, err := Encode(doc)
	return raw, err
}

// plain caches plainType by type (a type's answer never changes).
var plain sync.Map // reflect.Type → bool

// plainType reports whether every value of the struct type t encodes to
// what Encode accepts once decoded: a JSON object (a struct always is, a
// non-nil pointer to one too) whose members all have non-empty names
// (encoding/json names a field by its tag or else its Go name, never "")
// and hold no array directly inside an array. It answers true only for
// structs of plain fields: booleans, numbers and strings, pointers to
// them, slices and arrays of them, and nested structs of the same; no
// maps, interfaces, embedded fields or types with their own encoding.
// Anything else is decoded and checked as Encode does.
func plainType(t reflect.Type) bool {
	if v, ok := plain.Load(t); ok {
		return v.(bool)
	}
	ok := plainStruct(t, 0)
	plain.Store(t, ok)
	return ok
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// ownEncoding reports whether t (or *t) encodes itself.
func ownEncoding(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(marshalerType) || t.Implements(textMarshalerType) ||
		pt.Implements(marshalerType) || pt.Implements(textMarshalerType)
}

func plainStruct(t reflect.Type, depth int) bool {
	if t.Kind() != reflect.Struct || ownEncoding(t) || depth > 8 {
		return false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return false
		}
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue // encoding/json leaves it out
		}
		if !plainField(f.Type, depth) {
			return false
		}
	}
	return true
}

func plainField(t reflect.Type, depth int) bool {
	if ownEncoding(t) {
		return false
	}
	switch t.Kind() {
	case reflect.Struct:
		return plainStruct(t, depth+1)
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return plainScalar(t.Elem())
	}
	return plainScalar(t)
}

// plainScalar: a boolean, number or string without its own encoding.
func plainScalar(t reflect.Type) bool {
	if ownEncoding(t) {
		return false
	}
	switch t.Kind() {
	case reflect.Bool, reflect.String, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// EncodeValue normalises one field value (for Update) through JSON.
func EncodeValue(v any) (any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: value does not encode to JSON: %v", store.ErrInvalid, err)
	}
	d, err := Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: value JSON: %v", store.ErrInvalid, err)
	}
	if err := checkValue(d, false); err != nil {
		return nil, err
	}
	return d, nil
}

// checkValue rejects what Firestore cannot store: empty map keys and arrays
// directly inside arrays.
func checkValue(v any, inArray bool) error {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "" {
				return fmt.Errorf("%w: empty field name in document", store.ErrInvalid)
			}
			if err := checkValue(e, false); err != nil {
				return err
			}
		}
	case []any:
		if inArray {
			return fmt.Errorf("%w: arrays directly inside arrays cannot be stored (Firestore)", store.ErrInvalid)
		}
		for _, e := range v {
			if err := checkValue(e, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// Scalar normalises a query value: it must encode to a JSON string, bool
// or number; the result is a string, bool or json.Number.
func Scalar(v any) (any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: query value does not encode to JSON: %v", store.ErrInvalid, err)
	}
	d, err := Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: query value JSON: %v", store.ErrInvalid, err)
	}
	switch d.(type) {
	case string, bool, json.Number:
		return d, nil
	}
	return nil, fmt.Errorf("%w: query value must be a string, bool or number, not %s", store.ErrInvalid, kindOf(d))
}

// ToNative converts a decoded JSON value into the Go types the Firestore
// client stores: json.Number becomes int64 when integral and in range,
// float64 otherwise; maps and slices are converted recursively.
func ToNative(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = ToNative(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = ToNative(e)
		}
		return out
	}
	return v
}

// Rank orders JSON types as Firestore orders value types: null, bool,
// number, string, array, object.
func Rank(v any) int {
	switch v.(type) {
	case nil:
		return 0
	case bool:
		return 1
	case json.Number, float64, int64, int:
		return 2
	case string:
		return 3
	case []any:
		return 4
	default:
		return 5
	}
}

// Compare orders two decoded JSON values: by Rank, then false < true,
// numbers numerically, strings by UTF-8 bytes, arrays element-wise then by
// length. Objects of the same rank compare equal (callers break ties by
// document id).
func Compare(a, b any) int {
	ra, rb := Rank(a), Rank(b)
	if ra != rb {
		return cmpInt(ra, rb)
	}
	switch a := a.(type) {
	case bool:
		bb := b.(bool)
		switch {
		case a == bb:
			return 0
		case !a:
			return -1
		default:
			return 1
		}
	case string:
		return strings.Compare(a, b.(string))
	case []any:
		bb := b.([]any)
		for i := 0; i < len(a) && i < len(bb); i++ {
			if c := Compare(a[i], bb[i]); c != 0 {
				return c
			}
		}
		return cmpInt(len(a), len(bb))
	}
	if ra == 2 {
		return compareNumbers(a, b)
	}
	return 0
}

// Equal reports whether a stored value equals a query value (numbers
// numerically: 1 equals 1.0, as in Firestore).
func Equal(a, b any) bool {
	return Rank(a) == Rank(b) && Compare(a, b) == 0
}

func compareNumbers(a, b any) int {
	x, y := numString(a), numString(b)
	if i, err := json.Number(x).Int64(); err == nil {
		if j, err := json.Number(y).Int64(); err == nil {
			return cmpInt64(i, j)
		}
	}
	fx, _, errx := big.ParseFloat(x, 10, 256, big.ToNearestEven)
	fy, _, erry := big.ParseFloat(y, 10, 256, big.ToNearestEven)
	if errx != nil || erry != nil {
		return strings.Compare(x, y)
	}
	return fx.Cmp(fy)
}

func numString(v any) string {
	switch v := v.(type) {
	case json.Number:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a bool"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// CheckDst checks that dst is a non-nil pointer.
func CheckDst(dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return fmt.Errorf("%w: destination must be a non-nil pointer, not %T", store.ErrInvalid, dst)
	}
	return nil
}

// CheckSliceDst checks that dst is a non-nil pointer to a slice.
func CheckSliceDst(dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Slice {
		return fmt.Errorf("%w: query destination must be a non-nil pointer to a slice, not %T", store.ErrInvalid, dst)
	}
	return nil
}

// JoinArray builds the JSON array of the given JSON documents, to be
// decoded into a query's destination slice in one step.
func JoinArray(docs [][]byte) []byte {
	n := 2
	for _, d := range docs {
		n += len(d) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, d := range docs {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, d...)
	}
	return append(out, ']')
}

// CheckQuery validates a query and returns its Where values normalised by
// Scalar.
func CheckQuery(q store.Query) ([]any, error) {
	vals := make([]any, len(q.Where))
	for i, w := range q.Where {
		if err := CheckField(w.Field); err != nil {
			return nil, err
		}
		v, err := Scalar(w.Value)
		if err != nil {
			return nil, fmt.Errorf("where %q: %w", w.Field, err)
		}
		vals[i] = v
	}
	if q.OrderBy != "" {
		if err := CheckField(q.OrderBy); err != nil {
			return nil, err
		}
	}
	if q.Limit < 0 {
		return nil, fmt.Errorf("%w: negative limit %d", store.ErrInvalid, q.Limit)
	}
	return vals, nil
}
