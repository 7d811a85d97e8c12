// Package credential issues every NATS credential of the control plane
// except the guest's: the connection credential an am_ key is exchanged for
// (bootstrap), node credentials minted and renewed by proof of key
// possession, narrow job credentials, and app credentials; and it takes them
// away again: retiring an agent or disabling an account tombstones it in the
// store and revokes its credentials at the broker.
package credential

import (
	"context"
	"time"
)

// Collections this package owns.
const (
	CollAgents     = "agents"      // id: agent public key
	CollTombstones = "tombstones"  // id: agent public key
	CollHosts      = "agent_hosts" // id: agent public key → credential keys that carried it
	CollMints      = "mints"       // every credential minted
	CollApps       = "apps"
	// CollRevocations records every credential key revoked at the broker
	// and when, to the second the broker was told: a credential minted
	// later for the same key must be issued after it.
	CollRevocations = "revocations"
	// CollRateLimits holds the counters of the unowned-mint limits (see
	// shared/ratelimit).
	CollRateLimits = "credential_rate_limits"
)

// Lifetimes and limits (spec §2.9, §8; upstream-notes §13).
const (
	DefaultCredentialTTL = 30 * 24 * time.Hour
	MaxRoster            = 16
	TimestampSkew        = 600 * time.Second
	DefaultJobTTL        = 10 * time.Minute
	MaxJobTTL            = 15 * time.Minute
	MinJobTTL            = time.Minute
	MaxAppsPerAccount    = 10
	maxHostKeys          = 32 // credential keys remembered per agent for revocation
)

// Agent is an agent bound to an account by an am_ key exchange.
type Agent struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Label     string `json:"label"`
	Handle    string `json:"handle,omitempty"`
	CreatedAt int64  `json:"created_at"`
	Enabled   bool   `json:"enabled"`
}

// Tombstone records why an agent may no longer hold a credential. It lifts
// when the key reappears under a live account (a new exchange).
type Tombstone struct {
	AgentID   string `json:"agent_id"`
	AccountID string `json:"account_id,omitempty"`
	Reason    string `json:"reason"`
	At        int64  `json:"at"`
}

// hosts remembers which credential keys carried an agent, so retiring it
// can revoke them at the broker.
type hosts struct {
	AgentID string   `json:"agent_id"`
	Keys    []string `json:"keys"`
	// owner is the account that owns the agent, as standing read it (not
	// stored).
	owner string
}

// Mint is the record every minted credential leaves (spec §4.6: "every
// mint is recorded, with or without expiry").
type Mint struct {
	ID        string   `json:"id"`
	Kind      string   `json:"kind"` // bootstrap, node, job, app
	Key       string   `json:"key"`  // the credential's public key (its JWT subject)
	Agents    []string `json:"agents,omitempty"`
	AccountID string   `json:"account_id,omitempty"`
	TaskID    string   `json:"task_id,omitempty"`
	IssuedAt  int64    `json:"issued_at"`
	ExpiresAt int64    `json:"expires_at,omitempty"` // 0: no expiry
}

// App is an account's durable app credential.
type App struct {
	ID        string `json:"id"`
	AccountID string `json:"account_id"`
	Name      string `json:"name"`
	Key       string `json:"key"`
	CreatedAt int64  `json:"created_at"`
	RevokedAt int64  `json:"revoked_at,omitempty"`
}

// MeshInfo is the `mesh` block of every credential-issuing answer.
type MeshInfo struct {
	Name     string   `json:"name"`
	Protocol string   `json:"protocol"`
	TCP      []string `json:"-"`
	WS       []string `json:"-"`
}

// Revoker takes credential keys away at the broker at once, without a
// restart (DESIGN §4): meshd pushes an account JWT update; the cloud does
// the same against the managed cluster. at is the revocation instant the
// store recorded; the broker must be given the same one.
type Revoker interface {
	Revoke(ctx context.Context, credentialKeys []string, at time.Time) error
}

// revocation is one key's latest revocation.
type revocation struct {
	Key string `json:"key"`
	At  int64  `json:"at"` // Unix ms
	// Until is when every credential the revocation covers (issued up to
	// At) has expired, Unix ms; 0 when one never expires or the store
	// does not know them all. Until then the revocation protects
	// something; after it, the sweep may forget it.
	Until int64 `json:"until,omitempty"`
}
