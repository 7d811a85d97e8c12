package commerce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
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
//	tkt.<seller>.<request id>             an admission ticket, once (agreements; consumed by the clearing)
//	set.<seller>.<request id>             a settlement, once (clearing)
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
	TicketPrefix     = "tkt."
)

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// KeyToken is id as a KV key token: itself when it is one ([A-Za-z0-9_-],
// the shape of this mesh's ids), else "h-" and its SHA-256, so an id of
// another sender's choosing never breaks, or escapes, its key.
func KeyToken(id string) string {
	if tokenRE.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "h-" + hex.EncodeToString(sum[:])
}

// TicketKey is where the admission ticket of seller's request id is kept.
// The request id is the requester's choice and unique only per requester
// at one seller: a second requester with the same id at the same seller
// is refused at admission (it would share the ticket).
func TicketKey(seller, requestID string) string {
	return TicketPrefix + seller + "." + KeyToken(requestID)
}

// SettlementKey is the key of the settlement of seller's answer to
// request id: per seller, so one request id reused at several sellers is
// several sales.
func SettlementKey(seller, requestID string) string {
	return SettlementPrefix + seller + "." + KeyToken(requestID)
}

// BucketConfig is Bucket's configuration at replicas: the workers', and the
// control plane's when its mirror writes before any worker made the bucket.
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "agreements (agr.<seller>.<owner>.<sku>), engagement terms (eng.<seller>.<client>.<offering>), volume counters (vol.), admission tickets (tkt.<seller>.<request>), credit balances (bal.<owner>) and settlements (set.<seller>.<request>)",
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
//
// Unpaid is what earlier sales could not take from the balance (the
// balance never goes below zero): admission refuses the owner with
// INSUFFICIENT_FUNDS while it is above zero, and the next credits paid
// into the balance (a grant) pay it off first.
type Balance struct {
	Credits   int64     `json:"credits"`
	Unpaid    int64     `json:"unpaid_micro,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Ticket is the value under TicketKey: the agreements service's record
// that it admitted one request to an offering covered by a paid internal
// SKU in credits under a covering agreement, written once at admission
// (the services key alone writes the bucket). The clearing charges only
// against a ticket, and takes from it everything but the answer's usage:
// who pays, on which terms, at what time. It is consumed when the
// settlement is recorded.
type Ticket struct {
	Seller        string `json:"seller"`
	SellerOwner   string `json:"seller_owner"`
	Requester     string `json:"requester"`
	ConsumerOwner string `json:"consumer_owner"`
	Offering      string `json:"offering"`
	RequestID     string `json:"request_id"`
	SKU           string `json:"sku"`
	SKUDigest     string `json:"sku_digest"`
	// Price is the SKU's price as published at SKUDigest: the sale is
	// rated on it, whatever the seller publishes by the time it answers.
	Price json.RawMessage `json:"price"`
	// Agreement is the key of the covering agreement (AgreementKey).
	Agreement string `json:"agreement"`
	// AdmittedAt is the agreements service's clock at admission: the
	// sale's time (its rating period), never a time inside an id either
	// party chose.
	AdmittedAt time.Time `json:"admitted_at"`
	// CeilingMicro is the request's budget cost ceiling in credits, when
	// it carried one: the charge is clamped to it.
	CeilingMicro *int64 `json:"ceiling_micro,omitempty"`
	// RetailMicro is the retail unit price quoted at admission
	// (price_credits); Resale and MarkupPct the path it was quoted on.
	RetailMicro int64 `json:"retail_micro"`
	Resale      bool  `json:"resale,omitempty"`
	MarkupPct   int   `json:"markup_pct"`
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
