package protocol

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxJSONDepth bounds nesting so a hostile document cannot exhaust the stack.
const MaxJSONDepth = 64

// ErrJSON is wrapped by every parse failure.
var ErrJSON = errors.New("invalid JSON")

// ParseJSON parses one JSON text into the generic value model used across the
// protocol: map[string]any, []any, string, float64, bool and nil.
//
// It is stricter than encoding/json on purpose, because the bytes it accepts
// are about to be signed or verified:
//   - a duplicate member name is refused (two parsers that keep different
//     copies would verify one document and act on another);
//   - invalid UTF-8 and lone surrogate escapes are refused (they cannot be
//     canonicalised faithfully);
//   - numbers are IEEE doubles, as in every other implementation of the
//     protocol; a number outside the double range is refused, never turned
//     into infinity;
//   - nesting deeper than MaxJSONDepth and trailing data are refused.
func ParseJSON(data []byte) (any, error) {
	p := parser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.errorf("unexpected data after the JSON value")
	}
	return v, nil
}

type parser struct {
	data []byte
	pos  int
	buf  []byte // scratch for strings with escapes
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at offset %d: %s", ErrJSON, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (any, error) {
	if p.pos >= len(p.data) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		if depth >= MaxJSONDepth {
			return nil, p.errorf("nesting deeper than %d", MaxJSONDepth)
		}
		return p.object(depth + 1)
	case c == '[':
		if depth >= MaxJSONDepth {
			return nil, p.errorf("nesting deeper than %d", MaxJSONDepth)
		}
		return p.array(depth + 1)
	case c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	default:
		return nil, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) literal(lit string) error {
	if len(p.data)-p.pos < len(lit) || string(p.data[p.pos:p.pos+len(lit)]) != lit {
		return p.errorf("invalid literal")
	}
	p.pos += len(lit)
	return nil
}

func (p *parser) object(depth int) (any, error) {
	p.pos++ // '{'
	m := make(map[string]any, 8)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return m, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.errorf("expected a member name")
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, p.errorf("duplicate member name %q", k)
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.errorf("expected ':' after a member name")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		m[k] = v
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return m, nil
		default:
			return nil, p.errorf("expected ',' or '}' in an object")
		}
	}
}

func (p *parser) array(depth int) (any, error) {
	p.pos++ // '['
	a := make([]any, 0, 4)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return a, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return a, nil
		default:
			return nil, p.errorf("expected ',' or ']' in an array")
		}
	}
}

// str parses a string starting at the opening quote.
func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes, ASCII only.
	for p.pos < len(p.data) && plainASCII[p.data[p.pos]] {
		p.pos++
	}
	if p.pos < len(p.data) && p.data[p.pos] == '"' {
		s, ok := wellKnown(p.data[start:p.pos])
		if !ok {
			s = string(p.data[start:p.pos])
		}
		p.pos++
		return s, nil
	}
	// Slow path: escapes or non-ASCII.
	b := append(p.buf[:0], p.data[start:p.pos]...)
	for {
		if p.pos >= len(p.data) {
			return "", p.errorf("unterminated string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			p.buf = b
			return string(b), nil
		case c < 0x20:
			return "", p.errorf("control character in a string must be escaped")
		case c == '\\':
			p.pos++
			if p.pos >= len(p.data) {
				return "", p.errorf("unterminated escape")
			}
			e := p.data[p.pos]
			p.pos++
			switch e {
			case '"', '\\', '/':
				b = append(b, e)
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					// A high surrogate must be followed by an escaped low one.
					if r >= 0xDC00 || p.pos+6 > len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
						return "", p.errorf("lone surrogate in a string")
					}
					p.pos += 2
					r2, err := p.hex4()
					if err != nil {
						return "", err
					}
					if r2 < 0xDC00 || r2 > 0xDFFF {
						return "", p.errorf("lone surrogate in a string")
					}
					r = utf16.DecodeRune(r, r2)
				}
				b = utf8.AppendRune(b, r)
			default:
				return "", p.errorf("invalid escape \\%c", e)
			}
		case c < 0x80:
			b = append(b, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8 in a string")
			}
			b = append(b, p.data[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.data) {
		return 0, p.errorf("short \\u escape")
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, p.errorf("invalid \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}

// number parses a JSON number as an IEEE double.
func (p *parser) number() (any, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	intStart := p.pos
	n := digits()
	if n == 0 {
		return nil, p.errorf("invalid number")
	}
	if n > 1 && p.data[intStart] == '0' {
		return nil, p.errorf("leading zero in a number")
	}
	simple := true
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		simple = false
		p.pos++
		if digits() == 0 {
			return nil, p.errorf("invalid fraction")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		simple = false
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, p.errorf("invalid exponent")
		}
	}
	text := p.data[start:p.pos]
	// Integers of up to 15 digits are exact in a double; skip ParseFloat.
	if simple && n <= 15 {
		var v int64
		for _, c := range p.data[intStart:p.pos] {
			v = v*10 + int64(c-'0')
		}
		if text[0] == '-' {
			if v == 0 {
				return 0.0, nil // -0 is 0 in canonical JSON
			}
			v = -v
		} else if v < int64(len(smallNumbers)) {
			return smallNumbers[v], nil
		}
		return float64(v), nil
	}
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil || math.IsInf(f, 0) {
		return nil, p.errorf("number %s is outside the range of a double", text)
	}
	return f, nil
}

// smallNumbers are the small whole numbers payloads carry most (counts,
// revisions, codes), boxed once: a float64 in an interface is immutable, so
// every parse can share them instead of allocating its own.
var smallNumbers = func() (t [1024]any) {
	for i := range t {
		t[i] = float64(i)
	}
	return t
}()

// wellKnown returns the envelope's member names and most frequent values as
// constants, so parsing them allocates nothing: every envelope carries the
// same dozen names, and every verification parses one. The switch on
// string(b) does not allocate.
func wellKnown(b []byte) (string, bool) {
	switch string(b) {
	case "v":
		return "v", true
	case "id":
		return "id", true
	case "type":
		return "type", true
	case "ts":
		return "ts", true
	case "from":
		return "from", true
	case "to":
		return "to", true
	case "sig":
		return "sig", true
	case "trace":
		return "trace", true
	case "trace_id":
		return "trace_id", true
	case "span_id":
		return "span_id", true
	case "parent_span_id":
		return "parent_span_id", true
	case "payload":
		return "payload", true
	case "in_reply_to":
		return "in_reply_to", true
	case "task_id":
		return "task_id", true
	case "context_id":
		return "context_id", true
	case "budget":
		return "budget", true
	case "meta":
		return "meta", true
	case "status":
		return "status", true
	case "output":
		return "output", true
	case "input":
		return "input", true
	case "offering":
		return "offering", true
	case "text":
		return "text", true
	case "error":
		return "error", true
	case "code":
		return "code", true
	case "message":
		return "message", true
	case "request":
		return "request", true
	case "respond":
		return "respond", true
	case "emit":
		return "emit", true
	case "completed":
		return "completed", true
	case "accepted":
		return "accepted", true
	case "failed":
		return "failed", true
	case Version:
		return Version, true
	}
	return "", false
}
