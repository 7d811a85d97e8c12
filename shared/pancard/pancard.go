// Package pancard checks a registrar's signed cards offline, as a resolver
// does (spec §2.2, upstream-notes §12.4): the registrar's key set, the
// signature over the card's canonical JSON, the registrar the card names,
// its expiry, and the mesh agent it binds. It is the part of resolving
// that services share with the adapter, and it talks to no registrar
// itself.
package pancard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Card is a resolved handle, as signed by the registrar.
type Card struct {
	Handle   string `json:"handle"`
	Reserved bool   `json:"reserved"`
	Operator struct {
		Name string `json:"name"`
		// ID is the operator's opaque id (this mesh's registrar only).
		ID string `json:"id,omitempty"`
	} `json:"operator"`
	Endpoints []struct {
		Protocol string `json:"protocol"`
		AgentID  string `json:"agent_id"`
	} `json:"endpoints"`
	Binding    *string `json:"binding"`
	ClaimedVia string  `json:"claimed_via"`
	ClaimedAt  string  `json:"claimed_at"`
	Registrar  string  `json:"registrar"`
	IssuedAt   string  `json:"issued_at"`
	ExpiresAt  string  `json:"expires_at"`
}

// ExpiryGrace is how long after its expires_at a card is still accepted
// (upstream-notes §12.4: at most 60 s, for clock skew).
const ExpiryGrace = 60 * time.Second

// KeyUse is the use of a card-signing key in the key set.
const KeyUse = "pan-card-signing"

// Kid is a registrar key's id: the first 12 hex digits of the SHA-256 of
// the key string.
func Kid(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:12]
}

// KeySet is the registrar's GET /api/registrar-key.
type KeySet struct {
	Registrar string   `json:"registrar"`
	Keys      []string `json:"keys"`
	KeySet    []struct {
		Kid    string `json:"kid"`
		Key    string `json:"key"`
		Status string `json:"status"`
		Use    string `json:"use"`
	} `json:"key_set"`
}

// CurrentKeys parses a key set answer and returns its current
// card-signing keys, each checked against its kid. base is the registrar
// that served it; a key set naming another registrar is refused.
func CurrentKeys(body []byte, base string) ([]string, error) {
	var ks KeySet
	if err := json.Unmarshal(body, &ks); err != nil {
		return nil, fmt.Errorf("the registrar's key set is not valid JSON: %w", err)
	}
	if !SameRegistrar(ks.Registrar, base) {
		return nil, fmt.Errorf("the key set served by %s names the registrar %q", base, ks.Registrar)
	}
	var out []string
	for _, k := range ks.KeySet {
		if k.Status == "current" && k.Use == KeyUse && keys.IsUserPublicKey(k.Key) && k.Kid == Kid(k.Key) {
			out = append(out, k.Key)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the registrar at %s publishes no current card-signing key", base)
	}
	return out, nil
}

// SameRegistrar compares two registrar base URLs: scheme and host without
// regard to case, and the path without a trailing slash.
func SameRegistrar(a, b string) bool {
	return normalizeBase(a) == normalizeBase(b) && normalizeBase(a) != ""
}

// NormalizeBase is a registrar base URL as SameRegistrar compares it
// (lower-case scheme and host, the path without a trailing slash), or ""
// when s is no absolute URL; resolvers key their pins by it.
func NormalizeBase(s string) string { return normalizeBase(s) }

func normalizeBase(s string) string {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return ""
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + strings.TrimRight(u.Path, "/")
}

// Resolution is the registrar's answer to resolve: the card, and the key,
// key id and signature it was signed with.
type Resolution struct {
	Card         json.RawMessage `json:"card"`
	RegistrarKey string          `json:"registrar_key"`
	RegistrarKid string          `json:"registrar_kid"`
	RegistrarSig string          `json:"registrar_sig"`
}

// ParseResolution reads a resolve answer.
func ParseResolution(body []byte) (*Resolution, error) {
	var res Resolution
	if err := json.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("the registrar's answer is not valid JSON: %w", err)
	}
	if c := bytes.TrimSpace(res.Card); len(c) == 0 || bytes.Equal(c, []byte("null")) {
		return nil, errors.New("the registrar's answer has no card")
	}
	return &res, nil
}

// ErrKeyChanged is a card signed by a key other than the one trusted for
// its registrar. It is never accepted.
var ErrKeyChanged = errors.New("the registrar's signing key changed")

// Verify checks the resolution offline: the card is signed by key (the
// registrar key the caller trusts) over its canonical JSON, names the
// registrar at base, and has not expired beyond ExpiryGrace at now. It
// does not look at endpoints: a reserved card verifies too.
func (r *Resolution) Verify(key, base string, now time.Time) (*Card, error) {
	if r.RegistrarKey != key {
		return nil, fmt.Errorf("%w: the card is signed by %s, but %s is trusted for %s", ErrKeyChanged, r.RegistrarKey, key, base)
	}
	if r.RegistrarKid != "" && r.RegistrarKid != Kid(key) {
		return nil, fmt.Errorf("the card names key id %s, which is not the id of its key", r.RegistrarKid)
	}
	if err := protocol.VerifyCard(key, r.Card, r.RegistrarSig); err != nil {
		return nil, fmt.Errorf("the card does not carry a valid registrar signature: refusing it (%v)", err)
	}
	var card Card
	if err := json.Unmarshal(r.Card, &card); err != nil {
		return nil, fmt.Errorf("the card: %w", err)
	}
	if !SameRegistrar(card.Registrar, base) {
		return nil, fmt.Errorf("the card of %s names the registrar %q, not %s which served it", card.Handle, card.Registrar, base)
	}
	exp, err := protocol.ParseTime(card.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("the card of %s has no valid expires_at", card.Handle)
	}
	if now.After(exp.Add(ExpiryGrace)) {
		return nil, fmt.Errorf("the card of %s expired at %s: refusing it (is this machine's clock right?)", card.Handle, card.ExpiresAt)
	}
	return &card, nil
}

// AgentOf is the mesh agent a verified card binds.
func AgentOf(card *Card) (string, error) {
	if card.Reserved || len(card.Endpoints) == 0 {
		return "", fmt.Errorf("the handle %s is claimed but no agent is bound to it yet (reserved)", card.Handle)
	}
	for _, e := range card.Endpoints {
		// The specification's protocol is "mesh"; upstream's "agentmesh".
		if (e.Protocol == "mesh" || e.Protocol == "agentmesh") && keys.IsUserPublicKey(e.AgentID) {
			return e.AgentID, nil
		}
	}
	return "", fmt.Errorf("the card of %s has no mesh endpoint", card.Handle)
}
