package account_test

import (
	"fmt"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
)

// formatChars are the invisible and bidirectional format characters
// (Unicode Cf) every name and address refuses.
var formatChars = []rune{
	0x200B, 0x200C, 0x200D, 0x200E, 0x200F, // zero-width, LRM, RLM
	0x202A, 0x202B, 0x202C, 0x202D, 0x202E, // bidi embeddings and overrides
	0x2066, 0x2067, 0x2068, 0x2069, // bidi isolates
	0xFEFF, 0x00AD, 0x2060, 0x061C, // BOM, soft hyphen, word joiner, ALM
}

// One rule refuses format characters in every name and address a person
// reads: emails (sign-in, the registrar, the connect approval mail), agent
// key labels, API-token and app names (CheckLabel), operator names.
func TestFormatCharactersRefusedInEveryName(t *testing.T) {
	checks := map[string]func(s string) error{
		"email": func(s string) error { _, err := account.NormalizeEmail("ana" + s + "@example.org"); return err },
		"label": func(s string) error { _, err := account.CheckLabel("coder" + s); return err },
		"operator_name": func(s string) error {
			_, err := account.CheckOperatorName("Ana" + s + "Smith")
			return err
		},
		"visible": func(s string) error { return account.CheckVisible("field", s+"x") },
	}
	for name, check := range checks {
		for _, r := range formatChars {
			err := check(string(r))
			want := fmt.Sprintf("invisible formatting characters (here %U)", r)
			if errs.CodeOf(err) != errs.InvalidRequest || !strings.Contains(err.Error(), want) {
				t.Errorf("%s with %U: %v", name, r, err)
			}
		}
		if err := check(""); err != nil {
			t.Errorf("%s without one: %v", name, err)
		}
	}
	// Visible non-ASCII text is fine; control characters and broken UTF-8
	// are refused by the same rule.
	for in, want := range map[string]string{"Zoë Ø 東京": "", "a\x07": "control", "a\u0085": "control", "a\xff": "UTF-8"} {
		err := account.CheckVisible("name", in)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckVisible(%q) = %v, want %q", in, err, want)
		}
	}
}
