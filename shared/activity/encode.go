package activity

import "unicode/utf8"

// appendJSON appends r as the JSON object encoding/json would write for it
// (the same members, in the same order, omitting the same empty ones), by
// hand: a timeline record is encoded for every answered call, and
// reflection was a tenth of the worker's cost. TestRecordEncodingIsJSON
// holds it to encoding/json.
func (r *record) appendJSON(b []byte) []byte {
	b = r.Item.appendJSON(b, r.Answer != nil)
	if r.Answer != nil {
		b = append(b, `,"response":`...)
		b = r.Answer.appendJSON(b, false)
		b = append(b, '}')
	}
	return b
}

// appendJSON appends it as encoding/json would, leaving the object open
// when open is set (for the record's response member to follow).
func (it *Item) appendJSON(b []byte, open bool) []byte {
	b = append(b, `{"ts":`...)
	b = appendString(b, it.TS)
	b = append(b, `,"observed_at":`...)
	b = appendString(b, it.ObservedAt)
	b = append(b, `,"kind":`...)
	b = appendString(b, it.Kind)
	b = append(b, `,"type":`...)
	b = appendString(b, it.Type)
	b = append(b, `,"from":`...)
	b = appendString(b, it.From)
	b = append(b, `,"to":`...)
	b = appendString(b, it.To)
	b = append(b, `,"id":`...)
	b = appendString(b, it.ID)
	for _, f := range [...]struct{ name, v string }{
		{`,"in_reply_to":`, it.InReplyTo}, {`,"task_id":`, it.TaskID}, {`,"trace_id":`, it.TraceID},
		{`,"span_id":`, it.SpanID}, {`,"status":`, it.Status}, {`,"error":`, it.Error},
	} {
		if f.v != "" {
			b = append(b, f.name...)
			b = appendString(b, f.v)
		}
	}
	if !open {
		b = append(b, '}')
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string with encoding/json's escaping:
// control characters, quote and backslash; <, > and & as \u00XX; invalid
// UTF-8 as \ufffd; U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
