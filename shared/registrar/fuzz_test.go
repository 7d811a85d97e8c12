package registrar_test

import (
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/registrar"
)

// The decoders of untrusted input: handle names and addresses, and
// pairing codes as people type them.

func FuzzHandle(f *testing.F) {
	for _, s := range [][2]string{
		{"coder", "ana@example.org"}, {" Bot.Team ", "OPS@Example.org"}, {"a/b%2F", "x@y.z__"}, {"__x", "a@b.c"},
		{"", "@"}, {"two words", "a@b"}, {"ü\u200b", "ä@ö.de"}, {"\xff", "a@@b.c"}, {strings.Repeat("n", 65), "a@b.c"},
	} {
		f.Add(s[0], s[1])
	}
	unescape := strings.NewReplacer("%2F", "/", "%25", "%", "%5F", "_")
	f.Fuzz(func(t *testing.T, name, email string) {
		n, nerr := registrar.CheckName(name)
		if nerr == nil {
			if n != strings.TrimSpace(n) || n == "" || len(n) > registrar.MaxName || !utf8.ValidString(n) || strings.ContainsRune(n, '@') ||
				strings.ContainsFunc(n, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) {
				t.Fatalf("CheckName(%q) accepted %q", name, n)
			}
			if again, err := registrar.CheckName(n); err != nil || again != n {
				t.Fatalf("CheckName is not idempotent on %q: %q %v", n, again, err)
			}
		}
		e, eerr := registrar.NormalizeEmail(email)
		if eerr == nil {
			if e != strings.ToLower(e) || strings.Count(e, "@") != 1 || len(e) > 254 || strings.HasPrefix(e, "@") ||
				strings.ContainsFunc(e, func(r rune) bool { return unicode.Is(unicode.Cf, r) }) {
				t.Fatalf("NormalizeEmail(%q) accepted %q", email, e)
			}
		}
		if nerr != nil || eerr != nil {
			return
		}
		h := registrar.HandleOf(n, e)
		id := registrar.HandleID(h)
		if len(h) > registrar.MaxHandle || strings.Contains(id, "/") || strings.HasPrefix(id, "_") {
			t.Fatalf("handle %q has id %q", h, id)
		}
		// The id is one to one with the case-folded handle.
		if back := unescape.Replace(id); back != strings.ToLower(h) {
			// The replacer works left to right, so "%255F" reads back
			// as "%5F" correctly; anything else is a collision risk.
			t.Fatalf("id %q of %q reads back as %q", id, h, back)
		}
		if registrar.HandleID(strings.ToUpper(h)) != registrar.HandleID(strings.ToLower(h)) && strings.ToLower(strings.ToUpper(h)) == strings.ToLower(h) {
			t.Fatalf("case changes the id of %q", h)
		}
	})
}

var pairingShape = regexp.MustCompile(`^[ABCDEFGHJKLMNPQRSTUVWXYZ23456789]{3}-[ABCDEFGHJKLMNPQRSTUVWXYZ23456789]{3}$`)

func FuzzNormalizePairingCode(f *testing.F) {
	for _, s := range []string{"ABC-234", "abc234", " kdx-4m7 ", "ABC--234", "AB-C234", "ABCD-EF", "O0I-1LL", "", "ÄBC-234", "ABC-2345"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := registrar.NormalizePairingCode(s)
		if err != nil {
			return
		}
		if !pairingShape.MatchString(c) {
			t.Fatalf("%q normalised to %q", s, c)
		}
		for _, v := range []string{c, strings.ToLower(c), strings.ReplaceAll(c, "-", "")} {
			if again, err := registrar.NormalizePairingCode(v); err != nil || again != c {
				t.Fatalf("%q (from %q) normalised to %q %v", v, c, again, err)
			}
		}
	})
}

func TestNewPairingCode(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		c := registrar.NewPairingCode()
		if !pairingShape.MatchString(c) {
			t.Fatalf("code %q", c)
		}
		seen[c] = true
	}
	if len(seen) < 190 {
		t.Fatalf("only %d distinct codes in 200", len(seen))
	}
}
