package vectors

import (
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// senderKey loads a fixture's published seed (test vectors, not real).
func senderKey(doc map[string]any) (*keys.Agent, error) {
	ids, _ := doc["identities"].(map[string]any)
	seed := optStr(ids, "sender_seed")
	if seed == "" {
		return nil, nil
	}
	return keys.FromSeed[keys.AgentRole]([]byte(seed))
}

// checkSignedEnvelope decodes a signed fixture envelope through the real
// decoder (structure, version, signature), compares our canonical form with
// the published one, and when the seed is known reproduces the signature.
func checkSignedEnvelope(signed any, canonical string, k *keys.Agent) (*protocol.Envelope, error) {
	wire, err := protocol.Canonical(signed)
	if err != nil {
		return nil, fmt.Errorf("re-encode fixture: %w", err)
	}
	e, err := protocol.Decode(wire)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	got, err := e.CanonicalUnsigned()
	if err != nil {
		return nil, err
	}
	if canonical != "" && string(got) != canonical {
		return nil, fmt.Errorf("canonical form differs:\n got  %s\n want %s", clip(string(got)), clip(canonical))
	}
	if k != nil && k.Public() == e.From {
		orig := e.Sig
		e.Sig = ""
		if err := e.Sign(k); err != nil {
			return nil, err
		}
		if e.Sig != orig {
			return nil, fmt.Errorf("re-signing with the published seed gives %s, fixture has %s", e.Sig, orig)
		}
	}
	return e, nil
}

// checkTamperBreaks flips one character of the payload and expects the
// decoder to refuse the result with IDENTITY_MISMATCH.
func checkTamperBreaks(signed any) error {
	m := obj(signed)
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	c["id"] = str(m["id"]) + "0"
	wire, err := protocol.Canonical(c)
	if err != nil {
		return err
	}
	_, err = protocol.Decode(wire)
	if errs.CodeOf(err) != errs.IdentityMismatch {
		return fmt.Errorf("a tampered envelope was not refused with IDENTITY_MISMATCH (got %v)", err)
	}
	return nil
}
