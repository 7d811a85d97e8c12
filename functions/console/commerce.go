package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// The commerce pages (docs/console.md "Offers and agreements", DESIGN §11):
// a seller's offers, the approval page an AGREEMENT_REQUIRED refusal points
// at, and the account's agreements and engagements. The console only
// reads: an agreement is signed with the owner key, which lives in the
// person's adapter state and never reaches the console, so approving is a
// command the page shows (mesh-adapter agree), not a button.
//
// The offers and approval pages are public: they show what the registry
// already tells anyone (a registered agent's published SKUs) and the
// command to run, and the link in a refusal must open for whoever runs the
// refused agent, who may have no console account on this mesh. The
// agreements page is the signed-in account's.

// Commerce is what the commerce pages read from the bus (BusCommerce in a
// deployment; a stand-in in tests). Records are the registry's generic
// JSON, read as such: the SKUs are its skus member, parsed with
// commerce.SKUsFromValue.
type Commerce interface {
	// Agent is agent's registry record; nil when it is not registered
	// (or is private: the registry shows those to their own agent only).
	Agent(ctx context.Context, agent string) (map[string]any, error)
	// Listing is the public registrations, and whether they are all of
	// them (false when the registry holds more than one listing holds).
	Listing(ctx context.Context) (recs []map[string]any, complete bool, err error)
	// Agreements is every agreement filed by owner: the records under
	// commerce.AgreementKey(<any seller>, owner, <any sku>).
	Agreements(ctx context.Context, owner string) ([]HeldAgreement, error)
	// AccountAgents is the account's enabled agents.
	AccountAgents(ctx context.Context, accountID string) ([]AccountAgent, error)
	// HandleAgent is the agent paired with handle; "" when no handle has
	// that name or it is not paired yet.
	HandleAgent(ctx context.Context, handle string) (string, error)
}

// HeldAgreement is one record of the commerce bucket, with the parts of
// its key.
type HeldAgreement struct {
	Seller, Owner, SKU string
	Record             commerce.AgreementRecord
}

// AccountAgent is one of an account's agents.
type AccountAgent struct{ ID, Label, Handle string }

// EngagementLister lists the engagements an account's agents are party
// to (the control plane's engagement store, shared/engagement). The
// console defines only what it shows; nil makes the section say none can
// be listed on this instance.
type EngagementLister interface {
	ListForAgents(ctx context.Context, agents []string) ([]EngagementSummary, error)
}

// EngagementSummary is one engagement as the agreements page lists it.
type EngagementSummary struct {
	SowID    string
	Version  int
	Client   string // the client agent's key
	Seller   string // the provider agent's key
	Offering string
	// State is the engagement's state in a word or two ("in force",
	// "terminated", "lapsed"), as the engagement service names it.
	State    string
	StartsAt time.Time
	EndsAt   *time.Time
}

// RecordURL is the engagement's public record page on the control plane
// (GET /v1/engagements/:client/:seller/:offering), on the console's host.
func (e EngagementSummary) RecordURL() string {
	return "/v1/engagements/" + url.PathEscape(e.Client) + "/" + url.PathEscape(e.Seller) + "/" + url.PathEscape(e.Offering)
}

// commerceTimeout bounds the bus reads of one commerce page.
const commerceTimeout = 10 * time.Second

// maxAgentsRead bounds the registry records the agreements page reads for
// one account (its agents and their sellers).
const maxAgentsRead = 200

var errTooManyAgents = errors.New("console: more registry records than one agreements page reads")

// AgreeCommand is the command that signs and files an agreement to seller's
// sku with the owner key of the adapter it runs in, pinned to the terms the
// page shows: if the seller re-prices before it runs, it signs nothing.
func AgreeCommand(seller string, sku commerce.SKU) string {
	return "mesh-adapter agree " + seller + " " + sku.ID + " --digest " + sku.Digest()
}

func recordName(rec map[string]any) string { return str(rec["name"]) }

// skusOf parses a record's published SKUs; nil and no error when it
// publishes none.
func skusOf(rec map[string]any) ([]commerce.SKU, error) {
	v, ok := rec["skus"]
	if !ok || v == nil {
		return nil, nil
	}
	return commerce.SKUsFromValue(v)
}

// --- Offers ------------------------------------------------------------------

type offerRow struct {
	ID, Covers, Price, Provider, TermsURL, CheckoutURL, Digest string
	Paid                                                       bool
	// Approve is the approval page for this seller's SKU; Command the
	// command it shows.
	Approve, Command string
}

type offersData struct {
	Asked  string // the key or handle in the address
	Agent  string // the agent key
	Name   string
	Owner  string
	Offers []offerRow
	// Note says why no offer is listed ("" when some are).
	Note string
}

func (s *Server) offersPage(w http.ResponseWriter, r *http.Request) {
	ss, _ := s.current(r)
	asked := r.PathValue("agent")
	d := &offersData{Asked: asked}
	v := &view{Title: "Offers of " + asked, Nav: "offers", sess: ss, Data: d}
	if s.commerce == nil {
		d.Note = noCommerce
		s.render(w, r, http.StatusNotImplemented, "offers", v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), commerceTimeout)
	defer cancel()
	agent, rec, status, msg := s.seller(ctx, asked)
	if rec == nil {
		d.Note = msg
		s.render(w, r, status, "offers", v)
		return
	}
	d.Agent, d.Name, d.Owner = agent, recordName(rec), registry.OwnerOf(rec, time.Now())
	if d.Name != "" {
		v.Title = "Offers of " + d.Name
	}
	skus, err := skusOf(rec)
	switch {
	case err != nil:
		d.Note = "This agent's published SKUs cannot be read: " + s.plain(err)
	case len(skus) == 0:
		d.Note = "This agent publishes no SKUs: every offering it has is free, and no agreement is needed to use it."
	}
	for _, sku := range skus {
		d.Offers = append(d.Offers, offerOf(agent, sku))
	}
	s.render(w, r, http.StatusOK, "offers", v)
}

// seller finds the registry record of the agent asked for by key or
// handle; nil with the status and sentence to show when there is none.
func (s *Server) seller(ctx context.Context, asked string) (string, map[string]any, int, string) {
	agent := asked
	if !keys.IsUserPublicKey(asked) {
		if !strings.Contains(asked, ".") || len(asked) > 320 {
			return "", nil, http.StatusNotFound, "That is neither an agent key (U followed by 55 characters) nor a handle (name.you@example.org)."
		}
		a, err := s.commerce.HandleAgent(ctx, asked)
		if err != nil {
			s.log.Warn("commerce: handle", "err", err)
			return "", nil, http.StatusBadGateway, "The handle cannot be looked up right now. Try again in a moment."
		}
		if a == "" {
			return "", nil, http.StatusNotFound, "No agent is paired with the handle " + asked + "."
		}
		agent = a
	}
	rec, err := s.commerce.Agent(ctx, agent)
	if err != nil {
		s.log.Warn("commerce: registry get", "err", err)
		return "", nil, http.StatusBadGateway, "The registry cannot be read right now. Try again in a moment."
	}
	if rec == nil {
		return "", nil, http.StatusNotFound, "The agent " + agent + " is not registered on this mesh now, so it offers nothing."
	}
	return agent, rec, http.StatusOK, ""
}

func offerOf(seller string, sku commerce.SKU) offerRow {
	row := offerRow{ID: sku.ID, Covers: coversWords(sku.Covers), Price: PriceWords(sku.Price), Provider: sku.Provider.ID,
		TermsURL: sku.Provider.TermsURL, CheckoutURL: sku.Provider.CheckoutURL, Digest: sku.Digest(), Paid: sku.Price.Paid()}
	if row.Paid {
		row.Approve = Prefix + "agreements/approve?" + url.Values{"sku": {sku.ID}, "seller": {seller}}.Encode()
		row.Command = AgreeCommand(seller, sku)
	}
	return row
}

func coversWords(c commerce.Covers) string {
	if c.Agent {
		return "every offering of the agent"
	}
	return strings.Join(c.Offerings, ", ")
}

// PriceWords says a price in plain words, exactly: amounts are integer
// micro-units, shown as decimals without rounding.
func PriceWords(p commerce.Price) string {
	m := func(micro int64) string { return Money(micro, p.Currency) }
	var b strings.Builder
	switch p.Model {
	case commerce.ModelFree:
		return "Free: no agreement is needed."
	case commerce.ModelFlat:
		fmt.Fprintf(&b, "%s per request.", m(p.AmountMicro))
	case commerce.ModelPerUnit:
		fmt.Fprintf(&b, "%s per %s.", m(p.AmountMicro), units(p.Divisor(), p.Meter))
	case commerce.ModelPackage:
		fmt.Fprintf(&b, "%s per package of %s, counted per %s (UTC).", m(p.AmountMicro), units(p.Size, p.Meter), p.Period)
	case commerce.ModelTiered:
		fmt.Fprintf(&b, "Tiered on %s counted per %s (UTC): ", p.Meter, p.Period)
		from := int64(0)
		for i, t := range p.Tiers {
			if i > 0 {
				b.WriteString(", then ")
			}
			fmt.Fprintf(&b, "%s per %s", m(t.AmountMicro), units(p.Divisor(), p.Meter))
			if t.UpTo == 0 {
				if i > 0 {
					fmt.Fprintf(&b, " beyond %d", from)
				}
			} else {
				fmt.Fprintf(&b, " up to %d", t.UpTo)
				from = t.UpTo
			}
		}
		b.WriteString(".")
	default:
		return "Priced as " + p.Model + "."
	}
	if inc := p.Included; inc != nil && inc.Quantity > 0 {
		fmt.Fprintf(&b, " The first %d %s each %s are included free.", inc.Quantity, p.Meter, inc.Period)
	}
	return b.String()
}

func units(n int64, meter string) string {
	if n == 1 {
		return "unit of " + meter
	}
	return strconv.FormatInt(n, 10) + " " + meter
}

// Money writes micro-units of currency as an exact decimal: 1500 USD
// micro-units are "0.0015 USD"; credits (XCR) are named as credits.
func Money(micro int64, currency string) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	s := sign + strconv.FormatInt(micro/1_000_000, 10)
	if frac := micro % 1_000_000; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	}
	if currency == commerce.Credits {
		if s == "1" {
			return "1 credit (XCR)"
		}
		return s + " credits (XCR)"
	}
	return s + " " + currency
}

// --- Approval ----------------------------------------------------------------

type approvalSeller struct {
	Agent, Name, Covers, Price, Provider, TermsURL, CheckoutURL, Digest, Command string
	Paid                                                                         bool
}

type approvalData struct {
	SKU     string
	Sellers []approvalSeller
	// Seller is the seller the address named ("" when the page searched
	// the public listing).
	Seller string
	// Note says why no seller is listed; Partial that the listing
	// searched was not the whole registry.
	Note, Partial string
	// Example is an approval address naming a seller, for the note.
	Example string
}

// approvePage explains what approving sku means, for each registered
// seller publishing it, and shows the command that approves. The address
// is commerce.ApprovalPath's (an AGREEMENT_REQUIRED names only the SKU):
// the sellers are found in the public listing, or named with &seller=.
func (s *Server) approvePage(w http.ResponseWriter, r *http.Request) {
	ss, _ := s.current(r)
	q := r.URL.Query()
	d := &approvalData{SKU: q.Get("sku"), Seller: q.Get("seller")}
	d.Example = Prefix + "agreements/approve?sku=" + url.QueryEscape(d.SKU) + "&seller=<agent key or handle>"
	v := &view{Title: "Approve " + d.SKU, Nav: "agreements", sess: ss, Data: d}
	if !commerce.ValidSKUID(d.SKU) {
		v.Title = "Approve an agreement"
		d.Note = "This address names no SKU: it ends in ?sku=<id>, the id from the refusal (lower-case letters, digits and dashes)."
		s.render(w, r, http.StatusBadRequest, "approve", v)
		return
	}
	if s.commerce == nil {
		d.Note = noCommerce
		s.render(w, r, http.StatusNotImplemented, "approve", v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), commerceTimeout)
	defer cancel()
	type candidate struct {
		agent string
		rec   map[string]any
	}
	var recs []candidate
	if d.Seller != "" {
		agent, rec, status, msg := s.seller(ctx, d.Seller)
		if rec == nil {
			d.Note = msg
			s.render(w, r, status, "approve", v)
			return
		}
		recs = []candidate{{agent, rec}}
	} else {
		all, complete, err := s.commerce.Listing(ctx)
		if err != nil {
			s.log.Warn("commerce: listing", "err", err)
			d.Note = "The registry cannot be searched right now. Try again in a moment, or name the seller: " + d.Example
			s.render(w, r, http.StatusBadGateway, "approve", v)
			return
		}
		if !complete {
			d.Partial = fmt.Sprintf("Only the first %d public agents were searched.", len(all))
		}
		for _, rec := range all {
			recs = append(recs, candidate{str(rec["id"]), rec})
		}
	}
	for _, c := range recs {
		agent, rec := c.agent, c.rec
		skus, err := skusOf(rec)
		if err != nil || !keys.IsUserPublicKey(agent) {
			continue
		}
		for _, sku := range skus {
			if sku.ID != d.SKU {
				continue
			}
			d.Sellers = append(d.Sellers, approvalSeller{Agent: agent, Name: recordName(rec), Covers: coversWords(sku.Covers),
				Price: PriceWords(sku.Price), Provider: sku.Provider.ID, TermsURL: sku.Provider.TermsURL,
				CheckoutURL: sku.Provider.CheckoutURL, Digest: sku.Digest(), Command: AgreeCommand(agent, sku), Paid: sku.Price.Paid()})
		}
	}
	slices.SortFunc(d.Sellers, func(a, b approvalSeller) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Agent, b.Agent))
	})
	if len(d.Sellers) == 0 {
		if d.Seller != "" {
			d.Note = "The agent " + d.Seller + " does not publish the SKU " + d.SKU + " now: it may have withdrawn or renamed it. Its current offers are on its offers page."
		} else {
			d.Note = "No public agent on this mesh publishes the SKU " + d.SKU + ". If the seller is unlisted, name it: " + d.Example
		}
		s.render(w, r, http.StatusNotFound, "approve", v)
		return
	}
	s.render(w, r, http.StatusOK, "approve", v)
}

// --- Agreements and engagements ----------------------------------------------

type ownerRow struct {
	Owner  string
	Agents []string
}

type agreementRow struct {
	Seller, SellerName, SKU, Digest, AgreedAt, ExpiresAt, RevokedAt string
	// State is one of in-force, stale, expired, revoked, withdrawn,
	// unknown (the seller's terms could not be read), unreadable; Why
	// says it in words.
	State, Why string
	// Current is the seller's current digest when the agreement is stale;
	// Approve the approval page for it.
	Current, Approve string
}

type engagementRow struct {
	EngagementSummary
	ClientName, SellerName string
}

type agreementsData struct {
	Owners        []ownerRow
	Unregistered  []string // the account's agents not registered now
	NoOwner       []string // registered, but with no owner now (registry.OwnerOf)
	Agreements    []agreementRow
	AgreementsMsg string // why none is listed ("" when some are)
	Engagements   []engagementRow
	EngagementMsg string
}

// noCommerce is the sentence of an instance without a bus connection.
const noCommerce = "Offers and agreements are on the mesh's bus, and this console has no connection to it."

func (s *Server) agreementsPage(w http.ResponseWriter, r *http.Request, ss *session) {
	d := &agreementsData{}
	v := &view{Title: "Agreements and engagements", Nav: "agreements", sess: ss, Data: d}
	if s.commerce == nil {
		d.AgreementsMsg, d.EngagementMsg = noCommerce, noCommerce
		s.render(w, r, http.StatusOK, "agreements", v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), commerceTimeout)
	defer cancel()
	agents, err := s.commerce.AccountAgents(ctx, ss.p.AccountID)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	recs := map[string]map[string]any{} // agent key → registry record (nil: not registered)
	record := func(agent string) (map[string]any, error) {
		if rec, ok := recs[agent]; ok {
			return rec, nil
		}
		if len(recs) >= maxAgentsRead {
			return nil, errTooManyAgents
		}
		rec, err := s.commerce.Agent(ctx, agent)
		if err != nil {
			return nil, err
		}
		recs[agent] = rec
		return rec, nil
	}
	now := time.Now()
	names := map[string]string{}
	owners := map[string]*ownerRow{}
	var ids []string
	for _, a := range agents {
		ids = append(ids, a.ID)
		names[a.ID] = cmp.Or(a.Handle, a.Label, a.ID)
		rec, err := record(a.ID)
		if err != nil {
			s.log.Warn("commerce: registry get", "err", err)
			d.AgreementsMsg = "The registry cannot be read right now, so the owners of your agents are not known. Try again in a moment."
			break
		}
		if rec == nil {
			d.Unregistered = append(d.Unregistered, names[a.ID])
			continue
		}
		o := registry.OwnerOf(rec, now)
		if o == "" {
			d.NoOwner = append(d.NoOwner, names[a.ID])
			continue
		}
		if owners[o] == nil {
			owners[o] = &ownerRow{Owner: o}
		}
		owners[o].Agents = append(owners[o].Agents, names[a.ID])
	}
	for _, o := range owners {
		d.Owners = append(d.Owners, *o)
	}
	slices.SortFunc(d.Owners, func(a, b ownerRow) int { return cmp.Compare(a.Owner, b.Owner) })
	if d.AgreementsMsg == "" {
		d.Agreements, d.AgreementsMsg = s.agreementRows(ctx, d.Owners, record)
	}
	d.Engagements, d.EngagementMsg = s.engagementRows(ctx, ids, names, record)
	s.render(w, r, http.StatusOK, "agreements", v)
}

// agreementRows reads every agreement the owners filed, each judged
// against its seller's SKU as registered now.
func (s *Server) agreementRows(ctx context.Context, owners []ownerRow, record func(string) (map[string]any, error)) ([]agreementRow, string) {
	if len(owners) == 0 {
		return nil, "None of your agents is registered now, so no owner key is known to hold agreements."
	}
	now := time.Now()
	var rows []agreementRow
	for _, o := range owners {
		held, err := s.commerce.Agreements(ctx, o.Owner)
		if err != nil {
			s.log.Warn("commerce: agreements", "err", err)
			return nil, "The agreements cannot be read right now. Try again in a moment."
		}
		for _, h := range held {
			rows = append(rows, s.agreementRow(h, now, record))
		}
	}
	slices.SortFunc(rows, func(a, b agreementRow) int {
		return cmp.Or(cmp.Compare(a.SellerName, b.SellerName), cmp.Compare(a.Seller, b.Seller), cmp.Compare(a.SKU, b.SKU))
	})
	if len(rows) == 0 {
		return nil, "Your owner keys hold no agreements. An agreement is made with mesh-adapter agree <seller> <sku> on the machine that holds the owner key."
	}
	return rows, ""
}

func (s *Server) agreementRow(h HeldAgreement, now time.Time, record func(string) (map[string]any, error)) agreementRow {
	row := agreementRow{Seller: h.Seller, SellerName: h.Seller, SKU: h.SKU,
		Approve: Prefix + "agreements/approve?" + url.Values{"sku": {h.SKU}, "seller": {h.Seller}}.Encode()}
	if h.Record.RevokedAt != nil {
		row.RevokedAt = protocol.FormatTime(*h.Record.RevokedAt)
	}
	a, err := commerce.ParseAgreement(h.Record.Agreement)
	if err != nil {
		row.State, row.Why = "unreadable", "The stored agreement cannot be read: "+s.plain(err)
		return row
	}
	row.Digest, row.AgreedAt, row.ExpiresAt = a.SKUDigest, a.AgreedAt, a.ExpiresAt
	rec, err := record(h.Seller)
	var current *commerce.SKU
	if err == nil && rec != nil {
		row.SellerName = cmp.Or(recordName(rec), h.Seller)
		skus, _ := skusOf(rec)
		if i := slices.IndexFunc(skus, func(k commerce.SKU) bool { return k.ID == h.SKU }); i >= 0 {
			current = &skus[i]
		}
	}
	exp, expErr := protocol.ParseTime(a.ExpiresAt)
	switch {
	case h.Record.RevokedAt != nil:
		row.State, row.Why = "revoked", "Revoked: it authorises no new work. Usage before the revocation stays rated."
	case a.ExpiresAt != "" && expErr == nil && !now.Before(exp):
		row.State, row.Why = "expired", "Expired: approve again to keep using this SKU."
	case err != nil:
		row.State, row.Why = "unknown", "The seller's current terms cannot be read right now."
	case current == nil:
		row.State, row.Why = "withdrawn", "The seller does not publish this SKU now, so the agreement covers nothing."
	case current.Digest() != a.SKUDigest:
		row.State, row.Current = "stale", current.Digest()
		row.Why = "Stale: the seller changed the terms (the digest is now " + current.Digest() + "). Requests are refused until an owner approves the new terms."
	default:
		row.State, row.Why = "in-force", "In force: it covers the seller's current terms."
	}
	return row
}

func (s *Server) engagementRows(ctx context.Context, agents []string, names map[string]string, record func(string) (map[string]any, error)) ([]engagementRow, string) {
	if s.engagements == nil {
		return nil, "Engagements cannot be listed on this instance."
	}
	if len(agents) == 0 {
		return nil, "Your account has no agents, so it is party to no engagement."
	}
	list, err := s.engagements.ListForAgents(ctx, agents)
	if err != nil {
		s.log.Warn("commerce: engagements", "err", err)
		return nil, "The engagements cannot be read right now. Try again in a moment."
	}
	name := func(agent string) string {
		if n := names[agent]; n != "" {
			return n
		}
		if rec, err := record(agent); err == nil && rec != nil && recordName(rec) != "" {
			return recordName(rec)
		}
		return agent
	}
	rows := make([]engagementRow, 0, len(list))
	for _, e := range list {
		rows = append(rows, engagementRow{EngagementSummary: e, ClientName: name(e.Client), SellerName: name(e.Seller)})
	}
	if len(rows) == 0 {
		return nil, "Your agents are party to no engagement."
	}
	return rows, ""
}

// plain is an error's sentence for a page, without its code.
func (s *Server) plain(err error) string {
	_, msg := s.messageOf(err)
	return msg
}
