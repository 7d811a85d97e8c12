package registrar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/pancard"
	"agentmesh.dev/mesh/shared/protocol"
)

// The card, the key set and the checks every resolver makes are
// shared/pancard's (the rooms worker resolves creators with the same code);
// these names keep the adapter's API.

// Card is a resolved handle (spec §2.2, upstream-notes §12.4), as signed by
// the registrar.
type Card = pancard.Card

// ExpiryGrace is how long after its expires_at a card is still accepted
// (upstream-notes §12.4: at most 60 s, for clock skew).
const ExpiryGrace = pancard.ExpiryGrace

// KeyUse is the use of a card-signing key in the key set.
const KeyUse = pancard.KeyUse

// KeySet is the registrar's GET /api/registrar-key.
type KeySet = pancard.KeySet

// Kid is a registrar key's id: the first 12 hex digits of the SHA-256 of
// the key string.
func Kid(key string) string { return pancard.Kid(key) }

// CurrentKeys parses a key set answer and returns its current
// card-signing keys, each checked against its kid. base is the registrar
// that served it; a key set naming another registrar is refused.
func CurrentKeys(body []byte, base string) ([]string, error) { return pancard.CurrentKeys(body, base) }

// SameRegistrar compares two registrar base URLs: scheme and host without
// regard to case, and the path without a trailing slash.
func SameRegistrar(a, b string) bool { return pancard.SameRegistrar(a, b) }

func normalizeBase(s string) string { return pancard.NormalizeBase(s) }

// resolution is the registrar's answer to resolve.
type resolution struct {
	Card         json.RawMessage `json:"card"`
	RegistrarKey string          `json:"registrar_key"`
	RegistrarKid string          `json:"registrar_kid"`
	RegistrarSig string          `json:"registrar_sig"`
}

// ErrRegistrarKeyChanged is a card signed by a key other than the one
// pinned for its registrar. It is never accepted.
var ErrRegistrarKeyChanged = errors.New("the registrar's signing key changed")

// VerifyCard checks a resolve answer offline: the card is signed by
// registrarKey over its canonical JSON, names the registrar at base and
// the handle asked for (case-folded), and has not expired (beyond
// ExpiryGrace). It returns the card and the registrar key the answer
// names. It does not look at endpoints: a reserved card verifies too.
func VerifyCard(body []byte, registrarKey, base, handle string, now time.Time) (*Card, error) {
	var res resolution
	if err := json.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("the registrar's answer is not valid JSON: %w", err)
	}
	if len(bytes.TrimSpace(res.Card)) == 0 || bytes.Equal(bytes.TrimSpace(res.Card), []byte("null")) {
		return nil, fmt.Errorf("the registrar's answer for %s has no card", handle)
	}
	if res.RegistrarKey != registrarKey {
		return nil, fmt.Errorf("%w: the card for %s is signed by %s, but this adapter trusts %s for %s",
			ErrRegistrarKeyChanged, handle, res.RegistrarKey, registrarKey, base)
	}
	if res.RegistrarKid != "" && res.RegistrarKid != Kid(registrarKey) {
		return nil, fmt.Errorf("the card for %s names key id %s, which is not the id of its key", handle, res.RegistrarKid)
	}
	if err := protocol.VerifyCard(registrarKey, res.Card, res.RegistrarSig); err != nil {
		return nil, fmt.Errorf("the card for %s does not carry a valid registrar signature: refusing it (%v)", handle, err)
	}
	var card Card
	if err := json.Unmarshal(res.Card, &card); err != nil {
		return nil, fmt.Errorf("the card for %s: %w", handle, err)
	}
	if fold(card.Handle) != fold(handle) {
		return nil, fmt.Errorf("the registrar answered for %s with the card of %q", handle, card.Handle)
	}
	if !SameRegistrar(card.Registrar, base) {
		return nil, fmt.Errorf("the card for %s names the registrar %q, not %s which served it", handle, card.Registrar, base)
	}
	exp, err := protocol.ParseTime(card.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("the card for %s has no valid expires_at", handle)
	}
	if now.After(exp.Add(ExpiryGrace)) {
		return nil, fmt.Errorf("the card for %s expired at %s: refusing it (is this machine's clock right?)", handle, card.ExpiresAt)
	}
	return &card, nil
}

// fold is how handles compare: the case-folded whole string.
func fold(h string) string { return strings.ToLower(strings.TrimSpace(h)) }

// AgentOf is the mesh agent a verified card names.
func AgentOf(card *Card) (string, error) { return pancard.AgentOf(card) }

// ResolveOptions tune Resolve.
type ResolveOptions struct {
	// AcceptNewBinding re-pins a handle whose agent changed instead of
	// refusing it.
	AcceptNewBinding bool
}

// Resolved is a verified resolution.
type Resolved struct {
	AgentID      string
	Card         *Card
	RegistrarKey string
	// Previous is the agent the handle was pinned to, when the binding
	// changed and AcceptNewBinding re-pinned it.
	Previous string
}

// ResolveAgent returns the agent bound to handle, verified and pinned.
func (c *Client) ResolveAgent(ctx context.Context, handle string) (string, error) {
	r, err := c.Resolve(ctx, handle, ResolveOptions{})
	if err != nil {
		return "", err
	}
	return r.AgentID, nil
}

// Resolve fetches the card of handle and verifies it offline with the
// registrar key pinned for this registrar; on first contact that key is
// taken from the registrar's key set and pinned. A card whose agent
// differs from the one pinned for the handle is a *BindingChangedError
// unless opt.AcceptNewBinding; a registrar whose key changed is refused
// (ErrRegistrarKeyChanged).
func (c *Client) Resolve(ctx context.Context, handle string, opt ResolveOptions) (*Resolved, error) {
	var body json.RawMessage
	err := c.do(ctx, http.MethodGet, "/api/resolve?handle="+url.QueryEscape(handle), "", nil, &body)
	var re *Error
	switch {
	case errors.As(err, &re) && re.Status == http.StatusNotFound:
		return nil, fmt.Errorf("no agent is bound to the handle %s (the registrar knows no such handle)", handle)
	case errors.As(err, &re) && re.Status == http.StatusServiceUnavailable:
		return nil, fmt.Errorf("the registrar at %s cannot sign cards right now, so %s cannot be resolved safely; retry shortly (%s)", c.Base, handle, re.Message)
	case err != nil:
		return nil, err
	}
	var named resolution
	if err := json.Unmarshal(body, &named); err != nil {
		return nil, fmt.Errorf("the registrar's answer for %s is not valid JSON: %w", handle, err)
	}
	var pinned string
	if c.Pins != nil {
		if pinned, err = c.Pins.RegistrarKey(c.Base); err != nil {
			return nil, err
		}
	}
	trusted := pinned
	if trusted == "" {
		var ks json.RawMessage
		if err := c.do(ctx, http.MethodGet, "/api/registrar-key", "", nil, &ks); err != nil {
			return nil, fmt.Errorf("the registrar's key set: %w", err)
		}
		current, err := CurrentKeys(ks, c.Base)
		if err != nil {
			return nil, err
		}
		for _, k := range current {
			if k == named.RegistrarKey {
				trusted = k
			}
		}
		if trusted == "" {
			return nil, fmt.Errorf("the card for %s is signed by %s, which the registrar's key set does not list as current", handle, named.RegistrarKey)
		}
	} else if named.RegistrarKey != pinned {
		return nil, fmt.Errorf("%w: the registrar at %s now signs with %s (kid %s), but this adapter pinned %s (kid %s); refusing. If its operator really rotated the key, remove the entry for %s from %s",
			ErrRegistrarKeyChanged, c.Base, named.RegistrarKey, Kid(named.RegistrarKey), pinned, Kid(pinned), c.Base, c.Pins.Path())
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	card, err := VerifyCard(body, trusted, c.Base, handle, now)
	if err != nil {
		return nil, err
	}
	agent, err := AgentOf(card)
	if err != nil {
		return nil, err
	}
	out := &Resolved{AgentID: agent, Card: card, RegistrarKey: trusted}
	if c.Pins != nil {
		if out.Previous, err = c.Pins.Pin(c.Base, trusted, card.Handle, agent, opt.AcceptNewBinding, now); err != nil {
			return nil, err
		}
	}
	return out, nil
}
