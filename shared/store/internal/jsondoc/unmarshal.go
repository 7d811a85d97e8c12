package jsondoc

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
)

// Unmarshal is json.Unmarshal(raw, dst) for a stored document. A document
// of the shape this package's encoder writes for a plain struct (an object
// of ASCII strings without escapes, integers, booleans and arrays of such
// strings, each member named exactly as a field) is decoded into a pointer
// to that struct by one pass over its bytes; anything else, or anything
// the pass is unsure of, is left to encoding/json from the start. The
// result is json.Unmarshal's either way: FuzzUnmarshalIsJSONUnmarshal
// holds the two to the same values and errors.
//
// A control-plane transaction reads dozens of small documents (a node
// credential reads three for each agent of its roster), and
// encoding/json's validating scan and reflection walk cost more than the
// rest of the read.
func Unmarshal(raw []byte, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		if p := planOf(v.Elem().Type()); p != nil && p.decode(raw, v.Elem()) {
			return nil
		}
	}
	return json.Unmarshal(raw, dst)
}

// plan is how a plain struct's members are found and stored.
type plan struct {
	fields map[string]planField
	// folded holds the fields' names in lower case: encoding/json stores
	// a member whose name matches a field's only under case folding in
	// that field, which decode leaves to it.
	folded map[string]bool
}

type planField struct {
	index int
	kind  reflect.Kind // String, Bool, Int* or Slice (of string)
}

var plans sync.Map // reflect.Type → *plan (nil: not plain)

func planOf(t reflect.Type) *plan {
	if p, ok := plans.Load(t); ok {
		return p.(*plan)
	}
	p := makePlan(t)
	plans.Store(t, p)
	return p
}

// makePlan returns the plan of t, or nil when t is not a struct whose
// every field encoding/json decodes is a string, boolean, integer or slice
// of strings without its own decoding, under a name given by its tag (or
// its Go name) that no other field shares.
func makePlan(t reflect.Type) *plan {
	if ownDecoding(t) {
		return nil
	}
	p := &plan{fields: map[string]planField{}, folded: map[string]bool{}}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return nil
		}
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts := tag, ""
		for j := 0; j < len(tag); j++ {
			if tag[j] == ',' {
				name, opts = tag[:j], tag[j:]
				break
			}
		}
		if opts != "" && opts != ",omitempty" {
			return nil // ",string" and the like decode differently
		}
		if !plainName(name) {
			if name != "" {
				return nil
			}
			name = f.Name
		}
		if ownDecoding(f.Type) {
			return nil
		}
		k := f.Type.Kind()
		switch k {
		case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		case reflect.Slice:
			if f.Type.Elem().Kind() != reflect.String || ownDecoding(f.Type.Elem()) {
				return nil
			}
		default:
			return nil
		}
		if _, dup := p.fields[name]; dup {
			return nil
		}
		p.fields[name] = planField{index: i, kind: k}
		p.folded[strings.ToLower(name)] = true
	}
	return p
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
)

// ownDecoding reports whether t (or *t) decodes itself.
func ownDecoding(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(unmarshalerType) || t.Implements(textUnmarshalerType) ||
		pt.Implements(unmarshalerType) || pt.Implements(textUnmarshalerType)
}

// plainName reports whether a tag's name is made of letters, digits and
// underscores only: encoding/json takes such a name as it is.
func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// decode fills dst from raw and reports true, or reports false, leaving
// whatever it stored to be stored again by json.Unmarshal, when raw is not
// in the shape it knows. Each member it stores, json.Unmarshal would
// store the same way: decode only ever sets the fields named by members
// that are present, as json.Unmarshal does.
func (p *plan) decode(raw []byte, dst reflect.Value) bool {
	d := scan{b: raw}
	if !d.byte('{') {
		return false
	}
	if d.byte('}') {
		return d.end()
	}
	for {
		name, ok := d.span()
		if !ok || !d.byte(':') {
			return false
		}
		f, ok := p.fields[string(name)] // no allocation for the look-up
		if !ok {
			// A member no field has: encoding/json skips it, unless its
			// name matches one under case folding.
			if p.foldsToField(name) || !d.skip() {
				return false
			}
		} else if !d.member(f, dst.Field(f.index)) {
			return false
		}
		if d.byte('}') {
			return d.end()
		}
		if !d.byte(',') {
			return false
		}
	}
}

// foldsToField reports whether name (printable ASCII) matches a field's
// name under ASCII case folding.
func (p *plan) foldsToField(name []byte) bool {
	var buf [64]byte
	if len(name) > len(buf) {
		return true // no field's name is this long; let encoding/json decide
	}
	for i, c := range name {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return p.folded[string(buf[:len(name)])]
}

// member reads one member's value into the field fv of kind f.kind.
func (d *scan) member(f planField, fv reflect.Value) bool {
	switch f.kind {
	case reflect.String:
		s, ok := d.str()
		if !ok {
			return false
		}
		fv.SetString(s)
	case reflect.Bool:
		b, ok := d.boolean()
		if !ok {
			return false
		}
		fv.SetBool(b)
	case reflect.Slice:
		l, ok := d.strings()
		if !ok {
			return false
		}
		if p, ok := fv.Addr().Interface().(*[]string); ok {
			*p = l // a pointer in an interface: no allocation
		} else {
			fv.Set(reflect.ValueOf(l).Convert(fv.Type()))
		}
	default: // an integer
		n, ok := d.integer(fv.Type().Bits())
		if !ok {
			return false
		}
		fv.SetInt(n)
	}
	return true
}

// skip passes over a member value no field takes: a plain string, a
// number, true, false or null; anything else is left to encoding/json.
func (d *scan) skip() bool {
	if d.pos >= len(d.b) {
		return false
	}
	switch c := d.b[d.pos]; {
	case c == '"':
		_, ok := d.span()
		return ok
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(d.b)-d.pos >= len(lit) && string(d.b[d.pos:d.pos+len(lit)]) == lit {
			d.pos += len(lit)
			return true
		}
	}
	return false
}

// number passes over a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *scan) number() bool {
	d.byte('-')
	start := d.pos
	d.digits()
	if n := d.pos - start; n == 0 || n > 1 && d.b[start] == '0' {
		return false
	}
	if d.byte('.') && d.digits() == 0 {
		return false
	}
	if d.byte('e') || d.byte('E') {
		if !d.byte('+') {
			d.byte('-')
		}
		if d.digits() == 0 {
			return false
		}
	}
	return true
}

func (d *scan) digits() int {
	start := d.pos
	for d.pos < len(d.b) && d.b[d.pos] >= '0' && d.b[d.pos] <= '9' {
		d.pos++
	}
	return d.pos - start
}

// scan reads the plain shape: no white space, strings of printable ASCII
// without escapes.
type scan struct {
	b   []byte
	pos int
}

func (d *scan) byte(c byte) bool {
	if d.pos < len(d.b) && d.b[d.pos] == c {
		d.pos++
		return true
	}
	return false
}

func (d *scan) end() bool { return d.pos == len(d.b) }

// str reads a string of printable ASCII without escapes (what
// encoding/json decodes to the same bytes). The string is a copy: raw may
// be the database's memory, valid only during the transaction.
func (d *scan) str() (string, bool) {
	b, ok := d.span()
	return string(b), ok
}

// span reads a string as str does and returns its bytes in raw.
func (d *scan) span() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.pos
	for d.pos < len(d.b) {
		c := d.b[d.pos]
		switch {
		case c == '"':
			d.pos++
			return d.b[start : d.pos-1], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
		d.pos++
	}
	return nil, false
}

func (d *scan) boolean() (bool, bool) {
	rest := d.b[d.pos:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		d.pos += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		d.pos += 5
		return false, true
	}
	return false, false
}

// integer reads -?(0|[1-9][0-9]*) of at most 18 digits that fits bits,
// not followed by a fraction or an exponent.
func (d *scan) integer(bits int) (int64, bool) {
	start := d.pos
	d.byte('-')
	digits := d.pos
	for d.pos < len(d.b) && d.b[d.pos] >= '0' && d.b[d.pos] <= '9' {
		d.pos++
	}
	n := d.pos - digits
	if n == 0 || n > 1 && d.b[digits] == '0' {
		return 0, false
	}
	if d.pos < len(d.b) {
		if c := d.b[d.pos]; c == '.' || c == 'e' || c == 'E' {
			return 0, false
		}
	}
	if n > 18 {
		return 0, false // may not fit; encoding/json says how
	}
	var v int64
	for _, c := range d.b[digits:d.pos] {
		v = v*10 + int64(c-'0')
	}
	if d.b[start] == '-' {
		v = -v
	}
	if v < -1<<(bits-1) || v > 1<<(bits-1)-1 {
		return 0, false
	}
	return v, true
}

// strings reads an array of plain strings (not null).
func (d *scan) strings() ([]string, bool) {
	if !d.byte('[') {
		return nil, false
	}
	out := []string{}
	if d.byte(']') {
		return out, true
	}
	for {
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		if d.byte(']') {
			return out, true
		}
		if !d.byte(',') {
			return nil, false
		}
	}
}
