package registry

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzManifestCommerce feeds arbitrary owner, owner_attestation and skus
// members into an otherwise valid manifest: no input panics, a refusal is
// INVALID_MANIFEST, and an accepted manifest records as owner either the
// node or the key of an attestation for this agent that verifies (never the
// agent itself, and no longer than the attestation and the vouch), and
// prices only its own offerings.
func FuzzManifestCommerce(f *testing.F) {
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		f.Fatal(err)
	}
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		f.Fatal(err)
	}
	owner, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		f.Fatal(err)
	}
	now := time.Now()
	vouch, err := protocol.NewVouch(node, agent.Public(), now.Add(-time.Minute), now.Add(24*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	att, err := protocol.NewOwnerAttestation(owner, agent.Public(), now.Add(-time.Minute), now.Add(24*time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	attJSON, _ := json.Marshal(att)
	f.Add([]byte(`"`+owner.Public()+`"`), attJSON,
		[]byte(`[{"sku":"e","covers":{"offerings":["echo"]},"price":{"model":"flat","currency":"XCR","amount_micro":5},"provider":{"id":"internal"}}]`))
	f.Add([]byte(`null`), []byte(`null`), []byte(`[{"sku":"a","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}]`))
	f.Add([]byte(`"x"`), []byte(`{"node":1}`), []byte(`[{"sku":"a","covers":{"offerings":["nope"]},"price":{"model":"free"},"provider":{"id":"internal"}}]`))
	vouchJSON, _ := json.Marshal(vouch)
	f.Fuzz(func(t *testing.T, ownerB, attB, skusB []byte) {
		m := map[string]any{
			"id": agent.Public(), "name": "fuzzed",
			"offerings": []any{map[string]any{"id": "echo"}},
		}
		var nodeObj map[string]any
		_ = json.Unmarshal([]byte(`{"id":"`+node.Public()+`","attestation":`+string(vouchJSON)+`}`), &nodeObj)
		m["node"] = nodeObj
		for k, b := range map[string][]byte{MemberOwner: ownerB, MemberOwnerAttestation: attB, MemberSKUs: skusB} {
			v, err := protocol.ParseJSON(b)
			if err != nil {
				return
			}
			m[k] = v
		}
		got, err := parseManifest(m, agent.Public(), now)
		if err != nil {
			if c := errs.CodeOf(err); c != errs.InvalidManifest {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		o := got.rec.owner(now)
		if o == agent.Public() {
			t.Fatal("the agent was recorded as its own owner")
		}
		if o != node.Public() && o != "" {
			v, err := protocol.OwnerAttestationFromValue(m[MemberOwnerAttestation])
			if err != nil || v.Owner() != o || v.Agent != agent.Public() || v.Verify(now) != nil {
				t.Fatalf("owner %s recorded without an attestation that verifies", o)
			}
		}
		if o != "" && got.rec.owner(now.Add(24*time.Hour+time.Millisecond)) != "" {
			t.Fatalf("owner %s outlives the vouch and the attestation", o)
		}
		for _, s := range got.skus {
			for _, off := range s.Covers.Offerings {
				if !slices.Contains(got.rec.offeringIDs(), off) {
					t.Fatalf("SKU %s prices %q, not an offering", s.ID, off)
				}
			}
		}
	})
}
