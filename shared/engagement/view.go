package engagement

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// View is the public engagement record (spec §2.12): the document as
// signed, its state, its amendment history with denials and their
// reasons, lapses and withdrawals, the termination block and the reviews.
// Signed bytes are given as strings holding them exactly.
type View struct {
	Client   string `json:"client"`
	Seller   string `json:"seller"`
	Offering string `json:"offering"`
	SowID    string `json:"sow_id"`
	// State is the §7.1 state at the time of reading: standing_proposal
	// while the instance awaits the provider's signature, then agreed,
	// active, amendment_proposed, amended, lapsed or terminated.
	State   string `json:"state"`
	InForce bool   `json:"in_force"`
	Version int64  `json:"version"`
	// Document is the governing version exactly as signed ("" before
	// formation); Requested the client's countersign awaiting the
	// provider's instance signature.
	Document       string    `json:"document,omitempty"`
	DocumentSHA256 string    `json:"document_sha256,omitempty"`
	Requested      string    `json:"requested,omitempty"`
	Offerings      []string  `json:"offerings"`
	StartsAt       string    `json:"starts_at,omitempty"`
	EndsAt         string    `json:"ends_at,omitempty"`
	FormedAt       string    `json:"formed_at,omitempty"`
	Owners         Owners    `json:"owners"`
	Clauses        []Clause  `json:"clauses"`
	Open           *OpenView `json:"open_amendment,omitempty"`
	// Amendments are the amendment events of this page of the history.
	Amendments []HistoryItem `json:"amendments"`
	// History is one page of the record's events, oldest first: entries
	// HistoryAfter+1 on, at most the page's limit of HistoryTotal;
	// HistoryNext is the after of the next page (0: none).
	History      []HistoryItem `json:"history"`
	HistoryTotal int           `json:"history_total"`
	HistoryNext  int           `json:"history_next,omitempty"`
	Termination  *TermView     `json:"termination,omitempty"`
	// Reviews is one page of the reviews, in the order stored.
	Reviews       []ReviewView `json:"reviews"`
	ReviewsTotal  int          `json:"reviews_total"`
	ReviewsNext   int          `json:"reviews_next,omitempty"`
	MirrorPending bool         `json:"mirror_pending"`
	// Language says whether this renderer knows the document's standard
	// language version (§4.3); it knows none, so it shows the signed
	// fields verbatim.
	Language string `json:"language_note,omitempty"`
}

// Owners are the keys that signed the seats.
type Owners struct {
	Provider string `json:"provider"`
	Client   string `json:"client"`
}

// Clause is one graded part of the document as rendered: its path, its
// grade as signed, and its value as signed (canonical JSON).
type Clause struct {
	Path  string `json:"path"`
	Grade string `json:"grade"`
	Value string `json:"value"`
}

// OpenView is the open amendment proposal.
type OpenView struct {
	Version    int64  `json:"version"`
	Proposer   string `json:"proposer"`
	ProposedAt string `json:"proposed_at"`
	LapsesAt   string `json:"lapses_at"`
	Document   string `json:"document"`
}

// HistoryItem is one event of the record. A signed act (a denial, a
// withdrawal, a termination notice: at most MaxActBytes) is given as
// signed; a document version (up to sow.MaxDocumentBytes) by its SHA-256
// and Link, where the event answers with its exact bytes.
type HistoryItem struct {
	Seq          int    `json:"seq"`
	Kind         string `json:"kind"`
	At           string `json:"at"`
	Version      int64  `json:"version,omitempty"`
	Role         string `json:"role,omitempty"`
	Key          string `json:"key,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Signed       string `json:"signed,omitempty"`
	SignedSHA256 string `json:"signed_sha256,omitempty"`
	Link         string `json:"link,omitempty"`
}

// documentEvent reports whether an event of kind signed a document (its
// bytes are given by link, not inline).
func documentEvent(kind string) bool {
	switch kind {
	case EventRequested, EventFormed, EventProposed, EventApproved:
		return true
	}
	return false
}

// The states of a record before formation (this service's, beside §7.1's:
// §7.1 names no state for a countersign awaiting the provider).
const (
	StateRequested        = "formation_requested"
	StateRequestLapsed    = "formation_request_lapsed"
	StateRequestWithdrawn = "formation_request_withdrawn"
)

// Page selects a page of a record's history and reviews: the entries after
// the given sequence numbers, at most the limits (0: DefaultPage; above
// MaxPage: MaxPage).
type Page struct {
	HistoryAfter, HistoryLimit int
	ReviewsAfter, ReviewsLimit int
}

// Bounds of a page of the public record.
const (
	DefaultPage = 50
	MaxPage     = 200
)

func pageLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultPage
	case n > MaxPage:
		return MaxPage
	}
	return n
}

// RecordPath is the public record's path.
func RecordPath(client, seller, offering string) string {
	return "/v1/engagements/" + client + "/" + seller + "/" + offering
}

// TermView is the termination block.
type TermView struct {
	ForCause    bool   `json:"for_cause"`
	Reason      string `json:"reason,omitempty"`
	By          string `json:"by"`
	Role        string `json:"role"`
	SignedAt    string `json:"signed_at"`
	RecordedAt  string `json:"recorded_at"`
	EffectiveAt string `json:"effective_at"`
	// InNotice: terminated for convenience, the notice still running, the
	// engagement still in force.
	InNotice bool   `json:"in_notice"`
	Notice   string `json:"notice"`
}

// ReviewView is one review.
type ReviewView struct {
	Verdict  string `json:"verdict"`
	Reason   string `json:"reason,omitempty"`
	TaskID   string `json:"task_id,omitempty"`
	SignedAt string `json:"signed_at"`
	StoredAt string `json:"stored_at"`
	Digest   string `json:"digest"`
	Review   string `json:"review"`
}

// clauseOrder is the order clauses are rendered in.
var clauseOrder = []string{"parties", "scope", "inputs", "deliverables", "price", "volume", "change_control", "termination",
	"disputes", "confidentiality", "reporting", "qualifications", "liability", "service_floors", "subcontracting"}

// Clauses lists every graded part of d in rendering order, each with the
// grade it was signed with: a renderer shows the grade wherever it shows
// the clause (§3). Inputs carry no grade of their own and are enforced by
// definition (§5.3); a split clause shows each sub-clause's own grade.
func Clauses(d *sow.Document) []Clause {
	var out []Clause
	add := func(path string, v any) {
		grade := ""
		if m, ok := v.(map[string]any); ok {
			grade, _ = m["grade"].(string)
		}
		out = append(out, Clause{Path: path, Grade: grade, Value: indent(v)})
	}
	for _, name := range clauseOrder {
		v, ok := d.Value[name]
		if !ok || v == nil {
			continue
		}
		switch name {
		case "inputs":
			out = append(out, Clause{Path: name, Grade: string(sow.Enforced) + " (by definition, §5.3)", Value: indent(v)})
		case "confidentiality":
			m, _ := v.(map[string]any)
			for _, sub := range []string{"transport", "retention", "processors", "promises", "processed_in"} {
				if x, ok := m[sub]; ok {
					add(name+"."+sub, x)
				}
			}
		case "qualifications":
			list, _ := v.([]any)
			for _, q := range list {
				id, _ := q.(map[string]any)["id"].(string)
				add(name+"."+id, q)
			}
		case "parties":
			add(name, v)
			if m, _ := v.(map[string]any); m != nil && m["offered_to"] != nil {
				add(name+".offered_to", m["offered_to"])
			}
		default:
			add(name, v)
		}
	}
	return out
}

// indent is v as indented JSON, without the encoder's HTML escaping (the
// page escapes; the JSON answer carries it as a string).
func indent(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// Engagement reads the public record of the engagement between client and
// seller for offering (the first page of its history and reviews),
// settling first what the clock has decided.
func (s *Service) Engagement(ctx context.Context, client, seller, offering string) (*View, error) {
	return s.EngagementPage(ctx, client, seller, offering, Page{})
}

// recordFor reads the id of the record (client, seller, offering) names,
// settled.
func (s *Service) recordFor(ctx context.Context, client, seller, offering string) (string, error) {
	notFound := errs.Newf(errs.NotFound, "no engagement between client %s and seller %s for offering %q is on record", client, seller, offering)
	if !keys.IsUserPublicKey(client) || !keys.IsUserPublicKey(seller) || offering == "" || len(offering) > maxOffering {
		return "", notFound
	}
	var e indexEntry
	if err := store.Get(ctx, s.cfg.Store, CollIndex, IndexID(client, seller, offering), &e); errors.Is(err, store.ErrNotFound) {
		return "", notFound
	} else if err != nil {
		return "", storeErr(err)
	}
	if err := s.settle(ctx, e.Record); errors.Is(err, store.ErrNotFound) {
		return "", notFound
	} else if err != nil {
		return "", storeErr(err)
	}
	return e.Record, nil
}

// EngagementPage reads the public record with one page of its history and
// reviews: a read is bounded whatever the record holds.
func (s *Service) EngagementPage(ctx context.Context, client, seller, offering string, p Page) (*View, error) {
	id, err := s.recordFor(ctx, client, seller, offering)
	if err != nil {
		return nil, err
	}
	hl, rl := pageLimit(p.HistoryLimit), pageLimit(p.ReviewsLimit)
	var r Record
	var events []Event
	var reviews []StoredReview
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		events, reviews = nil, nil
		if err := tx.Get(CollRecords, id, &r); err != nil {
			return err
		}
		// By id, no query: a page costs its own reads, and Firestore needs
		// no index.
		for seq := max(p.HistoryAfter, 0) + 1; seq <= r.Seq && len(events) < hl; seq++ {
			var e Event
			switch err := tx.Get(CollEvents, eventID(r.ID, seq), &e); {
			case errors.Is(err, store.ErrNotFound):
				continue
			case err != nil:
				return err
			}
			events = append(events, e)
		}
		for n := max(p.ReviewsAfter, 0) + 1; n <= r.ReviewCount && len(reviews) < rl; n++ {
			var o reviewOrder
			switch err := tx.Get(CollReviewOrder, reviewOrderID(r.ID, n), &o); {
			case errors.Is(err, store.ErrNotFound):
				continue // stored before reviews were numbered
			case err != nil:
				return err
			}
			var rv StoredReview
			switch err := tx.Get(CollReviews, r.ID+"."+o.Digest, &rv); {
			case errors.Is(err, store.ErrNotFound):
				continue
			case err != nil:
				return err
			}
			rv.Seq = n
			reviews = append(reviews, rv)
		}
		return nil
	})
	if err != nil {
		return nil, storeErr(err)
	}
	v, err := r.view(offering, events, reviews, s.now())
	if err != nil {
		return nil, err
	}
	v.HistoryTotal, v.ReviewsTotal = r.Seq, r.ReviewCount
	if n := len(events); n > 0 && events[n-1].Seq < r.Seq {
		v.HistoryNext = events[n-1].Seq
	}
	if n := len(reviews); n > 0 && reviews[n-1].Seq < r.ReviewCount {
		v.ReviewsNext = reviews[n-1].Seq
	}
	for i := range v.History {
		if v.History[i].Link != "" {
			v.History[i].Link = RecordPath(client, seller, offering) + v.History[i].Link
		}
	}
	for i := range v.Amendments {
		if v.Amendments[i].Link != "" {
			v.Amendments[i].Link = RecordPath(client, seller, offering) + v.Amendments[i].Link
		}
	}
	return v, nil
}

// EventOf is one event of the record (client, seller, offering) names,
// with its signed bytes in full: where a history entry's link leads.
func (s *Service) EventOf(ctx context.Context, client, seller, offering string, seq int) (*HistoryItem, error) {
	id, err := s.recordFor(ctx, client, seller, offering)
	if err != nil {
		return nil, err
	}
	var e Event
	if err := store.Get(ctx, s.cfg.Store, CollEvents, eventID(id, seq), &e); errors.Is(err, store.ErrNotFound) {
		return nil, errs.Newf(errs.NotFound, "this engagement's history has no entry %d", seq)
	} else if err != nil {
		return nil, storeErr(err)
	}
	h := historyItem(e)
	h.Signed, h.Link = string(e.Signed), ""
	return &h, nil
}

// historyItem is e as the public record lists it.
func historyItem(e Event) HistoryItem {
	h := HistoryItem{Seq: e.Seq, Kind: e.Kind, At: e.At, Version: e.Version, Role: e.Role, Key: e.Key, Reason: e.Reason}
	if len(e.Signed) == 0 {
		return h
	}
	h.SignedSHA256 = digest(e.Signed)
	if documentEvent(e.Kind) {
		h.Link = "?event=" + strconv.Itoa(e.Seq)
	} else {
		h.Signed = string(e.Signed)
	}
	return h
}

func (r *Record) view(offering string, events []Event, reviews []StoredReview, now time.Time) (*View, error) {
	v := &View{Client: r.Client, Seller: r.Seller, Offering: offering, SowID: r.SowID, Version: r.Version,
		Offerings: r.Offerings, FormedAt: r.FormedAt, Owners: Owners{Provider: r.SellerOwner, Client: r.ClientOwner},
		MirrorPending: r.MirrorPending, Amendments: []HistoryItem{}, History: []HistoryItem{}, Reviews: []ReviewView{}}
	shown := r.Document
	if r.Formed() {
		v.Document = string(r.Document)
		sum := sha256.Sum256(r.Document)
		v.DocumentSHA256 = hex.EncodeToString(sum[:])
	} else {
		v.Requested, shown = string(r.Requested), r.Requested
	}
	d, err := sow.Parse(shown)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the engagement document on record no longer reads", err)
	}
	v.StartsAt, v.EndsAt, v.Clauses = d.StartsAt, d.EndsAt, Clauses(d)
	if d.Language != nil {
		v.Language = "this renderer does not know the standard language " + d.Language.ID + "; the signed fields are shown verbatim (§4.3)"
	}
	v.State, v.InForce = r.state(d, now)
	if o := r.Open; o != nil {
		v.Open = &OpenView{Version: o.Version, Proposer: o.Role, ProposedAt: o.ProposedAt, LapsesAt: o.LapsesAt, Document: string(o.Document)}
	}
	for _, e := range events {
		h := historyItem(e)
		v.History = append(v.History, h)
		switch e.Kind {
		case EventProposed, EventApproved, EventDenied, EventWithdrawn, EventLapsed:
			v.Amendments = append(v.Amendments, h)
		}
	}
	if t := r.Termination; t != nil {
		v.Termination = &TermView{ForCause: t.ForCause, Reason: t.Reason, By: t.By, Role: t.Role, SignedAt: t.SignedAt, RecordedAt: t.RecordedAt,
			EffectiveAt: t.EffectiveAt, InNotice: now.Before(parseStamp(t.EffectiveAt)), Notice: string(t.Notice)}
	}
	for _, rv := range reviews {
		v.Reviews = append(v.Reviews, ReviewView{Verdict: rv.Verdict, Reason: rv.Reason, TaskID: rv.TaskID, SignedAt: rv.SignedAt,
			StoredAt: rv.StoredAt, Digest: rv.Digest, Review: string(rv.Review)})
	}
	return v, nil
}

// state is the record's §7.1 state at now and whether it is in force; d is
// its shown document (the governing version, or the instance awaiting the
// provider's signature). An open amendment whose window has passed counts
// as lapsed even before settle records it, so a listing that does not
// settle names the same state the record will.
func (r *Record) state(d *sow.Document, now time.Time) (string, bool) {
	if !r.Formed() {
		switch {
		case r.RequestWithdrawnAt != "":
			return StateRequestWithdrawn, false
		case requestOpen(r, d, now) != nil:
			return StateRequestLapsed, false
		}
		return StateRequested, false
	}
	state, inForce := d.Phase(now), false
	if t, err := r.terms(); err == nil {
		inForce = t.InForce(now) && !t.Exhausted
	}
	switch {
	case r.Termination != nil && !now.Before(parseStamp(r.Termination.EffectiveAt)):
		state = sow.StateTerminated
	case state == sow.StateActive && r.Open != nil && now.Before(parseStamp(r.Open.LapsesAt)):
		state = sow.StateAmendmentProposed
	case state == sow.StateActive && r.Version > 1:
		state = sow.StateAmended
	}
	return state, inForce
}
