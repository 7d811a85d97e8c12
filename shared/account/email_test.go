package account_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
)

// One rule for every address the mesh mails a code to: the address that is
// verified is the address the mail goes to.
func TestNormalizeEmail(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"  Ana@Example.ORG ", "ana@example.org"},
		{"a.b+tag@mail.example.org", "a.b+tag@mail.example.org"},
	} {
		if got, err := account.NormalizeEmail(tc.in); err != nil || got != tc.want {
			t.Errorf("NormalizeEmail(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{
		"", "ana", "ana@", "@example.org", "ana@example", "ana@@example.org", "a na@example.org",
		"ana<eve@evil.org>", `"ana"@example.org`, "a,b@example.org", "ana(x)@example.org", "a..b@example.org",
		"ana\u202e@example.org", "ana\u200b@example.org",
	} {
		if _, err := account.NormalizeEmail(in); errs.CodeOf(err) != errs.InvalidRequest {
			t.Errorf("NormalizeEmail(%q) = %v, want INVALID_REQUEST", in, err)
		}
	}
}
