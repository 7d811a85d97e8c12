package console

import "testing"

// safeNext (review M1): only a console page, cleaned and escaped; anything
// that decodes or cleans into a backslash, a "..", a second slash or
// another host is dropped.
func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/console/tokens":              "/console/tokens",
		"/console/":                    "/console/",
		"/console":                     "/console/",
		"/console/agent-keys?x=1#y":    "/console/agent-keys",
		"/console/a/../tokens":         "/console/tokens",
		"/console//tokens":             "/console/tokens",
		"/console/a%20b":               "/console/a%20b",
		"/console/a%25b":               "/console/a%25b",
		"/console/%2F%2Fevil.example/": "/console/evil.example",
		// The review's link, once the query is decoded.
		"/console/../%5Cevil.example/":    "",
		"/console/%5Cevil.example/":       "",
		"/console/%5c":                    "",
		"/console/%2e%2e/%5Cevil.example": "",
		"/console/%2e%2e/evil":            "",
		"/console/%2E%2E/%2E%2E/x":        "",
		"/console/..":                     "",
		"/console/../x":                   "",
		"/consolex/":                      "",
		"/console-evil/":                  "",
		"//evil.example/x":                "",
		"//evil.example/console/":         "",
		"/\\evil.example/":                "",
		"\\\\evil.example/console/":       "",
		"/console/\\evil":                 "",
		"/console/%09evil":                "",
		"/console/%0d%0aSet-Cookie:x":     "",
		"/console/\x00":                   "",
		"https://evil.example/console/":   "",
		"http:/console/":                  "",
		"javascript:alert(1)":             "",
		"mailto:a@b.org":                  "",
		"console/tokens":                  "",
		"":                                "",
		"%2Fconsole%2Ftokens":             "/console/tokens", // decodes to a console page
	} {
		got := safeNext(next)
		if got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
		if got != "" && safeNext(got) != got {
			t.Errorf("safeNext(%q) = %q is not stable: %q", next, got, safeNext(got))
		}
	}
}
