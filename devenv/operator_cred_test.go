package devenv_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"agentmesh.dev/mesh/devenv"
)

// lockedBuffer is a log sink the mesh's goroutines write concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Minting an operator test credential is logged, with its key and expiry
// and never its seed or JWT; the admin door refuses it without a ttl or
// with one over a day.
func TestOperatorCredentialIsLoggedWithoutItsSeed(t *testing.T) {
	var logs lockedBuffer
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	for _, ttl := range []string{"", "0s", "24h1s", "1 hour"} {
		if st, out := c.adminPost("/admin/operator-credentials", map[string]any{"ttl": ttl}); st != 400 || !strings.Contains(out["error"].(string), "ttl") {
			t.Errorf("ttl %q: %d %v", ttl, st, out)
		}
	}
	st, out := c.adminPost("/admin/operator-credentials", map[string]any{"ttl": "24h", "label": "conformance"})
	if st != 200 {
		t.Fatalf("mint: %d %v", st, out)
	}
	key, seed, tok := out["public_key"].(string), out["seed"].(string), out["jwt"].(string)
	got := logs.String()
	if !strings.Contains(got, "operator test credential minted") || !strings.Contains(got, key) {
		t.Errorf("the mint is not logged with its key:\n%s", got)
	}
	if strings.Contains(got, seed) || strings.Contains(got, tok) {
		t.Error("the log holds the operator credential's seed or JWT")
	}
	if st, out := c.adminPost("/admin/operator-credentials/"+key+"/revoke", nil); st != 200 {
		t.Fatalf("revoke: %d %v", st, out)
	}
	if !strings.Contains(logs.String(), "operator test credential revoked") {
		t.Error("the revocation is not logged")
	}
}
