package vectors

import (
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// tagSigner says, for each domain tag, which member of the object names its
// signer and how the signature is encoded. This is protocol knowledge
// (upstream-notes §1.4), not knowledge of the vectors.
var tagSigner = map[string]struct {
	member string
	enc    protocol.SigEncoding
}{
	protocol.TagVouch:           {"node", protocol.Base64URL},
	protocol.TagRoomDescriptor:  {"creator", protocol.Base64URL},
	protocol.TagAdmissionRoster: {"owner_key", protocol.Base64Std},
	protocol.TagAllowance:       {"owner_key", protocol.Base64URL},
	protocol.TagAgreement:       {"consumer_owner", protocol.Base64URL},
}

// checkSignatureTags: every member that is a signed object with its prefix.
func checkSignatureTags(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	for _, name := range members(doc) {
		m, ok := doc[name].(map[string]any)
		if !ok || m["signed"] == nil || m["signed_bytes_prefix"] == nil {
			continue
		}
		t.Run(name, func() error { return checkTaggedObject(m, k) })
	}
}

func checkTaggedObject(m map[string]any, k *keys.Agent) error {
	prefix := str(m["signed_bytes_prefix"])
	tag := strings.TrimSuffix(prefix, "\n")
	if tag == prefix {
		return fmt.Errorf("signed_bytes_prefix %q does not end in a line feed", prefix)
	}
	spec, known := tagSigner[tag]
	if !known {
		return fmt.Errorf("tag %q is not one this implementation signs", tag)
	}
	signed := obj(m["signed"])
	msg, err := protocol.SignedBytes(tag, signed)
	if err != nil {
		return err
	}
	if c := optStr(m, "canonical"); c != "" && string(msg) != tag+"\n"+c {
		return fmt.Errorf("canonical form differs:\n got  %s\n want %s", clip(string(msg[len(tag)+1:])), clip(c))
	}
	signer := str(signed[spec.member])
	sig := str(signed["sig"])
	if err := protocol.VerifyObject(tag, signed, signer, sig, spec.enc); err != nil {
		return err
	}
	if k != nil && k.Public() == signer {
		again, err := protocol.SignObject(tag, signed, k, spec.enc)
		if err != nil {
			return err
		}
		if again != sig {
			return fmt.Errorf("re-signing with the published seed gives %s, fixture has %s", again, sig)
		}
	}
	// The signature must not verify under any other tag.
	for other := range tagSigner {
		if other != tag && protocol.VerifyObject(other, signed, signer, sig, spec.enc) == nil {
			return fmt.Errorf("signature also verifies under tag %s", other)
		}
	}
	return nil
}

// checkManifestSigning: every member that is a key-claim vector.
func checkManifestSigning(t *T, doc map[string]any) {
	for _, name := range members(doc) {
		m, ok := doc[name].(map[string]any)
		if !ok || m["canonical"] == nil || m["signature"] == nil {
			continue
		}
		t.Run(name, func() error {
			got, err := protocol.ManifestKeyClaim(str(m["issued_at"]), str(m["id"]), optStr(m, "encryption_key"))
			if err != nil {
				return err
			}
			if err := quoteDiff(string(got), str(m["canonical"])); err != nil {
				return err
			}
			if err := protocol.VerifyManifestKeyClaim(str(m["issued_at"]), str(m["id"]), optStr(m, "encryption_key"), str(m["signature"])); err != nil {
				return err
			}
			if seed := optStr(m, "agent_seed"); seed != "" {
				k, err := keys.FromSeed[keys.AgentRole]([]byte(seed))
				if err != nil {
					return err
				}
				if k.Public() != str(m["id"]) {
					return fmt.Errorf("agent_seed is not the key of id")
				}
				sig, err := protocol.SignManifestKeyClaim(k, str(m["issued_at"]), optStr(m, "encryption_key"))
				if err != nil {
					return err
				}
				if sig != str(m["signature"]) {
					return fmt.Errorf("re-signing gives %s, fixture has %s", sig, m["signature"])
				}
			}
			if tr, ok := m["trust"].(map[string]any); ok {
				if tr["issued_at"] != m["issued_at"] || tr["signature"] != m["signature"] {
					return fmt.Errorf("trust block does not carry issued_at and signature")
				}
			}
			// A component containing a line feed must be refused.
			if _, err := protocol.ManifestKeyClaim(str(m["issued_at"]), str(m["id"])+"\n", ""); err == nil {
				return fmt.Errorf("a component with a line feed was accepted")
			}
			return nil
		})
	}
}

// checkNaming: the PAN wire strings, built from their fields.
func checkNaming(t *T, doc map[string]any) {
	if p, ok := doc["pair"].(map[string]any); ok {
		t.Run("pair", func() error {
			return quoteDiff(protocol.PairString(str(p["code"]), str(p["agent_id"])), str(p["canonical"]))
		})
	}
	if c, ok := doc["checkin_v3"].(map[string]any); ok {
		t.Run("checkin_v3", func() error {
			got := protocol.CheckinV3String(num(c["ts"]), str(c["agent_id"]), str(c["kind"]), str(c["host"]), str(c["platform"]), optStr(c, "encryption_key"))
			return quoteDiff(got, str(c["canonical"]))
		})
	}
	if c, ok := doc["card"].(map[string]any); ok {
		t.Run("card", func() error {
			got, err := protocol.CardBytes(c["value"])
			if err != nil {
				return err
			}
			return quoteDiff(string(got), str(c["canonical"]))
		})
	}
}
