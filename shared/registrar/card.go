package registrar

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// Card is what resolve answers (spec §2.2, upstream-notes §12.4). The
// registrar signs the canonical JSON of the whole card (RFC 8785, no tag);
// the signature travels beside it.
type Card struct {
	Handle   string       `json:"handle"`
	Operator CardOperator `json:"operator"`
	// Reserved is true while the handle is claimed and no agent is bound;
	// Endpoints is then empty.
	Reserved  bool       `json:"reserved"`
	Endpoints []Endpoint `json:"endpoints"`
	// Binding is how the agent was bound: "agent-key" (a pairing code
	// signed by the agent key) or "agent-token" (the account's agent key
	// exchange); null while reserved.
	Binding *string `json:"binding"`
	// ClaimedVia is how the address was proven: "email" (a code mailed by
	// this registrar), "console" (the console's signed-in account) or
	// "account" (an agent key's exchange).
	ClaimedVia string `json:"claimed_via"`
	ClaimedAt  string `json:"claimed_at"`
	Registrar  string `json:"registrar"`
	IssuedAt   string `json:"issued_at"`
	ExpiresAt  string `json:"expires_at"`
}

// CardOperator is the card's operator.
type CardOperator struct {
	Name string `json:"name"`
	// ID is the operator's stable, opaque id (account.OperatorID of the
	// verified address; beyond upstream's card, which has the name only).
	// Services that count per operator (the rooms' quota) read it: the
	// handle itself is never parsed, since a name may hold dots.
	ID string `json:"id,omitempty"`
}

// Endpoint is one way to reach the handle's agent.
type Endpoint struct {
	Protocol string `json:"protocol"`
	AgentID  string `json:"agent_id"`
}

// Kid is a key's id in the key set: the first 12 hex digits of the SHA-256
// of the key string.
func Kid(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:12]
}

var errNoAgent = errs.New(errs.NotFound, "no agent by that name")

// errCannotSign is the answer of a registrar without its signing key: it
// never serves an unsigned card.
var errCannotSign = errs.New(errs.Unavailable, "this registrar cannot sign cards right now, and it never serves an unsigned one; retry shortly")

// Lookup finds the handle a resolve names: by handle (case-folded) or, in
// reverse, by the agent id bound to it (the most recently bound handle when
// an agent has several). Exactly one of handle and agentID is given.
func (s *Service) Lookup(ctx context.Context, handle, agentID string) (account.Handle, error) {
	handle, agentID = strings.TrimSpace(handle), strings.TrimSpace(agentID)
	switch {
	case handle == "" && agentID == "":
		return account.Handle{}, errs.New(errs.InvalidRequest, "give ?handle=<name>.<email> or ?agent_id=<agent public key>")
	case handle != "" && agentID != "":
		return account.Handle{}, errs.New(errs.InvalidRequest, "give either handle or agent_id, not both")
	case len(handle) > MaxHandle:
		return account.Handle{}, errs.Newf(errs.InvalidRequest, "handle is longer than %d bytes, so no handle has it", MaxHandle)
	case agentID != "" && !keys.IsUserPublicKey(agentID):
		return account.Handle{}, errs.New(errs.InvalidRequest, "agent_id must be an agent public key (U followed by 55 characters)")
	}
	var h account.Handle
	var found bool
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		h, found = account.Handle{}, false
		if handle != "" {
			var err error
			if found, err = getOptional(tx, account.CollHandles, HandleID(handle), &h); err != nil {
				return err
			}
		} else {
			var hs []account.Handle
			if err := tx.Query(account.CollHandles, store.Where("agent_id", agentID), &hs); err != nil {
				return err
			}
			for _, x := range hs {
				if !found || x.BoundAt > h.BoundAt {
					h, found = x, true
				}
			}
		}
		if !found {
			return nil
		}
		// The card shows the operator name where it lives, on the
		// address's account; the handle's own copy is the name it was
		// claimed under, for an address whose account has none.
		op, err := operatorNameIn(tx, h.Email)
		h.OperatorName = cmp.Or(op, h.OperatorName)
		return err
	})
	if err != nil {
		return account.Handle{}, txErr(err)
	}
	if !found {
		return account.Handle{}, errNoAgent
	}
	return h, nil
}

// CardOf is the card of a stored handle, issued now.
func (s *Service) CardOf(h account.Handle) Card {
	now := s.now()
	c := Card{Handle: h.Handle, Operator: CardOperator{Name: h.OperatorName, ID: operatorID(h.Email)}, Reserved: h.AgentID == "",
		Endpoints: []Endpoint{}, ClaimedVia: h.ClaimedVia, ClaimedAt: protocol.FormatTime(time.UnixMilli(h.ClaimedAt)),
		Registrar: s.url, IssuedAt: protocol.FormatTime(now), ExpiresAt: protocol.FormatTime(now.Add(s.cardTTL))}
	if c.ClaimedVia == "" {
		c.ClaimedVia = "account"
	}
	if h.AgentID != "" {
		c.Endpoints = []Endpoint{{Protocol: Protocol, AgentID: h.AgentID}}
		b := h.Binding
		if b == "" {
			b = "agent-token"
		}
		c.Binding = &b
	}
	return c
}

// Resolution is a signed card.
type Resolution struct {
	Card Card
	// CardJSON is the canonical JSON of the card: exactly the signed
	// bytes, which is what goes on the wire.
	CardJSON []byte
	// Key is the registrar's signing key, Kid its id, Sig the standard
	// base64 Ed25519 signature over CardJSON.
	Key, Kid, Sig string
}

// Resolve answers GET /api/resolve: the signed card of a handle, or of the
// handle an agent id is bound to. A claimed handle with no agent resolves
// as reserved; nothing claimed is 404 "no agent by that name"; a registrar
// that cannot sign answers 503.
func (s *Service) Resolve(ctx context.Context, handle, agentID string) (Resolution, error) {
	if s.signer == nil {
		return Resolution{}, errCannotSign
	}
	h, err := s.Lookup(ctx, handle, agentID)
	if err != nil {
		return Resolution{}, err
	}
	return s.Sign(s.CardOf(h))
}

// Sign signs a card with the registrar's key.
func (s *Service) Sign(c Card) (Resolution, error) {
	if s.signer == nil {
		return Resolution{}, errCannotSign
	}
	b, err := protocol.CardBytes(c)
	if err != nil {
		return Resolution{}, errs.Wrap(errs.InternalError, "the card cannot be canonicalised", err)
	}
	key := s.signer.Public()
	return Resolution{Card: c, CardJSON: b, Key: key, Kid: Kid(key), Sig: protocol.Base64Std.Encode(s.signer.Sign(b))}, nil
}

// KeySet is GET /api/registrar-key (upstream-notes §12.4): the current key
// first; rotation would add retired keys after it.
type KeySet struct {
	Registrar string     `json:"registrar"`
	Keys      []string   `json:"keys"`
	KeySet    []KeyEntry `json:"key_set"`
}

// KeyEntry is one key of the key set.
type KeyEntry struct {
	Kid    string `json:"kid"`
	Key    string `json:"key"`
	Status string `json:"status"` // current | retired
	Use    string `json:"use"`    // pan-card-signing
}

// Keys is the registrar's key set; 503 without a signing key.
func (s *Service) Keys() (KeySet, error) {
	if s.signer == nil {
		return KeySet{}, errCannotSign
	}
	k := s.signer.Public()
	return KeySet{Registrar: s.url, Keys: []string{k},
		KeySet: []KeyEntry{{Kid: Kid(k), Key: k, Status: "current", Use: KeyUse}}}, nil
}

// JRD is a WebFinger answer (RFC 7033), served as application/jrd+json.
type JRD struct {
	Subject    string         `json:"subject"`
	Properties map[string]any `json:"properties"`
	Links      []JRDLink      `json:"links"`
}

// JRDLink is one WebFinger link.
type JRDLink struct {
	Rel  string `json:"rel"`
	Type string `json:"type"`
	Href string `json:"href"`
}

// WebFinger answers GET /.well-known/webfinger?resource=acct:<handle>
// (upstream-notes §12.4): the handle's binding and a link to its card.
func (s *Service) WebFinger(ctx context.Context, resource string) (JRD, error) {
	resource = strings.TrimSpace(resource)
	if len(resource) < 5 || !strings.EqualFold(resource[:5], "acct:") || len(resource) == 5 {
		return JRD{}, errs.New(errs.InvalidRequest, "resource must be acct:<handle>, e.g. acct:coder.ana@example.org")
	}
	h, err := s.Lookup(ctx, resource[5:], "")
	if err != nil {
		return JRD{}, err
	}
	c := s.CardOf(h)
	var binding any
	if c.Binding != nil {
		binding = *c.Binding
	}
	return JRD{Subject: "acct:" + h.Handle, Properties: map[string]any{"urn:pan:binding": binding},
		Links: []JRDLink{{Rel: "urn:pan:card", Type: "application/json", Href: s.url + "/api/resolve?handle=" + url.QueryEscape(h.Handle)}}}, nil
}

// operatorID is the card's operator id of a handle's address ("" for a
// handle stored without one).
func operatorID(email string) string {
	if email == "" {
		return ""
	}
	return account.OperatorID(email)
}
