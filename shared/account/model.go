// Package account is the control plane's account service: accounts proven
// by a mailed one-time code, sessions, scoped API tokens (amt_), passkeys,
// and the single-use agent keys (am_) a person mints for their agents.
//
// Every bearer secret is returned once and stored only as its SHA-256
// (shared/secret). Single-use things are consumed inside one store
// transaction, never read-then-written across two.
package account

import (
	"crypto/sha256"
	"encoding/hex"
	netmail "net/mail"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/secret"
)

// Collections of the control-plane store this package owns. The handle
// collection is shared with the registrar.
const (
	CollAccounts   = "accounts"
	CollEmails     = "account_emails" // id: normalised email → {account_id}
	CollCodes      = "login_codes"    // id: hash(purpose, email)
	CollSessions   = "sessions"       // id: hash(token)
	CollAPITokens  = "api_tokens"     // id: hash(token)
	CollPasskeys   = "passkeys"       // id: account id → all its credentials
	CollCeremonies = "passkey_ceremonies"
	CollAgentKeys  = "agent_keys" // id: hash(am_ key)
	CollHandles    = "handles"    // id: case-folded handle
)

// Token prefixes.
const (
	SessionPrefix  = "ams_"
	APITokenPrefix = "amt_"
	AgentKeyPrefix = "am_"
)

// Defaults (upstream-notes §13: account session 30 days, sign-in code 15
// minutes, agent key 7 days, 30 agents per account).
const (
	DefaultSessionTTL   = 30 * 24 * time.Hour
	DefaultCodeTTL      = 15 * time.Minute
	CodeAttempts        = 5
	AgentKeyTTL         = 7 * 24 * time.Hour
	DefaultAgentCeiling = 30
	MaxLabel            = 64
	MaxOperatorName     = 80
)

// Account is one customer account.
type Account struct {
	ID             string `json:"id"`
	Email          string `json:"email"`
	CreatedAt      int64  `json:"created_at"` // Unix ms
	Verified       bool   `json:"verified"`   // the email was proven by a code
	Disabled       bool   `json:"disabled"`
	DisabledReason string `json:"disabled_reason,omitempty"`
	DisabledAt     int64  `json:"disabled_at,omitempty"`
	OperatorName   string `json:"operator_name,omitempty"`
	AgentCeiling   int    `json:"agent_ceiling,omitempty"` // 0: DefaultAgentCeiling
}

// Ceiling is the account's agent ceiling.
func (a Account) Ceiling() int {
	if a.AgentCeiling > 0 {
		return a.AgentCeiling
	}
	return DefaultAgentCeiling
}

type emailIndex struct {
	AccountID string `json:"account_id"`
}

type loginCode struct {
	secret.Code
	Email string `json:"email"`
}

// Session is a signed-in browser or CLI session.
type Session struct {
	ID        string `json:"id"` // hash of the token
	AccountID string `json:"account_id"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt int64  `json:"expires_at"`
	PasskeyAt int64  `json:"passkey_at,omitempty"` // last passkey assertion in this session
	Revoked   bool   `json:"revoked,omitempty"`
}

// APIToken is a scoped account token (amt_), for programs.
type APIToken struct {
	ID        string   `json:"id"` // public id: first 12 hex of the hash
	Hash      string   `json:"hash"`
	AccountID string   `json:"account_id"`
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	CreatedAt int64    `json:"created_at"`
	RevokedAt int64    `json:"revoked_at,omitempty"`
}

// AgentKey is a single-use bootstrap key (am_), as stored.
type AgentKey struct {
	ID          string `json:"id"` // public id: first 12 hex of the hash
	Hash        string `json:"hash"`
	AccountID   string `json:"account_id"`
	Label       string `json:"label"`
	HandleClaim string `json:"handle_claim,omitempty"`
	CreatedAt   int64  `json:"created_at"`
	ExpiresAt   int64  `json:"expires_at"`
	ClaimedAt   int64  `json:"claimed_at,omitempty"`
	AgentID     string `json:"agent_id,omitempty"`
	RevokedAt   int64  `json:"revoked_at,omitempty"`
}

// Usable reports whether the key can still be exchanged at now.
func (k AgentKey) Usable(now time.Time) bool {
	return k.ClaimedAt == 0 && k.RevokedAt == 0 && now.UnixMilli() < k.ExpiresAt
}

// Handle is a claimed `<name>.<email>` handle (shared with the registrar,
// shared/registrar, which documents the card it becomes).
type Handle struct {
	Handle       string `json:"handle"` // as claimed (display case)
	AccountID    string `json:"account_id"`
	Email        string `json:"email"`
	OperatorName string `json:"operator_name"`
	AgentID      string `json:"agent_id,omitempty"` // empty while reserved
	ClaimedAt    int64  `json:"claimed_at"`
	BoundAt      int64  `json:"bound_at,omitempty"`
	// ClaimedVia is how the email was proven ("email": a code at the
	// registrar; "console": the console's signed-in account); empty for
	// a handle claimed by an agent key's exchange (read as "account").
	ClaimedVia string `json:"claimed_via,omitempty"`
	// Binding is how the agent was bound ("agent-key": a signed pairing
	// code); empty for the agent key exchange (read as "agent-token").
	Binding string `json:"binding,omitempty"`
}

// HandleID is the store key of a handle: uniqueness is on the case-folded
// whole string. A name may hold '/', which no store id may, and a handle
// may look like Firestore's reserved __…__ ids, so '%', '/' and a leading
// '_' are percent-escaped ('%' first, which keeps the mapping one to one).
func HandleID(h string) string {
	id := handleIDEscaper.Replace(strings.ToLower(strings.TrimSpace(h)))
	if strings.HasPrefix(id, "_") {
		id = "%5F" + id[1:]
	}
	return id
}

var handleIDEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// NormalizeEmail trims and lower-cases an address and checks its shape:
// one '@', a non-empty local part, a dotted domain, at most 254 bytes, no
// spaces or control characters.
func NormalizeEmail(s string) (string, error) {
	e := strings.ToLower(strings.TrimSpace(s))
	bad := func() (string, error) {
		return "", errs.New(errs.InvalidRequest, "email must be an address like ana@example.org")
	}
	if e == "" || len(e) > 254 || strings.Count(e, "@") != 1 {
		return bad()
	}
	for _, r := range e {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return bad()
		}
	}
	local, domain, _ := strings.Cut(e, "@")
	if local == "" || !strings.Contains(domain, ".") || strings.HasPrefix(domain, ".") || strings.HasSuffix(domain, ".") {
		return bad()
	}
	// The address the mail goes to must be the address that is verified:
	// net/mail would deliver "ana<eve@evil.org>" to eve.
	if a, err := netmail.ParseAddress(e); err != nil || a.Name != "" || a.Address != e {
		return "", errs.New(errs.InvalidRequest, "email must be a bare address like ana@example.org: no display name, angle brackets, quotes, commas, parentheses or consecutive dots")
	}
	if err := CheckVisible("email", e); err != nil {
		return "", err
	}
	return e, nil
}

// CheckVisible is the one rule for text a person reads as a name or an
// address: handle names, operator names, agent-key labels, app and
// API-token names, the app name and address of the connect approval mail,
// every email. It must be valid UTF-8 with no control character and no
// invisible format character (Unicode category Cf: bidirectional controls
// U+202A–U+202E and U+2066–U+2069, zero-width U+200B–U+200F, U+FEFF, the
// soft hyphen, …), which can make one name look like another or reverse
// what a mail seems to say. field names the member in the refusal. Each
// check adds its own rules (length, white space, '@') on top.
func CheckVisible(field, s string) error {
	if !utf8.ValidString(s) {
		return errs.Newf(errs.InvalidRequest, "%s must be UTF-8 text", field)
	}
	for _, r := range s {
		switch {
		case unicode.IsControl(r):
			return errs.Newf(errs.InvalidRequest, "%s must not contain control characters", field)
		case unicode.Is(unicode.Cf, r):
			return errs.Newf(errs.InvalidRequest, "%s must not contain invisible formatting characters (here %U): %s", field, r, formatHint)
		}
	}
	return nil
}

// formatHint says why format characters (Unicode Cf) are refused, beyond
// upstream's "no control characters".
const formatHint = "bidirectional controls (U+202E, U+2066, …) and zero-width characters (U+200B, U+FEFF, …) can make one name look like another"

// CheckLabel validates an agent key's label (the agent's name).
func CheckLabel(label string) (string, error) {
	l := strings.TrimSpace(label)
	if l == "" {
		return "", errs.New(errs.InvalidRequest, "name is required: the agent's name, e.g. \"coder\"")
	}
	if len(l) > MaxLabel {
		return "", errs.Newf(errs.InvalidRequest, "name is longer than %d bytes", MaxLabel)
	}
	if err := CheckVisible("name", l); err != nil {
		return "", err
	}
	return l, nil
}

// HandleClaimOf is the handle a label stands as a claim on (spec §4.4): a
// label with no spaces and no '@' claims `<label>.<email>`.
func HandleClaimOf(label, email string) string {
	if strings.ContainsAny(label, " \t@") {
		return ""
	}
	return label + "." + email
}

// CheckOperatorName validates an operator display name.
func CheckOperatorName(n string) (string, error) {
	n = strings.TrimSpace(n)
	if len(n) > MaxOperatorName {
		return "", errs.Newf(errs.InvalidRequest, "operator_name is longer than %d characters", MaxOperatorName)
	}
	if err := CheckVisible("operator_name", n); err != nil {
		return "", err
	}
	return n, nil
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func publicID(hash string) string { return hash[:12] }

// OperatorID is the stable, opaque id of the operator anchored to a verified
// address: "op_" and 32 hex digits of SHA-256("mesh-operator-v1\n" + the
// address, lower-cased). The registrar's card carries it (operator.id), so
// a service counting per operator never parses a handle, whose name part
// may hold dots.
func OperatorID(email string) string {
	sum := sha256.Sum256([]byte("mesh-operator-v1\n" + strings.ToLower(strings.TrimSpace(email))))
	return "op_" + hex.EncodeToString(sum[:16])
}
