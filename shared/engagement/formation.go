package engagement

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// rolesOf lists the roles that signed d, in order.
func rolesOf(d *sow.Document) []string {
	out := make([]string, 0, len(d.Signatures))
	for _, s := range d.Signatures {
		out = append(out, s.Role)
	}
	return out
}

// publishes refuses a scope naming an offering the provider's manifest does
// not publish (§12.1: a validation error).
func publishes(info AgentInfo, d *sow.Document) error {
	for _, o := range d.Scope.Offerings {
		if !protocol.ValidToken(o) {
			// The terms are mirrored under a bus key with the offering as
			// one of its tokens.
			return errs.Newf(errs.InvalidRequest, "the scope names offering %q; this mesh keeps engagements only for offering ids of letters, digits, '-' and '_' (at most 128)", o).
				WithDetail("offering", o)
		}
		if !slices.Contains(info.Offerings, o) {
			return errs.Newf(errs.InvalidRequest, "the scope names offering %q, which the provider agent's registered manifest does not publish; a proposal may name only offerings the agent publishes (§12.1)", o).
				WithDetail("offering", o)
		}
	}
	return nil
}

// seatKey refuses a signature by anyone but the seat's owner.
func seatKey(sig sow.Signature, owner, seat string) error {
	if sig.Key != owner {
		return errs.Newf(errs.Forbidden, "the %s signature is by %s, but the %s agent's owner as this mesh records it is %s; owners sign for their agents' seats (§6)", seat, sig.Key, seat, owner)
	}
	return nil
}

// FileProposal files a standing proposal: a template (client seat null,
// starts_at null) signed by the provider seat's owner only, naming only
// offerings the provider publishes, grading enforced only what this
// runtime enforces. Filing the same bytes again answers the same offer.
func (s *Service) FileProposal(ctx context.Context, raw []byte) (*Offer, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	if d.Parties.Client != nil || d.StartsAt != "" {
		return nil, errs.New(errs.InvalidRequest, "a standing proposal leaves the client seat and starts_at null; the countersign fills them (§12.1)")
	}
	if r := rolesOf(d); !slices.Equal(r, []string{sow.RoleProvider}) {
		return nil, errs.New(errs.InvalidRequest, "a standing proposal carries the provider's signature and no other (§7.1)")
	}
	provider := d.Parties.Provider.Agent
	info, err := s.ownerOf(ctx, provider, "provider")
	if err != nil {
		return nil, err
	}
	sig, _ := d.Signature(sow.RoleProvider)
	if err := seatKey(sig, info.Owner, "provider"); err != nil {
		return nil, err
	}
	if err := publishes(info, d); err != nil {
		return nil, err
	}
	if e := (Runtime{ProviderSKUs: info.SKUs}).gates(d); e != nil {
		return nil, e
	}
	now := s.now()
	offer := &Offer{Provider: provider, SowID: d.ID, Document: raw, FiledAt: stamp(now), Directed: d.Parties.OfferedTo != nil}
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		var cur Offer
		switch err := tx.Get(CollOffers, offerID(provider, d.ID), &cur); {
		case err == nil:
			if !bytes.Equal(cur.Document, raw) {
				return errs.Newf(errs.Conflict, "a different standing proposal with id %s is already on file for this provider; a new proposal is minted with a new id (§4.1.1)", d.ID)
			}
			*offer = cur
			return nil
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		return tx.Create(CollOffers, offerID(provider, d.ID), offer)
	})
	if err != nil {
		return nil, storeErr(err)
	}
	return offer, nil
}

// sameTerms reports whether the completed instance keeps every term of the
// template: everything but the client seat, starts_at, ends_at (when the
// template leaves it null) and the signatures.
func sameTerms(template, instance *sow.Document) bool {
	strip := func(d *sow.Document, endsFree bool) []byte {
		m := make(map[string]any, len(d.Value))
		for k, v := range d.Value {
			m[k] = v
		}
		delete(m, "signatures")
		delete(m, "starts_at")
		if endsFree {
			delete(m, "ends_at")
		}
		if p, ok := m["parties"].(map[string]any); ok {
			q := make(map[string]any, len(p))
			for k, v := range p {
				if k != "client" {
					q[k] = v
				}
			}
			m["parties"] = q
		}
		b, _ := protocol.Canonical(m)
		return b
	}
	free := template.EndsAt == ""
	return bytes.Equal(strip(template, free), strip(instance, free))
}

// ended reports whether a formed record no longer admits work at now:
// lapsed, or terminated to effect.
func (r *Record) ended(now time.Time) bool {
	if !r.Formed() {
		return false
	}
	if t := r.Termination; t != nil && !now.Before(parseStamp(t.EffectiveAt)) {
		return true
	}
	d, err := sow.Parse(r.Document)
	return err != nil || d.Phase(now) == sow.StateLapsed
}

// claimIndex reads the index entries of offerings for record id and
// refuses one held by another engagement still in force; it returns the
// writes to make after every read. Only a formation (formed true) takes an
// entry from a formed engagement that has ended: a request to form that
// may never form does not hide the public record of the last engagement.
func claimIndex(tx store.Tx, client, seller, id string, offerings []string, now time.Time, formed bool) ([]string, error) {
	var claim []string
	for _, o := range offerings {
		var e indexEntry
		switch err := tx.Get(CollIndex, IndexID(client, seller, o), &e); {
		case errors.Is(err, store.ErrNotFound):
			claim = append(claim, o)
			continue
		case err != nil:
			return nil, err
		}
		if e.Record == id {
			continue
		}
		var other Record
		if err := tx.Get(CollRecords, e.Record, &other); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		} else if err == nil && other.Formed() && !other.ended(now) && slices.Contains(other.Offerings, o) {
			return nil, errs.Newf(errs.Conflict, "an engagement between these agents for offering %q is in force (%s); terminate it before forming another", o, other.SowID).
				WithDetail("sow_id", other.SowID)
		} else if err == nil && other.Formed() && !formed {
			continue
		}
		claim = append(claim, o)
	}
	return claim, nil
}

// appendEvent records e as the record's next history entry. It never
// refuses: what can be repeated is bounded where it is asked for
// (MaxProposals, MaxRequests), so a termination or a lapse is always
// recorded.
func appendEvent(tx store.Tx, r *Record, e Event) error {
	r.Seq++
	e.Record, e.Seq = r.ID, r.Seq
	return tx.Create(CollEvents, eventID(r.ID, r.Seq), e)
}

// Countersign is formation's first step (§12.1): the client's countersign
// over the completed instance of a standing proposal on file (client seat
// filled, starts_at set, everything else as offered), signed by the client
// agent's owner. It passes the gates the document states (a directed
// offer's counterparty, the qualifications, with asserted the conditions
// the countersign asserts) and records the request; the provider's
// instance signature (Sign) forms the engagement.
func (s *Service) Countersign(ctx context.Context, raw []byte, asserted []string) (*Record, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	if d.Parties.Client == nil || d.StartsAt == "" {
		return nil, errs.New(errs.InvalidRequest, "the countersigned instance fills the client seat and sets starts_at and ends_at (§12.1)")
	}
	if r := rolesOf(d); !slices.Equal(r, []string{sow.RoleClient}) {
		return nil, errs.New(errs.InvalidRequest, "the countersign carries the client's signature only: the provider's signature on the proposal covers the template's bytes, and formation ends with its fresh signature over the instance (§6, §12.1)")
	}
	if d.Version != 1 {
		return nil, errs.New(errs.InvalidRequest, "formation is at version 1; later versions are amendments (§5.8)")
	}
	client, provider := d.Parties.Client.Agent, d.Parties.Provider.Agent
	if client == provider {
		return nil, errs.New(errs.InvalidRequest, "the client and provider seats name the same agent")
	}
	now := s.now()
	if start := parseStamp(d.StartsAt); start.Before(now.Add(-MaxSkew)) {
		return nil, errs.Newf(errs.InvalidRequest, "starts_at %s is in the past; an engagement starts now or later", d.StartsAt)
	}
	var offer Offer
	if err := store.Get(ctx, s.cfg.Store, CollOffers, offerID(provider, d.ID), &offer); errors.Is(err, store.ErrNotFound) {
		return nil, errs.Newf(errs.NotFound, "no standing proposal %s of provider %s is on file; the provider files it first (POST /v1/engage/proposals)", d.ID, provider)
	} else if err != nil {
		return nil, storeErr(err)
	}
	template, err := sow.Parse(offer.Document)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the standing proposal on file no longer reads", err)
	}
	if offer.WithdrawnAt != "" {
		return nil, errs.Newf(errs.Conflict, "standing proposal %s was withdrawn at %s; nothing forms under it (§12.1)", d.ID, offer.WithdrawnAt)
	}
	if !sameTerms(template, d) {
		return nil, errs.Newf(errs.InvalidRequest, "the countersigned instance changes terms of standing proposal %s; a countersign fills the client seat and the term and keeps everything else as offered (§12.1)", d.ID)
	}
	if template.TermMonths > 0 && template.EndsAt == "" {
		if limit := parseStamp(d.StartsAt).AddDate(0, int(template.TermMonths), 0); parseStamp(d.EndsAt).After(limit) {
			return nil, errs.Newf(errs.InvalidRequest, "ends_at runs past the %d months the proposal offers (until %s)", template.TermMonths, stamp(limit))
		}
	}
	if o := template.Parties.OfferedTo; o != nil {
		if e := o.Refusal(client, now); e != nil {
			return nil, e
		}
		if offer.SpentBy != "" {
			return nil, errs.New(errs.Forbidden, "this directed offer was spent by a formation; a directed standing proposal forms once (§12.1.1)").WithDetail("restriction", "offered_to")
		}
	}
	cinfo, err := s.ownerOf(ctx, client, "client")
	if err != nil {
		return nil, err
	}
	sig, _ := d.Signature(sow.RoleClient)
	if err := seatKey(sig, cinfo.Owner, "client"); err != nil {
		return nil, err
	}
	if len(d.Qualifications) > 0 {
		facts := &sow.Facts{Subject: client, Registered: &cinfo.Registered, Offerings: cinfo.Offerings}
		if cinfo.Offerings == nil {
			facts.Offerings = []string{}
		}
		if acct, err := s.account(ctx, client); err == nil {
			facts.Account = &acct
		}
		if e := d.Qualifications.Refusal(client, asserted, facts); e != nil {
			return nil, e
		}
	} else if len(asserted) > 0 {
		return nil, errs.New(errs.InvalidRequest, "this offer states no conditions, so the countersign asserts none (§12.1)")
	}
	pinfo, err := s.ownerOf(ctx, provider, "provider")
	if err != nil {
		return nil, err
	}
	if err := publishes(pinfo, d); err != nil {
		return nil, err
	}
	if e := (Runtime{ProviderSKUs: pinfo.SKUs}).gates(d); e != nil {
		return nil, e
	}
	id := RecordID(client, provider, d.ID)
	var rec Record
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		rec = Record{}
		switch err := tx.Get(CollRecords, id, &rec); {
		case err == nil && rec.Formed():
			return errs.Newf(errs.Conflict, "these agents already formed an engagement under %s; a new engagement needs a new proposal", d.ID)
		case err == nil && bytes.Equal(rec.Requested, raw) && requestOpen(&rec, d, now) == nil:
			return errSame // the same open request again; a withdrawn or lapsed one is asked anew
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return err
		}
		if rec.Requests >= MaxRequests {
			return errs.Newf(errs.QuotaExceeded, "the client has countersigned this proposal %d times, the most one record keeps; the provider files a new proposal (with a new id) to go on", MaxRequests)
		}
		claim, err := claimIndex(tx, client, provider, id, d.Scope.Offerings, now, false)
		if err != nil {
			return err
		}
		seq, requests := rec.Seq, rec.Requests+1
		rec = Record{ID: id, Client: client, Seller: provider, SowID: d.ID, ClientOwner: cinfo.Owner, SellerOwner: pinfo.Owner,
			Offerings: slices.Clone(d.Scope.Offerings), Requested: raw, Asserted: asserted, RequestedAt: stamp(now),
			Seq: seq, Requests: requests, UpdatedAt: stamp(now)}
		for _, o := range claim {
			if err := tx.Set(CollIndex, IndexID(client, provider, o), indexEntry{Record: id}); err != nil {
				return err
			}
		}
		if err := appendEvent(tx, &rec, Event{Kind: EventRequested, At: stamp(now), Version: 1, Role: sow.RoleClient, Key: sig.Key, Signed: raw}); err != nil {
			return err
		}
		return tx.Set(CollRecords, id, &rec)
	})
	if errors.Is(err, errSame) {
		return &rec, nil
	}
	if err != nil {
		return nil, storeErr(err)
	}
	return &rec, nil
}

// errSame ends a transaction that would record what is already recorded:
// the same signed bytes sent again are answered as the first time.
var errSame = errors.New("engagement: already recorded")

// account answers platform_account.
func (s *Service) account(ctx context.Context, agent string) (bool, error) {
	if s.cfg.Accounts != nil {
		return s.cfg.Accounts(ctx, agent)
	}
	var a struct {
		AccountID string `json:"account_id"`
		Enabled   bool   `json:"enabled"`
	}
	switch err := store.Get(ctx, s.cfg.Store, "agents", agent, &a); {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return a.AccountID != "" && a.Enabled, nil
}

// Sign is formation's second step: the provider's fresh signature over
// the completed instance the client countersigned (§6, §12.1). raw is the
// instance with both signatures; the client's must be the one requested.
// Only now is the engagement agreed, and its terms are mirrored.
func (s *Service) Sign(ctx context.Context, raw []byte) (*Record, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	if !d.Agreed() {
		return nil, errs.New(errs.InvalidRequest, "the instance carries both seats' signatures over the same bytes: the client's countersign and the provider's instance signature (§6)")
	}
	client, provider := d.Parties.Client.Agent, d.Parties.Provider.Agent
	id := RecordID(client, provider, d.ID)
	var pre Record
	if err := store.Get(ctx, s.cfg.Store, CollRecords, id, &pre); errors.Is(err, store.ErrNotFound) {
		return nil, errs.Newf(errs.NotFound, "no countersign of %s by client %s is on file; the client countersigns first (POST /v1/engage/countersign)", d.ID, client)
	} else if err != nil {
		return nil, storeErr(err)
	}
	if pre.Formed() {
		// The same instance signature again answers the record as it is;
		// any other bytes (an older version included) change nothing.
		if !bytes.Equal(pre.Document, raw) {
			return nil, errs.Newf(errs.Conflict, "the engagement under %s is already formed, at version %d; read it for the governing document", d.ID, pre.Version).
				WithDetail("version", pre.Version)
		}
		if pre.MirrorPending {
			return s.mirrorAfter(ctx, &pre)
		}
		return &pre, nil
	}
	requested, err := sow.Parse(pre.Requested)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the countersign on file no longer reads", err)
	}
	if err := requestOpen(&pre, requested, s.now()); err != nil {
		return nil, err
	}
	a, _ := sow.SignedBytes(requested.Value)
	b, _ := sow.SignedBytes(d.Value)
	if !bytes.Equal(a, b) {
		return nil, errs.New(errs.InvalidRequest, "the provider's signature covers different bytes than the client countersigned; the instance signature is over the completed instance exactly as countersigned (§12.1)")
	}
	csig, _ := d.Signature(sow.RoleClient)
	if err := seatKey(csig, pre.ClientOwner, "client"); err != nil {
		return nil, err
	}
	pinfo, err := s.ownerOf(ctx, provider, "provider")
	if err != nil {
		return nil, err
	}
	psig, _ := d.Signature(sow.RoleProvider)
	if err := seatKey(psig, pinfo.Owner, "provider"); err != nil {
		return nil, err
	}
	if e := (Runtime{ProviderSKUs: pinfo.SKUs}).gates(d); e != nil {
		return nil, e
	}
	now := s.now()
	if o := d.Parties.OfferedTo; o != nil {
		if e := o.Refusal(client, now); e != nil {
			return nil, e
		}
	}
	var rec Record
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		rec = Record{}
		if err := tx.Get(CollRecords, id, &rec); err != nil {
			return err
		}
		if rec.Formed() || !bytes.Equal(rec.Requested, pre.Requested) || rec.RequestWithdrawnAt != "" {
			return errs.New(errs.Conflict, "the countersign changed while this was signed; read the engagement and sign its current request")
		}
		var offer Offer
		if err := tx.Get(CollOffers, offerID(provider, d.ID), &offer); err != nil {
			return err
		}
		if offer.WithdrawnAt != "" {
			return errs.Newf(errs.Conflict, "standing proposal %s was withdrawn at %s; nothing forms under it (§12.1)", d.ID, offer.WithdrawnAt)
		}
		if offer.Directed && offer.SpentBy != "" && offer.SpentBy != id {
			return errs.New(errs.Forbidden, "this directed offer was spent by a formation; a directed standing proposal forms once (§12.1.1)").WithDetail("restriction", "offered_to")
		}
		claim, err := claimIndex(tx, client, provider, id, d.Scope.Offerings, now, true)
		if err != nil {
			return err
		}
		if offer.Directed {
			offer.SpentBy = id
			if err := tx.Set(CollOffers, offerID(provider, d.ID), &offer); err != nil {
				return err
			}
		}
		for _, o := range claim {
			if err := tx.Set(CollIndex, IndexID(client, provider, o), indexEntry{Record: id}); err != nil {
				return err
			}
		}
		rec.Document, rec.Version, rec.FormedAt, rec.Requested = raw, 1, stamp(now), nil
		rec.SellerOwner, rec.MirrorPending, rec.UpdatedAt = pinfo.Owner, true, stamp(now)
		if err := appendEvent(tx, &rec, Event{Kind: EventFormed, At: stamp(now), Version: 1, Role: sow.RoleProvider, Key: psig.Key, Signed: raw}); err != nil {
			return err
		}
		return tx.Set(CollRecords, id, &rec)
	})
	if err != nil {
		return nil, storeErr(err)
	}
	return s.mirrorAfter(ctx, &rec)
}

// WithdrawProposal withdraws a standing proposal, signed by the owner key
// that signed it (§12.1): prospective (formed engagements stand), for
// everyone (a countersign awaiting the provider's signature no longer
// forms), archived (the offer is kept, marked). The same withdrawal again
// answers the same.
func (s *Service) WithdrawProposal(ctx context.Context, raw []byte) (*Offer, error) {
	w, err := ParseProposalWithdrawal(raw)
	if err != nil {
		return nil, err
	}
	now := s.now()
	if err := skew(w.At, now); err != nil {
		return nil, err
	}
	var offer Offer
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		offer = Offer{}
		switch err := tx.Get(CollOffers, offerID(w.Provider, w.SowID), &offer); {
		case errors.Is(err, store.ErrNotFound):
			return errs.Newf(errs.NotFound, "no standing proposal %s of provider %s is on file", w.SowID, w.Provider)
		case err != nil:
			return err
		}
		d, err := sow.Parse(offer.Document)
		if err != nil {
			return errs.Wrap(errs.InternalError, "the standing proposal on file no longer reads", err)
		}
		if sig, _ := d.Signature(sow.RoleProvider); sig.Key != w.By {
			return errs.New(errs.Forbidden, "a standing proposal is withdrawn by the owner key that signed it")
		}
		if offer.WithdrawnAt != "" {
			return errSame
		}
		offer.Withdrawn, offer.WithdrawnAt = raw, stamp(now)
		return tx.Set(CollOffers, offerID(w.Provider, w.SowID), &offer)
	})
	if err != nil && !errors.Is(err, errSame) {
		return nil, storeErr(err)
	}
	return &offer, nil
}

// reviewWindow is how long a proposal waits for its answer: an amendment
// (§5.8), and a request to form (the client's countersign) for the
// provider's instance signature; the document's review window.
func reviewWindow(d *sow.Document) time.Duration {
	return time.Duration(min(d.ChangeControl.ReviewWindowDays, MaxReviewWindowDays)) * 24 * time.Hour
}

// requestOpen refuses to form from a request the client withdrew or that
// lapsed unanswered.
func requestOpen(r *Record, requested *sow.Document, now time.Time) error {
	if r.RequestWithdrawnAt != "" {
		return errs.Newf(errs.Conflict, "the client withdrew its countersign of %s at %s; nothing forms from it", r.SowID, r.RequestWithdrawnAt)
	}
	if lapses := parseStamp(r.RequestedAt).Add(reviewWindow(requested)); !now.Before(lapses) {
		return errs.Newf(errs.Conflict, "the client's countersign of %s lapsed at %s, unanswered within the review window; the client countersigns again to ask anew", r.SowID, stamp(lapses)).
			WithDetail("lapsed_at", stamp(lapses))
	}
	return nil
}

// WithdrawRequest records the client's signed withdrawal of its request to
// form (a countersign awaiting the provider's instance signature), bound
// to the countersign's exact bytes: nothing forms from it afterwards. The
// same withdrawal again answers the same.
func (s *Service) WithdrawRequest(ctx context.Context, raw []byte) (*Record, error) {
	w, err := ParseRequestWithdrawal(raw)
	if err != nil {
		return nil, err
	}
	now := s.now()
	if err := skew(w.At, now); err != nil {
		return nil, err
	}
	id := RecordID(w.Client, w.Seller, w.SowID)
	var pre Record
	if err := store.Get(ctx, s.cfg.Store, CollRecords, id, &pre); errors.Is(err, store.ErrNotFound) {
		return nil, errs.Newf(errs.NotFound, "no countersign of %s by client %s is on file", w.SowID, w.Client)
	} else if err != nil {
		return nil, storeErr(err)
	}
	return s.update(ctx, id, func(tx store.Tx, rec *Record) error {
		switch {
		case rec.Formed():
			return errs.Newf(errs.Conflict, "the engagement under %s is formed; it is ended by a termination notice (§5.9)", rec.SowID)
		case !slices.Contains(rec.Offerings, w.Offering):
			return errs.Newf(errs.InvalidRequest, "offering %q is not in the countersigned scope", w.Offering)
		case w.By != rec.ClientOwner:
			return errs.New(errs.Forbidden, "a request to form is withdrawn by the client seat's owner who countersigned it")
		case w.RequestSHA256 != digest(rec.Requested):
			return errs.New(errs.Conflict, "request_sha256 is not the SHA-256 of the countersign on record; read the engagement and sign for its current request").
				WithDetail("request_sha256", digest(rec.Requested))
		case rec.RequestWithdrawnAt != "":
			return errSame
		}
		rec.RequestWithdrawnAt = stamp(now)
		return appendEvent(tx, rec, Event{Kind: EventRequestOff, At: stamp(now), Version: 1, Role: sow.RoleClient, Key: w.By, Signed: raw})
	})
}
