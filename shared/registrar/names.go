package registrar

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/secret"
)

// CheckName validates the name part of a handle (upstream-notes §12.1): any
// non-empty string of at most 64 bytes after trimming, valid UTF-8, with no
// white space, no '@', no control character and (beyond upstream) no
// invisible format character (Unicode Cf: bidirectional controls,
// zero-width characters; account.CheckVisible, the rule of every visible
// name); dots are allowed. It returns the trimmed name,
// its case kept for display.
func CheckName(name string) (string, error) {
	n := strings.TrimSpace(name)
	switch {
	case n == "":
		return "", errs.New(errs.InvalidRequest, "name is required: the agent's part of the handle, e.g. \"coder\" for coder.<your email>")
	case !utf8.ValidString(n):
		return "", errs.New(errs.InvalidRequest, "name must be UTF-8 text")
	case len(n) > MaxName:
		return "", errs.Newf(errs.InvalidRequest, "name is %d bytes; at most %d are allowed", len(n), MaxName)
	case strings.ContainsRune(n, '@'):
		return "", errs.New(errs.InvalidRequest, "name must not contain '@': the handle is <name>.<email> and the email is added for you")
	}
	if strings.IndexFunc(n, unicode.IsSpace) >= 0 {
		return "", errs.New(errs.InvalidRequest, "name must not contain white space")
	}
	if err := account.CheckVisible("name", n); err != nil {
		return "", err
	}
	return n, nil
}

// NormalizeEmail trims, lower-cases and checks an address: the account
// service's rule (one '@', a non-empty local part, a dotted domain, at most
// 254 bytes), and it must be a bare address as a mail header reads it —
// net/mail parses it, with no display name, to the very same string. Else
// the code could be mailed to another address than the one it proves
// ("ana<eve@evil.org>" is mailed to eve@evil.org), or the mail could not be
// sent at all after the limits were counted ("a,b@example.org").
func NormalizeEmail(email string) (string, error) { return account.NormalizeEmail(email) }

// HandleOf is the handle `<name>.<email>` for a checked name and a
// normalised address.
func HandleOf(name, email string) string { return name + "." + email }

// HandleID is the store key of a handle: uniqueness and lookup are on the
// case-folded whole string; nobody parses a handle.
func HandleID(handle string) string { return account.HandleID(handle) }

// MaxHandle bounds a handle given to resolve: a name of 64 bytes, a dot and
// an address of 254.
const MaxHandle = MaxName + 1 + 254

// CheckOperatorName validates an operator display name: at most 80
// characters, and the rule of every visible name (account.CheckVisible: no
// control or format characters). It returns it trimmed ("" when none was
// given).
func CheckOperatorName(n string) (string, error) {
	n = strings.TrimSpace(n)
	if !utf8.ValidString(n) {
		return "", errs.New(errs.InvalidRequest, "operator_name must be UTF-8 text")
	}
	if c := utf8.RuneCountInString(n); c > MaxOperatorName {
		return "", errs.Newf(errs.InvalidRequest, "operator_name is %d characters; at most %d are allowed", c, MaxOperatorName)
	}
	if err := account.CheckVisible("operator_name", n); err != nil {
		return "", err
	}
	return n, nil
}

// PairingAlphabet is what pairing codes are made of: no 0/O or 1/I, so a
// code read aloud or copied by hand survives.
const PairingAlphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"

// NewPairingCode makes a fresh code of the form XXX-XXX.
func NewPairingCode() string {
	c := secret.Alphabet(PairingAlphabet, 6)
	return c[:3] + "-" + c[3:]
}

// NormalizePairingCode reads a pairing code as a person may type it: any
// case, with or without the dash, with spaces around. It returns the
// canonical XXX-XXX form, or a refusal saying what a code looks like.
func NormalizePairingCode(s string) (string, error) {
	bad := errs.New(errs.InvalidRequest, "a pairing code looks like ABC-234: six letters and digits from the registrar")
	s = strings.TrimSpace(s)
	if len(s) > 16 {
		return "", bad
	}
	var b strings.Builder
	dash := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '-' && b.Len() == 3 && !dash:
			dash = true
			continue
		case c >= 'a' && c <= 'z':
			c -= 'a' - 'A'
		}
		if strings.IndexByte(PairingAlphabet, c) < 0 {
			return "", bad
		}
		b.WriteByte(c)
	}
	if b.Len() != 6 {
		return "", bad
	}
	c := b.String()
	return c[:3] + "-" + c[3:], nil
}
