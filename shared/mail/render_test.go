package mail

import (
	netmail "net/mail"
	"strings"
	"testing"
	"time"
)

// Whatever passes check, render then ParseMessage gives back: the subject
// exactly, the text with its line endings normalised, and no header line
// longer than RFC 5322's 998 characters.
func FuzzRenderParse(f *testing.F) {
	f.Add("Your code", "Code: 123456\n")
	f.Add("Ваш код — ✓", "é\r\n.\r\nFrom x\n  trailing  \n=?utf-8?q?x?=")
	f.Add(strings.Repeat("long subject word ", 40), strings.Repeat("x", 200))
	f.Add("", "")
	from, err := parseAddress("sender", "Mesh <mesh@example.com>")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, subject, text string) {
		c, err := check(Message{To: "a@example.com", Subject: subject, Text: text, Kind: "login-code"})
		if err != nil {
			return
		}
		for _, enc := range []bodyEncoding{quotedPrintable, plain8bit} {
			checkRendered(t, from, c, enc, subject, text)
		}
	})
}

func checkRendered(t *testing.T, from *netmail.Address, c checked, enc bodyEncoding, subject, text string) {
	t.Helper()
	{
		raw, err := render(from, c, time.Unix(1700000000, 0), "<id@example.com>", enc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\r\n") {
			if len(line) > 998 {
				t.Fatalf("line of %d characters", len(line))
			}
		}
		got, err := ParseMessage(raw)
		if err != nil {
			t.Fatalf("ParseMessage: %v\n%s", err, raw)
		}
		if want := collapseSpaces(subject); got.Subject != want {
			t.Errorf("subject = %q, want %q", got.Subject, want)
		}
		if want := normalizeNewlines(text); got.Text != want {
			t.Errorf("text = %q, want %q", got.Text, want)
		}
		if got.To != "a@example.com" || got.Kind != "login-code" {
			t.Errorf("to, kind = %q, %q", got.To, got.Kind)
		}
	}
}

func TestFoldKeepsShortLinesAndWords(t *testing.T) {
	v := strings.Repeat("word ", 40) + strings.Repeat("x", 100)
	got := fold("Subject", v)
	for _, line := range strings.Split(got, "\r\n") {
		if len(line) > 78 && !strings.Contains(line, strings.Repeat("x", 100)) {
			t.Errorf("line of %d: %q", len(line), line)
		}
	}
	unfolded := strings.ReplaceAll(got, "\r\n", "")
	if unfolded != "Subject: "+v {
		t.Errorf("unfolded = %q", unfolded)
	}
}
