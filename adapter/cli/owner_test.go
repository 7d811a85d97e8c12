package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The owner skus prints is registry.OwnerOf's now: the attested owner while
// its attestation lasts, "none" after it (never the node instead), and
// none for an agent that is its own node (review 18 #1, #2).
func TestSKUsOwnerLine(t *testing.T) {
	gen := func() string {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		return k.Public()
	}
	agent, owner, node := gen(), gen(), gen()
	at := func(d time.Duration) string { return protocol.FormatTime(time.Now().Add(d)) }
	for _, tc := range []struct {
		name string
		rec  map[string]any
		want string
	}{
		{"attested", map[string]any{"owner": owner, "owner_expires_at": at(time.Hour), "node": map[string]any{"id": node}}, "owner " + owner},
		{"attestation expired", map[string]any{"owner": owner, "owner_expires_at": at(-time.Minute), "node": map[string]any{"id": node}}, "owner none"},
		{"its own node", map[string]any{"owner": "", "node": map[string]any{"id": agent}}, "owner none"},
	} {
		tc.rec["id"], tc.rec["name"] = agent, "caselaw"
		var b bytes.Buffer
		printSKUs(&b, tc.rec, nil)
		if first, _, _ := strings.Cut(b.String(), "\n"); first != "caselaw ("+agent+"), "+tc.want {
			t.Errorf("%s: %q", tc.name, first)
		}
	}
}
