package commerce

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
)

// The commerce records live on the bus, where the seller's node is
// answered at admission (DESIGN §11): one bucket, keyed by prefix (a prefix
// costs no stream, DESIGN §5). The agreements service writes the
// agreements and the volume counters; the control plane's engagement
// service mirrors the terms of every engagement into it; the clearing
// service keeps the credit balances and settlements in the same bucket.
//
//	agr.<seller>.<consumer owner>.<sku>   a filed agreement (AgreementRecord)
//	eng.<seller>.<client>.<offering>      an engagement's terms (EngagementTerms)
//	engs.<seller>.<client>                the scopes graded enforced ([]EngagementTerms)
//	vol.<seller>.<client>.<window>        a volume counter (compare-and-set)
//	bal.<owner>                           a credit balance (clearing)
//	set.<task or request id>              a settlement, once (clearing)
//	agg.<owner>.<seller>.<digest>.<period> a period's rated usage (clearing)
//	led.<owner>.<ms>-<role>-<settlement>  a credit history row (clearing)
const Bucket = "mesh_commerce"

// Key prefixes of Bucket.
const (
	AgreementPrefix  = "agr."
	EngagementPrefix = "eng."
	VolumePrefix     = "vol."
	BalancePrefix    = "bal."
	SettlementPrefix = "set."
)

// BucketConfig is Bucket's configuration at replicas: the workers', and the
// control plane's when its mirror writes before any worker made the bucket.
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "agreements (agr.<seller>.<owner>.<sku>), engagement terms (eng.<seller>.<client>.<offering>), volume counters (vol.), credit balances (bal.<owner>) and settlements (set.<id>)",
		History:     1, Replicas: bus.Replicas(replicas)}
}

// AgreementKey is where the agreement of owner to seller's sku is kept:
// one per (seller, owner, sku), a newer filing replacing an older one.
func AgreementKey(seller, owner, sku string) string {
	return AgreementPrefix + seller + "." + owner + "." + sku
}

// EngagementKey is where the terms of the engagement between client and
// seller for offering are mirrored (one key per offering in scope).
func EngagementKey(seller, client, offering string) string {
	return EngagementPrefix + seller + "." + client + "." + offering
}

// EngagementScopePrefix begins EngagementScopeKey; it is not
// EngagementPrefix followed by anything, so its keys never read as an
// offering's.
const EngagementScopePrefix = "engs."

// EngagementScopeKey is where the engagements between client and seller
// that grade scope enforced are mirrored, a JSON array of EngagementTerms
// (one per engagement): while one is in force, the seller's node refuses
// the client's request naming an offering none of them lists (Agent SoW
// §5.2).
func EngagementScopeKey(seller, client string) string {
	return EngagementScopePrefix + seller + "." + client
}

// AgreementRecord is the value under AgreementKey: the agreement as the
// owner signed it (the exact bytes received) and, once revoked, when. A
// revocation removes future authority only: usage rated under the
// agreement before RevokedAt stays rated.
type AgreementRecord struct {
	Agreement json.RawMessage `json:"agreement"`
	FiledAt   time.Time       `json:"filed_at"`
	RevokedAt *time.Time      `json:"revoked_at,omitempty"`
}

// EngagementTerms is the value under EngagementKey: what the seller's node
// needs at admission from an engagement the control plane holds (the
// document itself stays there, as the exact bytes the owners signed). The
// engagement service writes it at formation, on every approved amendment
// and on termination; the agreements service only reads it.
type EngagementTerms struct {
	SowID   string `json:"sow_id"`
	Version int    `json:"version"`
	// Seller and Client are the provider's and the client's agent keys;
	// the owners are the keys that signed the seats.
	Seller      string     `json:"seller"`
	Client      string     `json:"client"`
	SellerOwner string     `json:"seller_owner"`
	ClientOwner string     `json:"client_owner"`
	Offerings   []string   `json:"offerings"`
	StartsAt    time.Time  `json:"starts_at"`
	EndsAt      *time.Time `json:"ends_at,omitempty"`
	// EffectiveUntil is when a termination takes effect: the instant it was
	// recorded for cause, the end of the notice for convenience. Unset
	// while the engagement is not terminated.
	EffectiveUntil *time.Time `json:"effective_until,omitempty"`
	ForCause       bool       `json:"for_cause,omitempty"`
	// Exhausted is set once the price clause's cap is spent.
	Exhausted bool `json:"exhausted,omitempty"`
	// Volume is the volume clause (nil: none, the seller's general
	// admission applies).
	Volume *Volume `json:"volume,omitempty"`
	// Price is the price clause as signed.
	Price json.RawMessage `json:"price,omitempty"`
}

// Balance is the value under BalancePrefix+<owner key>: the owner's credits
// in micro-credits (currency XCR), written by the clearing service with a
// compare-and-set; the agreements service reads it at admission to refuse
// with INSUFFICIENT_FUNDS before work the balance cannot pay for.
type Balance struct {
	Credits   int64     `json:"credits"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Credits is the currency of the mesh's own clearing: private-use ISO 4217
// X-code XCR, 1,000,000 micro-credits to the credit. Credits are spent
// inside the mesh only: no withdrawal, payout or settlement to money.
const Credits = "XCR"

// Volume is an engagement's volume clause: requests per clock hour and per
// UTC day (0: no limit on that window).
type Volume struct {
	PerHour int64 `json:"per_hour,omitempty"`
	PerDay  int64 `json:"per_day,omitempty"`
}

// InForce reports whether the engagement admits work at now: started, not
// lapsed, not terminated to effect, not exhausted. Lapse, exhaustion and
// termination are identical at the gate (Agent SoW §7.1): the client falls
// back to general admission.
func (t EngagementTerms) InForce(now time.Time) bool {
	switch {
	case t.Exhausted, now.Before(t.StartsAt):
		return false
	case t.EndsAt != nil && !now.Before(*t.EndsAt):
		return false
	case t.EffectiveUntil != nil && !now.Before(*t.EffectiveUntil):
		return false
	}
	return true
}
