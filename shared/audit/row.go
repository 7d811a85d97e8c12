// Package audit keeps the operator records of spec §2.11: one hash chain of
// audit rows per agent, a daily anchor that reduces every chain head to one
// RFC 6962 Merkle root whose document is timestamped by RFC 3161
// authorities, and a signed export bundle that verifies offline.
//
// The package is split by concern: rows and their hashes (row.go), the
// chains on the bus (chain.go), the Merkle tree over chain heads
// (merkle.go), anchor documents and the daily job (anchor.go,
// anchorstore.go), RFC 3161 tokens (timestamp.go), and the export bundle
// with its offline verifier (bundle.go, export.go, verify.go). The formats
// are described in docs/audit.md.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// RowVersion is the version of the row format, its v member.
const RowVersion = 1

// rowTag is prefixed to a row's canonical JSON before hashing, so a row hash
// can never be mistaken for the hash of another object of the system.
const rowTag = "mesh-audit-row-v1\n"

// GenesisPrev is the prev of the first row of every chain: 64 zeros.
var GenesisPrev = strings.Repeat("0", 64)

// Roles of the chain owner in the row.
const (
	// RoleRequester: the chain's agent sent the request; peer answered it.
	RoleRequester = "requester"
	// RoleResponder: the chain's agent answered the request of peer.
	RoleResponder = "responder"
	// RoleAccount: an action of the owning account on the agent (a
	// credential minted or revoked, a grant used); peer is the account or
	// credential that acted and offering names the action.
	RoleAccount = "account"
)

// Row is one audit record of an agent's chain. It never carries the input
// itself, only its SHA-256. Its JSON is the wire and storage form; the hash
// of a row is SHA-256("mesh-audit-row-v1\n" + JCS(row)).
type Row struct {
	V     int    `json:"v"`
	Agent string `json:"agent"`
	// Seq is the row's position in its chain, from 1.
	Seq int64 `json:"seq"`
	// At is when the request was answered (RFC 3339 UTC, milliseconds).
	At          string `json:"at"`
	Role        string `json:"role"`
	Peer        string `json:"peer"`
	Offering    string `json:"offering"`
	TaskID      string `json:"task_id,omitempty"`
	RequestID   string `json:"request_id"`
	Outcome     string `json:"outcome"`
	DurationMS  int64  `json:"duration_ms"`
	InputSHA256 string `json:"input_sha256"`
	// Prev is the hash of the previous row, GenesisPrev for the first.
	Prev string `json:"prev"`
}

// Entry is what a caller records: one answered request (or account
// action) of one agent. Append fills in the chain members.
type Entry struct {
	Agent     string
	Role      string
	Peer      string
	Offering  string
	TaskID    string
	RequestID string
	Outcome   string
	Duration  time.Duration
	// InputSHA256 is the SHA-256 of the request's input (InputDigest),
	// or "" when whoever reported the request did not say (a runtime that
	// does not state it: docs/audit.md "Where rows come from").
	InputSHA256 string
	// At is when it happened; the appender's clock when zero.
	At time.Time
	// Key, when set, names the event the entry records, so that it is
	// recorded once: within the stream's duplicate window (DedupWindow) a
	// second Append of an entry with the same agent and key stores
	// nothing and returns the row the first stored, with ErrDuplicate.
	// Writers that may see one event twice (a republished answer, two
	// copies racing) set it; it is not part of the row.
	Key string
}

// InputDigest is the input_sha256 of an input: lowercase hex SHA-256.
func InputDigest(input []byte) string {
	sum := sha256.Sum256(input)
	return hex.EncodeToString(sum[:])
}

// Field limits of a row.
const (
	maxIDLen      = 128
	maxOfferLen   = 256
	maxOutcomeLen = 64
)

// ErrInvalidEntry is wrapped by every refusal of an entry.
var ErrInvalidEntry = errors.New("audit: invalid entry")

// Check validates an entry before it is made a row.
func (e *Entry) Check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidEntry, fmt.Sprintf(format, args...))
	}
	switch {
	case !keys.IsUserPublicKey(e.Agent):
		return bad("agent must be an agent key")
	case e.Role != RoleRequester && e.Role != RoleResponder && e.Role != RoleAccount:
		return bad("role must be %s, %s or %s", RoleRequester, RoleResponder, RoleAccount)
	case !printable(e.Peer, maxIDLen) || e.Peer == "":
		return bad("peer must be 1 to %d printable characters", maxIDLen)
	case !printable(e.Offering, maxOfferLen):
		return bad("offering must be at most %d printable characters", maxOfferLen)
	case !printable(e.TaskID, maxIDLen):
		return bad("task_id must be at most %d printable characters", maxIDLen)
	case !printable(e.RequestID, maxIDLen) || e.RequestID == "":
		return bad("request_id must be 1 to %d printable characters", maxIDLen)
	case !printable(e.Outcome, maxOutcomeLen) || e.Outcome == "":
		return bad("outcome must be 1 to %d printable characters", maxOutcomeLen)
	case e.Duration < 0:
		return bad("duration must not be negative")
	case e.InputSHA256 != "" && !IsHash(e.InputSHA256):
		return bad("input_sha256 must be 64 lowercase hex characters, or empty when unknown")
	case !printable(e.Key, maxIDLen*3):
		return bad("key must be at most %d printable characters", maxIDLen*3)
	}
	return nil
}

// printable reports whether s is valid UTF-8 of at most n bytes without
// control characters.
func printable(s string, n int) bool {
	if len(s) > n || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// IsHash reports whether s is a SHA-256 in the form the audit formats use:
// 64 lowercase hex characters.
func IsHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// row makes the row that follows prev (nil: the first of the chain).
func (e *Entry) row(prev *Head, at time.Time) Row {
	r := Row{V: RowVersion, Agent: e.Agent, Seq: 1, At: protocol.FormatTime(at), Role: e.Role, Peer: e.Peer,
		Offering: e.Offering, TaskID: e.TaskID, RequestID: e.RequestID, Outcome: e.Outcome,
		DurationMS: e.Duration.Milliseconds(), InputSHA256: e.InputSHA256, Prev: GenesisPrev}
	if prev != nil {
		r.Seq, r.Prev = prev.Seq+1, prev.Hash
	}
	return r
}

// Canonical is the row's canonical JSON (JCS), the bytes stored and hashed.
func (r *Row) Canonical() ([]byte, error) {
	b, err := protocol.Canonical(r)
	if err != nil {
		return nil, fmt.Errorf("audit: row %s/%d: %w", r.Agent, r.Seq, err)
	}
	return b, nil
}

// Hash is the row's hash: hex SHA-256("mesh-audit-row-v1\n" + JCS(row)).
func (r *Row) Hash() (string, error) {
	b, err := r.Canonical()
	if err != nil {
		return "", err
	}
	return hashCanonicalRow(b), nil
}

// hashCanonicalRow hashes a row's canonical JSON.
func hashCanonicalRow(canonical []byte) string {
	h := sha256.New()
	h.Write([]byte(rowTag))
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// DecodeRow reads one row from its JSON, refusing members the format does
// not have: a row's hash is computed over exactly what it shows.
func DecodeRow(data []byte) (Row, error) {
	var r Row
	if err := strictUnmarshal(data, &r); err != nil {
		return Row{}, fmt.Errorf("audit: row: %w", err)
	}
	return r, nil
}

// Head is the last row of a chain as the anchors see it: the agent, the
// row's seq and its hash.
type Head struct {
	Agent string `json:"agent"`
	Seq   int64  `json:"seq"`
	Hash  string `json:"hash"`
}

// strictUnmarshal is json.Unmarshal that refuses unknown members and
// trailing data.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
