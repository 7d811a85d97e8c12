// Package engagement is the engagement service (spec §2.12, §4.4; Agent
// SoW, digested in spec/agent-sow-facts.md; docs/engagements.md): standing
// proposals, two-step formation, amendments, termination and reviews,
// kept in the control plane's store as the exact bytes the owners signed,
// and the terms of every formed engagement mirrored onto the bus
// (commerce.EngagementKey in commerce.Bucket) where the seller's node
// reads them at admission.
//
// An engagement is identified by (client agent, seller agent, offering):
// its record is reachable under every offering in its scope. Owners sign,
// agents work: a seat's signature must be by its agent's owner key as the
// registry records it (the attested owner, else the node's key).
package engagement

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// Collections of the store.
const (
	CollOffers  = "engagement_offers"  // id: <provider agent>.<sow id>: a standing proposal
	CollRecords = "engagements"        // id: <client>.<seller>.<sow id>: an engagement
	CollIndex   = "engagement_index"   // id: <client>.<seller>.<offering> → the engagement
	CollEvents  = "engagement_events"  // id: <record id>.<seq>: its history
	CollReviews = "engagement_reviews" // id: <record id>.<digest of the review's sig>
	// CollReviewOrder numbers the reviews: id <record id>.<n> → the digest.
	CollReviewOrder = "engagement_review_order"
)

// Bounds of one engagement's record. What either party can repeat at will
// is bounded: amendment proposals (each answered at most once: approved,
// denied, withdrawn or lapsed), countersigns of the instance (requests to
// form) and their withdrawals, and reviews; beyond, QUOTA_EXCEEDED. What
// must always be recordable is never refused: the formation, a
// termination, a lapse. So the history holds at most 2*MaxRequests +
// 2*MaxProposals + 3 entries, and the public read pages through it.
const (
	MaxProposals = 200
	MaxRequests  = 20
	MaxReviews   = 1000
)

// MaxSkew is how far a signed act's at may be from the service's clock.
const MaxSkew = 15 * time.Minute

// Event kinds of an engagement's history.
const (
	EventRequested  = "formation_requested" // the client's countersign
	EventRequestOff = "formation_request_withdrawn"
	EventFormed     = "formed" // the provider's instance signature
	EventProposed   = "amendment_proposed"
	EventApproved   = "amendment_approved"
	EventDenied     = "amendment_denied"
	EventWithdrawn  = "amendment_withdrawn"
	EventLapsed     = "amendment_lapsed"
	EventTerminated = "terminated"
)

// Offer is a standing proposal as filed.
type Offer struct {
	Provider string `json:"provider"`
	SowID    string `json:"sow_id"`
	Document []byte `json:"document"` // exact bytes
	FiledAt  string `json:"filed_at"`
	Directed bool   `json:"directed"`
	// SpentBy is the record a directed proposal was spent on.
	SpentBy string `json:"spent_by,omitempty"`
	// Withdrawn is the signed withdrawal, kept (the offer is archived,
	// not deleted); WithdrawnAt when it was recorded.
	Withdrawn   []byte `json:"withdrawn,omitempty"`
	WithdrawnAt string `json:"withdrawn_at,omitempty"`
}

// Record is one engagement.
type Record struct {
	ID          string   `json:"id"`
	Client      string   `json:"client"`
	Seller      string   `json:"seller"`
	SowID       string   `json:"sow_id"`
	ClientOwner string   `json:"client_owner"`
	SellerOwner string   `json:"seller_owner"`
	Offerings   []string `json:"offerings"`
	// Retired are offerings an approved amendment took out of scope: their
	// mirrored terms are removed.
	Retired []string `json:"retired,omitempty"`
	// Requested is the completed instance the client countersigned,
	// awaiting the provider's instance signature; nil once formed.
	Requested   []byte   `json:"requested,omitempty"`
	Asserted    []string `json:"asserted,omitempty"`
	RequestedAt string   `json:"requested_at"`
	// RequestWithdrawnAt is set when the client withdrew its request to
	// form (nothing forms from it); Requests counts the countersigns.
	RequestWithdrawnAt string `json:"request_withdrawn_at,omitempty"`
	Requests           int    `json:"requests,omitempty"`
	// Document is the governing version, fully signed (exact bytes); nil
	// until formed.
	Document []byte `json:"document,omitempty"`
	Version  int64  `json:"version"`
	FormedAt string `json:"formed_at,omitempty"`
	// Open is the one open amendment proposal.
	Open *Amendment `json:"open,omitempty"`
	// Proposals counts the amendment proposals; Resolved holds the digests
	// of the denials and withdrawals recorded (a signed act answers once).
	Proposals   int               `json:"proposals,omitempty"`
	Resolved    []string          `json:"resolved,omitempty"`
	Termination *TerminationEntry `json:"termination,omitempty"`
	Seq         int               `json:"seq"`
	// ReviewCount is how many reviews are stored.
	ReviewCount int `json:"review_count"`
	// MirrorPending is set when a change is recorded and cleared once its
	// terms are on the bus (the mirror job retries it).
	MirrorPending bool   `json:"mirror_pending"`
	UpdatedAt     string `json:"updated_at"`
}

// Formed reports whether both seats signed an instance.
func (r *Record) Formed() bool { return r.Document != nil }

// Amendment is an open proposal: version+1 with the proposer's signature.
type Amendment struct {
	Version    int64  `json:"version"`
	Document   []byte `json:"document"`
	Role       string `json:"role"`
	Key        string `json:"key"`
	ProposedAt string `json:"proposed_at"`
	LapsesAt   string `json:"lapses_at"`
}

// TerminationEntry is the termination block.
type TerminationEntry struct {
	Notice     []byte `json:"notice"` // the signed notice, exact bytes
	Role       string `json:"role"`
	By         string `json:"by"`
	ForCause   bool   `json:"for_cause"`
	Reason     string `json:"reason,omitempty"`
	SignedAt   string `json:"signed_at"`
	RecordedAt string `json:"recorded_at"`
	// EffectiveAt is when it takes effect: at once for cause, after the
	// convenience notice otherwise.
	EffectiveAt string `json:"effective_at"`
}

// Event is one entry of an engagement's history.
type Event struct {
	Record  string `json:"record"`
	Seq     int    `json:"seq"`
	Kind    string `json:"kind"`
	At      string `json:"at"`
	Version int64  `json:"version,omitempty"`
	Role    string `json:"role,omitempty"`
	Key     string `json:"key,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Signed is what was signed for the event (a document version or a
	// signed act), exact bytes.
	Signed []byte `json:"signed,omitempty"`
}

// StoredReview is a review as kept.
type StoredReview struct {
	Record   string `json:"record"`
	Digest   string `json:"digest"`
	Review   []byte `json:"review"` // exact bytes
	Verdict  string `json:"verdict"`
	Reason   string `json:"reason,omitempty"`
	TaskID   string `json:"task_id,omitempty"`
	SignedAt string `json:"signed_at"`
	StoredAt string `json:"stored_at"`
	// Seq is its number in the record's order (1 on).
	Seq int `json:"seq,omitempty"`
}

// reviewOrder is the value under CollReviewOrder.
type reviewOrder struct {
	Digest string `json:"digest"`
}

func reviewOrderID(record string, n int) string { return fmt.Sprintf("%s.%08d", record, n) }

// AccountOf answers whether an agent is attached to a live account on this
// platform (the platform_account qualification); nil: never established.
type AccountOf func(ctx context.Context, agent string) (bool, error)

// Config builds a Service.
type Config struct {
	Store store.Store
	// Directory reads the registry; nil: nothing forms (no owner can be
	// established) and every route that needs it answers 501.
	Directory Directory
	// Terms is the bus mirror; nil records MirrorPending and never clears
	// it.
	Terms Terms
	// Accounts answers platform_account; nil reads the store's agents.
	Accounts AccountOf
	Now      func() time.Time
	Log      *slog.Logger
}

// Service is the engagement service.
type Service struct {
	cfg Config
	now func() time.Time
	log *slog.Logger
}

// New returns the service.
func New(cfg Config) *Service {
	s := &Service{cfg: cfg, now: cfg.Now, log: cfg.Log}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// stampFormat is RFC 3339 with fixed-width nanoseconds, so stamps sort as
// strings (the store orders reviews by them).
const stampFormat = "2006-01-02T15:04:05.000000000Z07:00"

func stamp(t time.Time) string { return t.UTC().Format(stampFormat) }

func parseStamp(s string) time.Time {
	t, _ := protocol.ParseTime(s)
	return t
}

// digest is the hex SHA-256 of exact bytes: what a signed act names to
// bind itself to the document it answers.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func offerID(provider, sowID string) string { return provider + "." + sowID }

// RecordID is the store id of the engagement between client and seller
// under document sowID.
func RecordID(client, seller, sowID string) string { return client + "." + seller + "." + sowID }

// IndexID is the store id under which (client, seller, offering) finds
// its engagement.
func IndexID(client, seller, offering string) string { return client + "." + seller + "." + offering }

type indexEntry struct {
	Record string `json:"record"`
}

func eventID(record string, seq int) string { return fmt.Sprintf("%s.%08d", record, seq) }

// storeErr turns a store failure into the answer a caller can act on.
func storeErr(err error) error {
	var e *errs.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, store.ErrContention) {
		return errs.Wrap(errs.Conflict, "the engagement changed while this was recorded; send it again", err)
	}
	var ide *store.IDError
	if errors.As(err, &ide) {
		return errs.New(errs.InvalidRequest, ide.InputError())
	}
	return errs.OrUnavailable(err, "the engagement records could not be reached; retry shortly")
}

func (s *Service) directory() (Directory, error) {
	if s.cfg.Directory == nil {
		return nil, errs.New(errs.NotImplemented, "engagements need the registry, which this instance cannot reach")
	}
	return s.cfg.Directory, nil
}

// ownerOf reads agent's registration and owner key.
func (s *Service) ownerOf(ctx context.Context, agent, seat string) (AgentInfo, error) {
	dir, err := s.directory()
	if err != nil {
		return AgentInfo{}, err
	}
	info, err := dir.Agent(ctx, agent, s.now())
	if err != nil {
		return AgentInfo{}, errs.OrUnavailable(err, "the registry could not be read; retry shortly")
	}
	if !info.Registered {
		return AgentInfo{}, errs.Newf(errs.Forbidden, "the %s agent %s is not registered on this mesh, so its owner, who signs for its seat, cannot be established; register it and send this again", seat, agent)
	}
	if info.Owner == "" {
		return AgentInfo{}, errs.Newf(errs.Forbidden, "the %s agent %s has no owner (a guest, an agent that is its own node, or one whose owner attestation has expired), so nobody can sign for its seat; register it with its owner's attestation and send this again", seat, agent)
	}
	return info, nil
}

// parse reads a document and verifies every signature it carries.
func parse(raw []byte) (*sow.Document, error) {
	if len(raw) == 0 {
		return nil, errs.New(errs.InvalidRequest, "document is required: the engagement document exactly as signed")
	}
	d, err := sow.Parse(raw)
	if err != nil {
		return nil, err
	}
	if err := d.VerifySignatures(); err != nil {
		return nil, err
	}
	return d, nil
}

// terms derives the mirrored terms of a formed record for offering.
func (r *Record) terms() (*commerce.EngagementTerms, error) {
	d, err := sow.Parse(r.Document)
	if err != nil {
		return nil, err
	}
	t := &commerce.EngagementTerms{SowID: d.ID, Version: int(d.Version), Seller: r.Seller, Client: r.Client,
		SellerOwner: r.SellerOwner, ClientOwner: r.ClientOwner, Offerings: slices.Clone(d.Scope.Offerings),
		StartsAt: parseStamp(d.StartsAt)}
	if d.EndsAt != "" {
		end := parseStamp(d.EndsAt)
		t.EndsAt = &end
	}
	if r.Termination != nil {
		eff := parseStamp(r.Termination.EffectiveAt)
		t.EffectiveUntil, t.ForCause = &eff, r.Termination.ForCause
	}
	if v := d.Volume; v != nil && v.Grade == sow.Enforced {
		t.Volume = &commerce.Volume{PerHour: v.PerHour, PerDay: v.PerDay}
	}
	if p, ok := d.Value["price"]; ok {
		if b, err := protocol.Canonical(p); err == nil {
			t.Price = b
		}
	}
	return t, nil
}
