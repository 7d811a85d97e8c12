// Package keystest helps the tests of code that holds keys check that no
// rendering of a value (fmt, encoding, slog) discloses a seed.
package keystest

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// Secrets lists the forms in which seeds could leak: each seed encoded
// ("S...") and raw, as text and in %x, %X, %v and %q form. The raw Ed25519
// private key begins with the raw seed, so it is covered too.
func Secrets(t testing.TB, seeds ...[]byte) []string {
	t.Helper()
	var secrets []string
	for _, seed := range seeds {
		_, raw, err := nkeys.DecodeSeed(seed)
		if err != nil {
			t.Fatalf("keystest: not a seed: %v", err)
		}
		for _, b := range [][]byte{seed, raw} {
			secrets = append(secrets, string(b),
				fmt.Sprintf("%x", b), fmt.Sprintf("%X", b), fmt.Sprintf("%v", b), fmt.Sprintf("%q", b))
		}
	}
	return secrets
}

// NoSecret fails t if out, a rendering of some value, contains any of
// secrets (from Secrets), or if want is not empty and out lacks it.
func NoSecret(t testing.TB, out string, secrets []string, want string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Fatalf("rendering contains a seed: %s", out)
		}
	}
	if want != "" && !strings.Contains(out, want) {
		t.Fatalf("rendering %q lacks %q", out, want)
	}
}

// LogText is what slog's text handler writes for the attribute key=v.
func LogText(key string, v any) string {
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("msg", key, v)
	return buf.String()
}

// LogJSON is what slog's JSON handler writes for the attribute key=v.
func LogJSON(key string, v any) string {
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("msg", key, v)
	return buf.String()
}
