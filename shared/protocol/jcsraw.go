package protocol

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// rawCanon canonicalises JSON text in one walk, without building the
// generic value tree: it checks the text exactly as ParseJSON does (same
// refusals, same messages, same offsets) and writes, as it goes, the bytes
// Canonical would write for the value ParseJSON would return. An object's
// members are written in arrival order while their names are kept on a
// stack; when an object closes out of order, its members are reordered in
// place. Every envelope a node receives is checked this way (DESIGN §10):
// building maps only to sort and re-serialise them was most of the cost of
// a verification outside Ed25519.
type rawCanon struct {
	data []byte
	pos  int
	out  []byte
	// recs are the members of the objects being walked, innermost last;
	// names holds their unescaped names. An object pops its members when
	// it closes, except the top-level one when keepTop is set.
	recs    []memberRec
	names   []byte
	tmp     []byte
	keepTop bool
}

// memberRec is one member of an object: its unescaped name in names, and
// where `"name":value` and the value start and end in out.
type memberRec struct {
	nameStart, nameEnd int
	start, val, end    int
}

var canonPool = sync.Pool{New: func() any {
	return &rawCanon{recs: make([]memberRec, 0, 32), names: make([]byte, 0, 256)}
}}

func getCanon(data, out []byte) *rawCanon {
	c := canonPool.Get().(*rawCanon)
	c.data, c.pos, c.out, c.keepTop = data, 0, out, false
	return c
}

// putCanon returns c to the pool; huge scratch is dropped rather than
// pinned.
func putCanon(c *rawCanon) {
	c.data, c.out = nil, nil
	c.recs, c.names = c.recs[:0], c.names[:0]
	if cap(c.recs) > 4096 || cap(c.names) > 64<<10 || cap(c.tmp) > 64<<10 {
		return
	}
	c.tmp = c.tmp[:0]
	canonPool.Put(c)
}

// AppendCanonicalJSON appends the canonical form of the JSON text data to
// dst. It accepts and refuses exactly what ParseJSON does, and its output is
// what Canonical writes for the value ParseJSON returns, in one pass and
// without building that value.
func AppendCanonicalJSON(dst, data []byte) ([]byte, error) {
	c := getCanon(data, dst)
	defer putCanon(c)
	if err := c.document(); err != nil {
		return dst, err
	}
	return c.out, nil
}

// document walks one whole JSON text.
func (c *rawCanon) document() error {
	c.skipSpace()
	if err := c.value(0); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(c.data) {
		return c.errorf("unexpected data after the JSON value")
	}
	return nil
}

func (c *rawCanon) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at offset %d: %s", ErrJSON, c.pos, fmt.Sprintf(format, args...))
}

func (c *rawCanon) skipSpace() {
	for c.pos < len(c.data) {
		switch c.data[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *rawCanon) value(depth int) error {
	if c.pos >= len(c.data) {
		return c.errorf("unexpected end of input")
	}
	switch ch := c.data[c.pos]; {
	case ch == '{':
		if depth >= MaxJSONDepth {
			return c.errorf("nesting deeper than %d", MaxJSONDepth)
		}
		return c.object(depth + 1)
	case ch == '[':
		if depth >= MaxJSONDepth {
			return c.errorf("nesting deeper than %d", MaxJSONDepth)
		}
		return c.array(depth + 1)
	case ch == '"':
		var err error
		c.out, err = c.str(c.out, true)
		return err
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return c.number()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	default:
		return c.errorf("unexpected character %q", ch)
	}
}

func (c *rawCanon) literal(lit string) error {
	if len(c.data)-c.pos < len(lit) || string(c.data[c.pos:c.pos+len(lit)]) != lit {
		return c.errorf("invalid literal")
	}
	c.pos += len(lit)
	c.out = append(c.out, lit...)
	return nil
}

// smallObject is how many members an object may have before duplicate
// names are looked up in a set rather than by comparing with each earlier
// name.
const smallObject = 16

func (c *rawCanon) object(depth int) error {
	top := depth == 1 && c.keepTop
	c.pos++ // '{'
	c.out = append(c.out, '{')
	open := len(c.out)
	base, nbase := len(c.recs), len(c.names)
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}
	sorted := true
	var set map[string]struct{} // names of a large object
	for {
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != '"' {
			return c.errorf("expected a member name")
		}
		ns := len(c.names)
		var err error
		if c.names, err = c.str(c.names, false); err != nil {
			return err
		}
		name := c.names[ns:]
		n := len(c.recs) - base
		// While names arrive in strictly increasing order, as canonical
		// senders write them, none can repeat an earlier one; past the
		// first out of order, each is looked for among all earlier ones.
		if n > 0 && sorted {
			last := c.recs[len(c.recs)-1]
			sorted = compareUTF16(c.names[last.nameStart:last.nameEnd], name) < 0
		}
		switch {
		case sorted:
		case n < smallObject:
			for _, r := range c.recs[base:] {
				if bytes.Equal(c.names[r.nameStart:r.nameEnd], name) {
					return c.errorf("duplicate member name %q", name)
				}
			}
		default:
			if set == nil {
				set = make(map[string]struct{}, 2*n)
				for _, r := range c.recs[base:] {
					set[string(c.names[r.nameStart:r.nameEnd])] = struct{}{}
				}
			}
			if _, dup := set[string(name)]; dup {
				return c.errorf("duplicate member name %q", name)
			}
			set[string(name)] = struct{}{}
		}
		c.skipSpace()
		if c.pos >= len(c.data) || c.data[c.pos] != ':' {
			return c.errorf("expected ':' after a member name")
		}
		c.pos++
		c.skipSpace()
		if n > 0 {
			c.out = append(c.out, ',')
		}
		start := len(c.out)
		c.out = appendStringBytes(c.out, name)
		c.out = append(c.out, ':')
		val := len(c.out)
		if err := c.value(depth); err != nil {
			return err
		}
		c.recs = append(c.recs, memberRec{nameStart: ns, nameEnd: len(c.names), start: start, val: val, end: len(c.out)})
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.errorf("unterminated object")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			if !sorted {
				c.reorder(open, base)
			}
			c.out = append(c.out, '}')
			if !top {
				c.recs, c.names = c.recs[:base], c.names[:nbase]
			}
			return nil
		default:
			return c.errorf("expected ',' or '}' in an object")
		}
	}
}

// reorder rewrites the members of the object whose records start at base,
// written from out[open:], in canonical name order, and updates their
// records to the new positions.
func (c *rawCanon) reorder(open, base int) {
	recs := c.recs[base:]
	names := c.names
	slices.SortFunc(recs, func(a, b memberRec) int {
		return compareUTF16(names[a.nameStart:a.nameEnd], names[b.nameStart:b.nameEnd])
	})
	c.tmp = append(c.tmp[:0], c.out[open:]...)
	c.out = c.out[:open]
	for i := range recs {
		r := &recs[i]
		if i > 0 {
			c.out = append(c.out, ',')
		}
		start := len(c.out)
		c.out = append(c.out, c.tmp[r.start-open:r.end-open]...)
		r.val += start - r.start
		r.start, r.end = start, len(c.out)
	}
}

func (c *rawCanon) array(depth int) error {
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.data) && c.data[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for first := true; ; first = false {
		c.skipSpace()
		if !first {
			c.out = append(c.out, ',')
		}
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.data) {
			return c.errorf("unterminated array")
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return c.errorf("expected ',' or ']' in an array")
		}
	}
}

// str reads the string at the opening quote, checked as parser.str checks
// it, and appends it to dst: in its canonical form, quotes and JCS escapes
// included, when canonical is set, else unescaped.
func (c *rawCanon) str(dst []byte, canonical bool) ([]byte, error) {
	c.pos++ // opening quote
	if canonical {
		dst = append(dst, '"')
	}
	start := c.pos
	// Fast path: printable ASCII without escapes is its own canonical form.
	for c.pos < len(c.data) && plainASCII[c.data[c.pos]] {
		c.pos++
	}
	if c.pos < len(c.data) && c.data[c.pos] == '"' {
		dst = append(dst, c.data[start:c.pos]...)
		c.pos++
		if canonical {
			dst = append(dst, '"')
		}
		return dst, nil
	}
	dst = append(dst, c.data[start:c.pos]...)
	for {
		if c.pos >= len(c.data) {
			return dst, c.errorf("unterminated string")
		}
		ch := c.data[c.pos]
		switch {
		case ch == '"':
			c.pos++
			if canonical {
				dst = append(dst, '"')
			}
			return dst, nil
		case ch < 0x20:
			return dst, c.errorf("control character in a string must be escaped")
		case ch == '\\':
			c.pos++
			if c.pos >= len(c.data) {
				return dst, c.errorf("unterminated escape")
			}
			e := c.data[c.pos]
			c.pos++
			var r rune
			switch e {
			case '"', '\\', '/':
				r = rune(e)
			case 'b':
				r = '\b'
			case 'f':
				r = '\f'
			case 'n':
				r = '\n'
			case 'r':
				r = '\r'
			case 't':
				r = '\t'
			case 'u':
				var err error
				if r, err = c.hex4(); err != nil {
					return dst, err
				}
				if utf16.IsSurrogate(r) {
					if r >= 0xDC00 || c.pos+6 > len(c.data) || c.data[c.pos] != '\\' || c.data[c.pos+1] != 'u' {
						return dst, c.errorf("lone surrogate in a string")
					}
					c.pos += 2
					r2, err := c.hex4()
					if err != nil {
						return dst, err
					}
					if r2 < 0xDC00 || r2 > 0xDFFF {
						return dst, c.errorf("lone surrogate in a string")
					}
					r = utf16.DecodeRune(r, r2)
				}
			default:
				return dst, c.errorf("invalid escape \\%c", e)
			}
			if canonical && (r < 0x20 || r == '"' || r == '\\') {
				dst = appendEscaped(dst, byte(r))
			} else {
				dst = utf8.AppendRune(dst, r)
			}
		case ch < 0x80:
			dst = append(dst, ch)
			c.pos++
		default:
			r, size := utf8.DecodeRune(c.data[c.pos:])
			if r == utf8.RuneError && size <= 1 {
				return dst, c.errorf("invalid UTF-8 in a string")
			}
			dst = append(dst, c.data[c.pos:c.pos+size]...)
			c.pos += size
		}
	}
}

func (c *rawCanon) hex4() (rune, error) {
	if c.pos+4 > len(c.data) {
		return 0, c.errorf("short \\u escape")
	}
	var r rune
	for _, ch := range c.data[c.pos : c.pos+4] {
		r <<= 4
		switch {
		case ch >= '0' && ch <= '9':
			r |= rune(ch - '0')
		case ch >= 'a' && ch <= 'f':
			r |= rune(ch - 'a' + 10)
		case ch >= 'A' && ch <= 'F':
			r |= rune(ch - 'A' + 10)
		default:
			return 0, c.errorf("invalid \\u escape")
		}
	}
	c.pos += 4
	return r, nil
}

// number reads a number as parser.number does and writes its canonical
// form: an integer of up to 15 digits is exact in a double and is its own
// shortest form (but -0 is 0); anything else goes through the double.
func (c *rawCanon) number() error {
	start := c.pos
	if c.data[c.pos] == '-' {
		c.pos++
	}
	intStart := c.pos
	n := c.digits()
	if n == 0 {
		return c.errorf("invalid number")
	}
	if n > 1 && c.data[intStart] == '0' {
		return c.errorf("leading zero in a number")
	}
	simple := true
	if c.pos < len(c.data) && c.data[c.pos] == '.' {
		simple = false
		c.pos++
		if c.digits() == 0 {
			return c.errorf("invalid fraction")
		}
	}
	if c.pos < len(c.data) && (c.data[c.pos] == 'e' || c.data[c.pos] == 'E') {
		simple = false
		c.pos++
		if c.pos < len(c.data) && (c.data[c.pos] == '+' || c.data[c.pos] == '-') {
			c.pos++
		}
		if c.digits() == 0 {
			return c.errorf("invalid exponent")
		}
	}
	text := c.data[start:c.pos]
	if simple && n <= 15 {
		if n == 1 && c.data[intStart] == '0' {
			c.out = append(c.out, '0') // -0 is 0
		} else {
			c.out = append(c.out, text...)
		}
		return nil
	}
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil || math.IsInf(f, 0) {
		return c.errorf("number %s is outside the range of a double", text)
	}
	c.out, _ = appendFloat(c.out, f) // finite: cannot fail
	return nil
}

func (c *rawCanon) digits() int {
	n := 0
	for c.pos < len(c.data) && c.data[c.pos] >= '0' && c.data[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}

// appendEscaped writes the JCS escape of '"', '\\' or a control character.
func appendEscaped(dst []byte, ch byte) []byte {
	switch ch {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\t':
		return append(dst, '\\', 't')
	case '\n':
		return append(dst, '\\', 'n')
	case '\f':
		return append(dst, '\\', 'f')
	case '\r':
		return append(dst, '\\', 'r')
	}
	return append(dst, '\\', 'u', '0', '0', hexDigits[ch>>4], hexDigits[ch&0xF])
}

// appendStringBytes is appendString for a name already known to be valid
// UTF-8 (the walker checked it).
func appendStringBytes(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i, ch := range s {
		if ch >= 0x20 && ch != '"' && ch != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		dst = appendEscaped(dst, ch)
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// canonObject iterates over the members of a canonical JSON object (the
// walker's output: no white space, valid), giving each name as written
// between its quotes and its value as written. A name that needed an escape
// keeps it, so such a name never equals a plain one: compare only with
// names made of characters JCS writes raw.
type canonObject struct {
	b []byte
	i int
}

func (it *canonObject) next() (name, value []byte, ok bool) {
	if it.i == 0 {
		if len(it.b) < 2 || it.b[0] != '{' {
			return nil, nil, false
		}
		it.i = 1
	}
	if it.i >= len(it.b) || it.b[it.i] == '}' {
		return nil, nil, false
	}
	if it.b[it.i] == ',' {
		it.i++
	}
	end := canonSkip(it.b, it.i)
	name = it.b[it.i+1 : end-1]
	start := end + 1 // past ':'
	it.i = canonSkip(it.b, start)
	return name, it.b[start:it.i], true
}

// canonSkip returns where the canonical JSON value starting at b[i] ends.
func canonSkip(b []byte, i int) int {
	switch b[i] {
	case '"':
		for i++; i < len(b); i++ {
			switch b[i] {
			case '"':
				return i + 1
			case '\\':
				i++
			}
		}
		return len(b)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			case '"':
				i = canonSkip(b, i)
				continue
			}
			i++
		}
		return len(b)
	default: // a number or a literal
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
			i++
		}
		return i
	}
}

// canonMember is the value of the member name of the canonical object b,
// as written; ok is false when b is not an object or has no such member.
// name must be made of characters JCS writes raw.
func canonMember(b []byte, name string) (value []byte, ok bool) {
	it := canonObject{b: b}
	for {
		n, v, more := it.next()
		if !more {
			return nil, false
		}
		if string(n) == name {
			return v, true
		}
	}
}

// appendUnquoted appends the text of the canonical JSON string s (quotes
// included) to dst: JCS escapes only '"', '\\' and control characters.
func appendUnquoted(dst, s []byte) []byte {
	s = s[1 : len(s)-1]
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		switch e := s[i+1]; e {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u': // \u00hh
			dst = append(dst, unhex(s[i+4])<<4|unhex(s[i+5]))
			s = s[i+6:]
			continue
		default: // '"' or '\\'
			dst = append(dst, e)
		}
		s = s[i+2:]
	}
}

func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}
