// Package mail sends the mesh's few emails: login codes, agent keys and
// similar one-shot notices to a person.
//
// A service depends on the narrow [Sender] interface and is handed one of:
//
//   - [SMTP], the production sender, which speaks to a configured relay;
//   - [Outbox], the one-machine sender, which writes each message to a file
//     under the data directory and logs where it went;
//   - in tests, [SMTP] pointed at the in-process server of package
//     mail/mailtest.
//
// Every sender renders the same RFC 5322 message (see [Message]): plain text,
// UTF-8, with the subject RFC 2047-encoded when it is not ASCII. [SMTP]
// sends the text quoted-printable (7-bit safe for any relay); [Outbox]
// writes it as it is (8bit), so that a person opening the file can copy a
// key or a link from one line. Header injection is impossible by construction: a recipient, subject
// or kind that holds CR, LF or any other control character is refused with
// [ErrInvalidMessage] before anything is written or sent.
//
// Secrets (one-time codes, agent keys) belong in Message.Text only. Senders
// never log the text; the subject and recipient may be logged.
package mail

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	netmail "net/mail"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Message is one email to one person.
type Message struct {
	// To is the recipient: a bare address ("alice@example.com") or a name
	// and address ("Alice <alice@example.com>"). Exactly one address.
	To string
	// Subject is a single line of text. Runs of spaces (U+0020) are collapsed and
	// leading and trailing ones dropped (header folding would not keep
	// them). It may be logged: never put a secret in it.
	Subject string
	// Text is the plain-text body. It may hold secrets (codes, keys) and
	// is never logged. Line endings are normalised to "\n".
	Text string
	// Kind names what the message is for, e.g. "login-code" or
	// "agent-key": lower-case letters, digits and '-', at most 64
	// characters, or empty. It travels in the X-Mesh-Kind header and in
	// outbox file names.
	Kind string
}

// Sender delivers a message, or says why it could not.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// ErrInvalidMessage is wrapped by every error about a message that can never
// be sent as it is (a bad address, a control character in a header, ...).
// Retrying such a message is pointless.
var ErrInvalidMessage = errors.New("mail: invalid message")

// Limits on what a message may hold. They are far above what the mesh sends
// and keep every header line under RFC 5322's 998 characters.
const (
	maxSubjectBytes = 900
	maxTextBytes    = 1 << 20
)

// Header names beyond RFC 5322's.
const kindHeader = "X-Mesh-Kind"

var kindPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidMessage, fmt.Sprintf(format, args...))
}

// hasControl reports whether s holds a C0 control character (CR and LF among
// them) or DEL: none of these may reach a header.
func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// parseAddress checks one address for use in a header and returns it parsed.
func parseAddress(field, s string) (*netmail.Address, error) {
	if hasControl(s) {
		return nil, invalid("%s holds a control character (CR, LF, ...)", field)
	}
	if !utf8.ValidString(s) {
		return nil, invalid("%s is not valid UTF-8", field)
	}
	a, err := netmail.ParseAddress(s)
	if err != nil {
		return nil, invalid("%s %q is not one email address: %v", field, s, err)
	}
	if hasControl(a.Address) || hasControl(a.Name) {
		return nil, invalid("%s holds a control character", field)
	}
	return a, nil
}

// checked is a message that passed validation, with its recipient parsed.
type checked struct {
	Message
	to *netmail.Address
}

func check(m Message) (checked, error) {
	to, err := parseAddress("recipient", m.To)
	if err != nil {
		return checked{}, err
	}
	switch {
	case hasControl(m.Subject):
		return checked{}, invalid("subject holds a control character (CR, LF, ...)")
	case !utf8.ValidString(m.Subject):
		return checked{}, invalid("subject is not valid UTF-8")
	case len(m.Subject) > maxSubjectBytes:
		return checked{}, invalid("subject is longer than %d bytes", maxSubjectBytes)
	case m.Kind != "" && !kindPattern.MatchString(m.Kind):
		return checked{}, invalid("kind %q is not lower-case letters, digits and '-'", m.Kind)
	case !utf8.ValidString(m.Text):
		return checked{}, invalid("text is not valid UTF-8")
	case strings.ContainsRune(m.Text, 0):
		return checked{}, invalid("text holds a NUL character")
	case len(m.Text) > maxTextBytes:
		return checked{}, invalid("text is longer than %d bytes", maxTextBytes)
	}
	m.Subject = collapseSpaces(m.Subject)
	return checked{Message: m, to: to}, nil
}

// newMessageID returns a Message-ID value (with its angle brackets) whose
// right-hand side is the sender's domain.
func newMessageID(from *netmail.Address) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mail: message id: %w", err)
	}
	domain := "localhost"
	if at := strings.LastIndexByte(from.Address, '@'); at >= 0 && at+1 < len(from.Address) {
		domain = from.Address[at+1:]
	}
	return "<" + hex.EncodeToString(b[:]) + "@" + domain + ">", nil
}

// bodyEncoding is how render writes the text.
type bodyEncoding int

const (
	// quotedPrintable is 7-bit safe for any relay: what SMTP sends. Its
	// soft line breaks ("=" at the end of a line) split long lines, which
	// a mail program joins again but a person reading the raw file does not.
	quotedPrintable bodyEncoding = iota
	// plain8bit is the text as it is, UTF-8 with CRLF line endings, so a
	// key or a link in a file a person opens is on one line, as written:
	// what the outbox writes. A text with a line longer than RFC 5322's
	// 998 bytes falls back to quoted-printable.
	plain8bit
)

// maxLine is RFC 5322's limit on a line, without its CRLF.
const maxLine = 998

// render writes m as an RFC 5322 message with CRLF line endings: headers
// folded under 78 characters where they have spaces to fold at, the subject
// RFC 2047-encoded when needed, and the text in enc.
func render(from *netmail.Address, m checked, date time.Time, messageID string, enc bodyEncoding) ([]byte, error) {
	text := normalizeNewlines(m.Text)
	if enc == plain8bit && slices.ContainsFunc(strings.Split(text, "\n"), func(l string) bool { return len(l) > maxLine }) {
		enc = quotedPrintable
	}
	var buf bytes.Buffer
	header := func(name, value string) {
		buf.WriteString(fold(name, value))
		buf.WriteString("\r\n")
	}
	header("Date", date.Format(time.RFC1123Z))
	header("From", from.String())
	header("To", m.to.String())
	header("Subject", encodeSubject(m.Subject))
	header("Message-ID", messageID)
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	if enc == plain8bit {
		header("Content-Transfer-Encoding", "8bit")
	} else {
		header("Content-Transfer-Encoding", "quoted-printable")
	}
	header("Auto-Submitted", "auto-generated")
	if m.Kind != "" {
		header(kindHeader, m.Kind)
	}
	buf.WriteString("\r\n")

	if enc == plain8bit {
		buf.WriteString(strings.ReplaceAll(text, "\n", "\r\n"))
	} else {
		qp := quotedprintable.NewWriter(&buf)
		if _, err := io.WriteString(qp, text); err != nil {
			return nil, fmt.Errorf("mail: encode body: %w", err)
		}
		if err := qp.Close(); err != nil {
			return nil, fmt.Errorf("mail: encode body: %w", err)
		}
	}
	// The body always ends with a line break, so that the SMTP end-of-data
	// marker adds nothing to it; parseMessage removes exactly this one.
	buf.WriteString("\r\n")
	return buf.Bytes(), nil
}

// fold renders "Name: value", breaking the line before a space wherever the
// line would pass 78 characters (also right after the colon, so that a
// 75-character encoded word fits). Encoded words never hold a space, so they
// are never split.
func fold(name, value string) string {
	var b strings.Builder
	b.WriteString(name)
	b.WriteString(":")
	lineLen := b.Len()
	for _, word := range strings.Split(value, " ") {
		if word != "" && lineLen+1+len(word) > 78 && lineLen > 0 {
			b.WriteString("\r\n")
			lineLen = 0
		}
		b.WriteString(" ")
		b.WriteString(word)
		lineLen += 1 + len(word)
	}
	return b.String()
}

// encodeSubject returns s as a header value: as it is when it is printable
// ASCII, otherwise as RFC 2047 "B" encoded words of at most 75 characters,
// split at rune boundaries. Text that merely looks like an encoded word
// ("=?") is encoded too, so that a reader cannot mistake it for one.
func encodeSubject(s string) string {
	plain := !strings.Contains(s, "=?")
	for i := 0; plain && i < len(s); i++ {
		plain = s[i] >= ' ' && s[i] <= '~'
	}
	if plain {
		return s
	}
	const maxChunk = 45 // base64 of 45 bytes is 60 characters; plus "=?utf-8?b?" and "?=" is 72
	var words []string
	for len(s) > 0 {
		n := 0
		for n < len(s) {
			_, size := utf8.DecodeRuneInString(s[n:])
			if n+size > maxChunk {
				break
			}
			n += size
		}
		words = append(words, "=?utf-8?b?"+base64.StdEncoding.EncodeToString([]byte(s[:n]))+"?=")
		s = s[n:]
	}
	return strings.Join(words, " ")
}

// collapseSpaces drops leading and trailing spaces and collapses runs of
// them: folding and unfolding a header would not keep them anyway.
func collapseSpaces(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' }), " ")
}

func normalizeNewlines(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "\n")
}

// ParseMessage reads back a message this package rendered (an outbox file, or
// mail received by mail/mailtest): To is the bare address, Subject is decoded
// from RFC 2047, Text is the decoded body with "\n" line endings, and Kind
// comes from the X-Mesh-Kind header. It also reads plain 7bit, 8bit and
// base64 bodies in UTF-8 or US-ASCII, so that mail from other senders can be
// inspected in tests.
func ParseMessage(raw []byte) (Message, error) {
	msg, err := netmail.ReadMessage(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		return Message{}, fmt.Errorf("mail: parse message: %w", err)
	}
	var out Message
	if to := msg.Header.Get("To"); to != "" {
		a, err := netmail.ParseAddress(to)
		if err != nil {
			return Message{}, fmt.Errorf("mail: parse message: To: %w", err)
		}
		out.To = a.Address
	}
	dec := mime.WordDecoder{}
	if out.Subject, err = dec.DecodeHeader(msg.Header.Get("Subject")); err != nil {
		return Message{}, fmt.Errorf("mail: parse message: Subject: %w", err)
	}
	out.Kind = msg.Header.Get(kindHeader)

	if ct := msg.Header.Get("Content-Type"); ct != "" {
		mediaType, params, err := mime.ParseMediaType(ct)
		if err != nil {
			return Message{}, fmt.Errorf("mail: parse message: Content-Type: %w", err)
		}
		if mediaType != "text/plain" {
			return Message{}, fmt.Errorf("mail: parse message: content type %q is not text/plain", mediaType)
		}
		if cs := strings.ToLower(params["charset"]); cs != "" && cs != "utf-8" && cs != "us-ascii" {
			return Message{}, fmt.Errorf("mail: parse message: charset %q is not UTF-8", cs)
		}
	}
	var body io.Reader = msg.Body
	switch cte := strings.ToLower(strings.TrimSpace(msg.Header.Get("Content-Transfer-Encoding"))); cte {
	case "quoted-printable":
		body = quotedprintable.NewReader(body)
	case "base64":
		body = base64.NewDecoder(base64.StdEncoding, body) // ignores line breaks
	case "", "7bit", "8bit":
	default:
		return Message{}, fmt.Errorf("mail: parse message: transfer encoding %q is not supported", cte)
	}
	text, err := io.ReadAll(body)
	if err != nil {
		return Message{}, fmt.Errorf("mail: parse message: body: %w", err)
	}
	if !utf8.Valid(text) {
		return Message{}, fmt.Errorf("mail: parse message: body is not UTF-8")
	}
	out.Text = strings.TrimSuffix(normalizeNewlines(string(text)), "\n")
	return out, nil
}
