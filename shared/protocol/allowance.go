package protocol

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// Owner allowances, EXT-8 (upstream-notes §4.2). An allowance is a spending
// policy the owner signs for one agent and the agent's node enforces: a cost
// model that converts tokens to micro-units, and ceilings on spend per task,
// per context and per UTC day. The node is the only enforcer, so everything
// here fails closed: a document that does not parse or does not verify
// counts every ceiling as exhausted, never as absent.

// AllowanceVersion is the only document version this code understands.
const AllowanceVersion = 1

// Ceiling scopes: a closed enum. A ceiling with any other scope makes the
// whole document invalid, because an ignored ceiling is an unenforced one.
const (
	ScopeTask    = "task"
	ScopeContext = "context"
	ScopeDay     = "day"
)

// What a node does when admitting work would cross a ceiling.
const (
	// OnExhaustedRefuse refuses at admission with BUDGET_INSUFFICIENT.
	OnExhaustedRefuse = "refuse"
	// OnExhaustedAskOwner holds the work unstarted and asks the owner; the
	// same refusal is sent only if the owner declines.
	OnExhaustedAskOwner = "ask_owner"
)

// CostModel converts metered tokens to money. It is required: a ceiling
// without a declared conversion cannot be metered against.
type CostModel struct {
	Per1kTokensMicro int64  `json:"per_1k_tokens_micro"`
	Currency         string `json:"currency"`
}

// Ceiling caps spend in one scope. TaskID or ContextID, when set, narrow it
// to that one task or context; absent members are omitted from the
// canonical form (never null), which is why both are omitempty.
type Ceiling struct {
	Scope       string `json:"scope"`
	AmountMicro int64  `json:"amount_micro"`
	TaskID      string `json:"task_id,omitempty"`
	ContextID   string `json:"context_id,omitempty"`
}

// Allowance is the owner-signed document.
//
// Its canonical form is produced from the struct alone, so a document with
// members this version does not know is refused at parse time: keeping
// them would need a second representation, and ignoring them would both
// break the signature and, worse, silently drop a restriction.
type Allowance struct {
	V           int       `json:"v"`
	Agent       string    `json:"agent"`
	OwnerKey    string    `json:"owner_key"`
	CostModel   CostModel `json:"cost_model"`
	Ceilings    []Ceiling `json:"ceilings"`
	OnExhausted string    `json:"on_exhausted"`
	UpdatedAt   string    `json:"updated_at"`
	Sig         string    `json:"sig,omitempty"`
}

// allowanceWire has Allowance's fields without its methods, so MarshalJSON
// can canonicalise it without recursing.
type allowanceWire Allowance

// MarshalJSON writes the canonical JSON of a. A nil Ceilings is written as
// [] rather than null: both mean "no ceilings" in Go, but only [] is a
// valid document, and the signature covers whichever bytes were written.
func (a Allowance) MarshalJSON() ([]byte, error) {
	if a.Ceilings == nil {
		a.Ceilings = []Ceiling{}
	}
	return Canonical(allowanceWire(a))
}

// UnmarshalJSON parses and shape-checks a document, so that no decoding
// path can produce an Allowance that ParseAllowance would refuse.
// JSON null leaves a unchanged, the encoding/json convention; the zero
// Allowance it leaves is refused by every check anyway.
func (a *Allowance) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	v, err := ParseAllowance(data)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

func allowanceErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "allowance: "+format, args...)
}

// ParseAllowance shape-checks an allowance document given as JSON text. It
// does not check the signature; see Verify and LoadPolicy.
func ParseAllowance(data []byte) (Allowance, error) {
	v, err := ParseJSON(data)
	if err != nil {
		return Allowance{}, errs.Wrap(errs.InvalidEnvelope, "allowance is not valid JSON", err)
	}
	return AllowanceFromValue(v)
}

var (
	allowanceMembers = map[string]bool{"v": true, "agent": true, "owner_key": true, "cost_model": true,
		"ceilings": true, "on_exhausted": true, "updated_at": true, "sig": true}
	costModelMembers = map[string]bool{"per_1k_tokens_micro": true, "currency": true}
	ceilingMembers   = map[string]bool{"scope": true, "amount_micro": true, "task_id": true, "context_id": true}
)

// unknownMember returns the first member of m (in canonical order, so the
// message is deterministic) that is not in known.
func unknownMember(m map[string]any, known map[string]bool) (string, bool) {
	for _, k := range sortedKeys(m) {
		if !known[k] {
			return k, true
		}
	}
	return "", false
}

// AllowanceFromValue shape-checks a decoded allowance document (the value
// model of ParseJSON). It refuses, as INVALID_ENVELOPE: v other than the
// integer 1; agent or owner_key that is not a user public key; a missing
// cost_model, or one whose rate is not a non-negative integer or whose
// currency is not an ISO 4217 code; a missing ceilings array; a ceiling
// whose scope is outside task|context|day, whose amount_micro is not a
// non-negative integer (fractions included), or whose task_id/context_id is
// present but not a non-empty string; on_exhausted outside refuse|ask_owner;
// updated_at that is not an RFC 3339 instant; a sig that is not a string;
// and any member this version does not know. null is never a stand-in for
// absent. An empty ceilings array is legal: the owner signed "no ceilings".
func AllowanceFromValue(v any) (Allowance, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Allowance{}, allowanceErr("document must be a JSON object")
	}
	if k, bad := unknownMember(m, allowanceMembers); bad {
		return Allowance{}, allowanceErr("unknown member %q (an unrecognised member may be a restriction this node would not enforce)", k)
	}
	var a Allowance

	vv, ok := m["v"]
	if !ok {
		return Allowance{}, allowanceErr("v is required")
	}
	if n, ok := nonNegInt(vv); !ok || n != AllowanceVersion {
		return Allowance{}, allowanceErr("v must be the integer %d", AllowanceVersion)
	}
	a.V = AllowanceVersion

	for _, f := range []struct {
		name string
		dst  *string
	}{{"agent", &a.Agent}, {"owner_key", &a.OwnerKey}} {
		s, ok := m[f.name].(string)
		if !ok || !keys.IsUserPublicKey(s) {
			return Allowance{}, allowanceErr("%s must be a user public key (U followed by 55 base32 characters)", f.name)
		}
		*f.dst = s
	}

	cmv, ok := m["cost_model"]
	if !ok {
		return Allowance{}, allowanceErr("cost_model is required: a ceiling cannot be metered against without one")
	}
	cm, ok := cmv.(map[string]any)
	if !ok {
		return Allowance{}, allowanceErr("cost_model must be an object {per_1k_tokens_micro, currency}")
	}
	if k, bad := unknownMember(cm, costModelMembers); bad {
		return Allowance{}, allowanceErr("cost_model has unknown member %q", k)
	}
	rate, ok := nonNegInt(cm["per_1k_tokens_micro"])
	if !ok {
		return Allowance{}, allowanceErr("cost_model.per_1k_tokens_micro must be a non-negative integer of micro-units")
	}
	cur, _ := cm["currency"].(string)
	if !IsCurrency(cur) {
		return Allowance{}, allowanceErr("cost_model.currency must be an ISO 4217 code such as USD")
	}
	a.CostModel = CostModel{Per1kTokensMicro: rate, Currency: cur}

	cv, ok := m["ceilings"]
	if !ok {
		return Allowance{}, allowanceErr("ceilings is required (an empty array states that there are none)")
	}
	list, ok := cv.([]any)
	if !ok {
		return Allowance{}, allowanceErr("ceilings must be an array")
	}
	a.Ceilings = make([]Ceiling, 0, len(list))
	for i, item := range list {
		c, err := ceilingFromValue(item)
		if err != nil {
			return Allowance{}, allowanceErr("ceilings[%d]: %v", i, err)
		}
		a.Ceilings = append(a.Ceilings, c)
	}

	switch oe, _ := m["on_exhausted"].(string); oe {
	case OnExhaustedRefuse, OnExhaustedAskOwner:
		a.OnExhausted = oe
	default:
		return Allowance{}, allowanceErr("on_exhausted must be %q or %q", OnExhaustedRefuse, OnExhaustedAskOwner)
	}

	ua, ok := m["updated_at"].(string)
	if !ok {
		return Allowance{}, allowanceErr("updated_at must be an RFC 3339 instant string")
	}
	if _, err := ParseTime(ua); err != nil {
		return Allowance{}, allowanceErr("updated_at %q is not an RFC 3339 instant", ua)
	}
	a.UpdatedAt = ua

	if sv, present := m["sig"]; present {
		s, ok := sv.(string)
		if !ok || s == "" {
			// An empty sig would vanish from the canonical form (omitempty)
			// and leave a document that claims to be signed but is not.
			return Allowance{}, allowanceErr("sig must be a non-empty string when present")
		}
		a.Sig = s
	}
	return a, nil
}

func ceilingFromValue(v any) (Ceiling, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Ceiling{}, fmt.Errorf("must be an object {scope, amount_micro, task_id?, context_id?}")
	}
	if k, bad := unknownMember(m, ceilingMembers); bad {
		return Ceiling{}, fmt.Errorf("unknown member %q", k)
	}
	var c Ceiling
	switch s, _ := m["scope"].(string); s {
	case ScopeTask, ScopeContext, ScopeDay:
		c.Scope = s
	default:
		return Ceiling{}, fmt.Errorf("scope must be one of task, context, day (got %s)", describeValue(m["scope"]))
	}
	av, ok := m["amount_micro"]
	if !ok {
		return Ceiling{}, fmt.Errorf("amount_micro is required")
	}
	amt, ok := nonNegInt(av)
	if !ok {
		return Ceiling{}, fmt.Errorf("amount_micro must be a non-negative integer of micro-units (got %s)", describeValue(av))
	}
	c.AmountMicro = amt
	for _, f := range []struct {
		name string
		dst  *string
	}{{"task_id", &c.TaskID}, {"context_id", &c.ContextID}} {
		raw, present := m[f.name]
		if !present {
			continue
		}
		s, ok := raw.(string)
		if !ok || s == "" {
			// "" would be dropped from the canonical form and break the
			// signature; null is never a stand-in for absent.
			return Ceiling{}, fmt.Errorf("%s must be a non-empty string when present", f.name)
		}
		*f.dst = s
	}
	return c, nil
}

// describeValue renders a decoded JSON value for an error message, bounded
// so a hostile document cannot inflate the message.
func describeValue(v any) string {
	b, err := Canonical(v)
	if err != nil {
		return fmt.Sprintf("%T", v)
	}
	if len(b) > 64 {
		return string(b[:61]) + "..."
	}
	return string(b)
}

// Validate re-checks the shape of an Allowance built in Go (for example
// before signing it), by the same rules ParseAllowance applies.
func (a Allowance) Validate() error {
	b, err := a.MarshalJSON()
	if err != nil {
		return allowanceErr("%v", err)
	}
	v, err := ParseJSON(b)
	if err != nil {
		return allowanceErr("%v", err)
	}
	_, err = AllowanceFromValue(v)
	return err
}

// CanonicalUnsigned is the canonical JSON of the document without sig: the
// bytes (after the domain tag) that the owner's signature covers.
func (a Allowance) CanonicalUnsigned() ([]byte, error) {
	a.Sig = ""
	return a.MarshalJSON()
}

// SignedBytes is TagAllowance + "\n" + CanonicalUnsigned.
func (a Allowance) SignedBytes() ([]byte, error) {
	c, err := a.CanonicalUnsigned()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(TagAllowance)+1+len(c))
	out = append(out, TagAllowance...)
	out = append(out, '\n')
	return append(out, c...), nil
}

// Verify checks the owner's signature: base64url Ed25519 by owner_key over
// TagAllowance + "\n" + the canonical document without sig. A missing or
// non-verifying signature is IDENTITY_MISMATCH. Shape is ParseAllowance's
// job; Verify assumes a document that passed it.
func (a Allowance) Verify() error {
	if a.Sig == "" {
		return errs.New(errs.IdentityMismatch, "allowance is not signed; an unsigned allowance is never enforced as written")
	}
	msg, err := a.SignedBytes()
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, "allowance cannot be canonicalised for verification", err)
	}
	if err := VerifyString(a.OwnerKey, msg, a.Sig, Base64URL); err != nil {
		return errs.Wrap(errs.IdentityMismatch, "allowance signature does not verify against owner_key", err)
	}
	return nil
}

// SignAllowance signs a in place with the owner's key. OwnerKey is set to
// owner's public key when empty; a different OwnerKey is refused, since the
// document would then name one owner and carry another's signature. The
// document's shape is checked first: signing something every node refuses
// only defers the error to the node.
func SignAllowance(a *Allowance, owner keys.Signer) error {
	if a.OwnerKey == "" {
		a.OwnerKey = owner.Public()
	}
	if a.OwnerKey != owner.Public() {
		return errs.Newf(errs.IdentityMismatch, "allowance owner_key %s cannot be signed by %s", a.OwnerKey, owner.Public())
	}
	if err := a.Validate(); err != nil {
		return fmt.Errorf("sign allowance: %w", err)
	}
	msg, err := a.SignedBytes()
	if err != nil {
		return fmt.Errorf("sign allowance: %w", err)
	}
	a.Sig = Base64URL.Encode(owner.Sign(msg))
	return nil
}

// EstimateTokens is the admission-time token estimate for text of chars
// characters: ceil(chars / 4). Negative counts estimate to 0.
func EstimateTokens(chars int) int64 {
	if chars <= 0 {
		return 0
	}
	n := int64(chars)
	q := n / 4
	if n%4 != 0 {
		q++
	}
	return q
}

// MeterCost is EXT-8's metering rule, floor(tokens × per1kMicro / 1000), in
// integer arithmetic so two nodes metering the same invocation agree to the
// micro-unit. The product is taken in 128 bits; a result beyond int64
// saturates at math.MaxInt64, which exceeds every ceiling (the safe side).
// Negative inputs meter as 0: neither counts nor rates go below zero.
func MeterCost(tokens, per1kMicro int64) int64 {
	if tokens <= 0 || per1kMicro <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(tokens), uint64(per1kMicro))
	if hi >= 1000 { // the quotient would not fit in 64 bits
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, 1000)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// AppliesTo reports whether c covers work in task taskID and context
// contextID. A ceiling narrowed by task_id covers only that task and one
// narrowed by context_id only that context; an unnarrowed ceiling covers all
// work (each task, each context, each day is then accounted separately).
// Which ceiling binds is not decided here: see BindingCeiling.
func (c Ceiling) AppliesTo(taskID, contextID string) bool {
	if c.TaskID != "" && c.TaskID != taskID {
		return false
	}
	if c.ContextID != "" && c.ContextID != contextID {
		return false
	}
	return true
}

// CeilingSpend is an applicable ceiling with the spend already accounted to
// its scope.
type CeilingSpend struct {
	Ceiling
	SpentMicro int64 `json:"spent_micro"`
}

// Remaining is AmountMicro − SpentMicro, floored at 0. A negative spend is
// read as 0: a spend report can use up headroom, never add to it.
func (c CeilingSpend) Remaining() int64 {
	spent := max(c.SpentMicro, 0)
	if spent >= c.AmountMicro {
		return 0
	}
	return c.AmountMicro - spent
}

// BindingCeiling picks the ceiling that decides admission: every applicable
// ceiling applies at once, and the binding one is whichever has the smallest
// remaining amount (specificity decides coverage, never precedence; the
// first listed wins a tie). The work is admitted iff the estimate does not
// exceed that remainder (equal is admitted). With no applicable ceilings
// the work is admitted and the remainder is math.MaxInt64.
func BindingCeiling(applicable []CeilingSpend, estimateMicro int64) (binding CeilingSpend, remainingMicro int64, admit bool) {
	remainingMicro = math.MaxInt64
	for i, c := range applicable {
		if r := c.Remaining(); i == 0 || r < remainingMicro {
			binding, remainingMicro = c, r
		}
	}
	return binding, remainingMicro, max(estimateMicro, 0) <= remainingMicro
}

// DayKey is the ledger key of the UTC calendar day containing t.
func DayKey(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// SpendLookup reports the metered spend already accounted to one scope key:
// a task id for ScopeTask, a context id for ScopeContext, a DayKey for
// ScopeDay.
type SpendLookup interface {
	SpentMicro(scope, key string) int64
}

// SpendFunc adapts a function to SpendLookup.
type SpendFunc func(scope, key string) int64

// SpentMicro calls f.
func (f SpendFunc) SpentMicro(scope, key string) int64 { return f(scope, key) }

// Decision is the outcome of admitting one piece of work against a Policy.
type Decision struct {
	// Admit is true when the work may start now.
	Admit bool
	// Binding is the ceiling that decided (zero when none applied or the
	// policy failed closed), with the spend accounted to it.
	Binding CeilingSpend
	// Remaining is Binding's headroom in micro-units: math.MaxInt64 when no
	// ceiling applied, 0 when the policy failed closed.
	Remaining int64
	// Hold is true when the work does not fit and the document says
	// ask_owner: do not refuse, keep the work unstarted and ask the owner.
	// If the owner raises the ceiling, admit again under the new document;
	// if the owner declines, send Decline().
	Hold bool
	// Refusal is the BUDGET_INSUFFICIENT error to send now, set only when
	// the work is refused outright (neither admitted nor held), so that a
	// caller that sends any non-nil Refusal can never refuse held work.
	// details.estimate carries the estimate, wire-identical to a budget
	// refusal so the owner's policy is not disclosed.
	Refusal *errs.Error
	// Estimate is the admitted or refused estimate in the document's
	// currency (NoCurrency when the policy failed closed).
	Estimate Money
}

// Decline is the refusal for work that was not admitted: Refusal when set,
// otherwise the same BUDGET_INSUFFICIENT for held work whose owner declined.
// It is nil for admitted work.
func (d Decision) Decline() *errs.Error {
	switch {
	case d.Admit:
		return nil
	case d.Refusal != nil:
		return d.Refusal
	}
	return BudgetInsufficient(d.Estimate, "")
}

// NoCurrency is ISO 4217's code for "no currency involved", used in a
// refusal when a fail-closed policy has no trustworthy cost model.
const NoCurrency = "XXX"

// Policy is the enforceable form of an allowance. It never fails to exist:
// a document that is malformed, unsigned or not signed by its owner_key
// yields a policy that refuses every admission (every ceiling counts as
// exhausted) and reports why through Err. A nil *Policy behaves the same.
// A Policy is immutable, so one value serves concurrent admissions; a new
// document means a new Policy.
type Policy struct {
	doc Allowance
	err error // nil iff doc passed shape and signature checks
}

// LoadPolicy parses and verifies an allowance document. It never returns an
// error: on any failure the policy fails closed (see Policy).
//
// LoadPolicy cannot know which agent the node enforces for or who owns it:
// the signature only proves the document was signed by the key it names.
// A node that knows both must call For.
func LoadPolicy(data []byte) *Policy {
	a, err := ParseAllowance(data)
	if err != nil {
		return &Policy{err: err}
	}
	return NewPolicy(a)
}

// NewPolicy checks a decoded or Go-built allowance (shape, then signature)
// and returns its policy, failing closed like LoadPolicy.
func NewPolicy(a Allowance) *Policy {
	p := &Policy{doc: a}
	if err := a.Validate(); err != nil {
		p.err = err
	} else if err := a.Verify(); err != nil {
		p.err = err
	}
	return p
}

// For returns a policy that additionally fails closed unless the document
// governs agent and is signed by ownerKey. An empty argument skips that
// check. Without it, anyone could sign a generous allowance naming
// themselves as owner.
func (p *Policy) For(agent, ownerKey string) *Policy {
	if p == nil {
		return &Policy{err: errs.New(errs.IdentityMismatch, "no allowance loaded")}
	}
	if p.err != nil {
		return p
	}
	switch {
	case agent != "" && p.doc.Agent != agent:
		return &Policy{doc: p.doc, err: errs.Newf(errs.IdentityMismatch, "allowance governs agent %s, not %s", p.doc.Agent, agent)}
	case ownerKey != "" && p.doc.OwnerKey != ownerKey:
		return &Policy{doc: p.doc, err: errs.Newf(errs.IdentityMismatch, "allowance is signed by %s, not by the agent's owner %s", p.doc.OwnerKey, ownerKey)}
	}
	return p
}

// Err is nil for an enforceable policy and otherwise says why the policy
// fails closed (a *errs.Error: INVALID_ENVELOPE for shape, IDENTITY_MISMATCH
// for signature or parties).
func (p *Policy) Err() error {
	if p == nil {
		return errs.New(errs.IdentityMismatch, "no allowance loaded")
	}
	return p.err
}

// Document returns the allowance behind the policy and whether it is
// enforceable. A document that parsed but did not verify is returned with
// false, for diagnostics only.
func (p *Policy) Document() (Allowance, bool) {
	if p == nil {
		return Allowance{}, false
	}
	return p.doc, p.err == nil
}

// Meter is the cost of tokens under the document's cost model. A
// fail-closed policy has no trustworthy rate and meters nothing; its
// admissions are refused anyway.
func (p *Policy) Meter(tokens int64) Money {
	if p == nil || p.err != nil {
		return Money{Currency: p.currency()}
	}
	return Money{AmountMicro: MeterCost(tokens, p.doc.CostModel.Per1kTokensMicro), Currency: p.doc.CostModel.Currency}
}

// currency is the currency refusals are quoted in: the document's when it
// is at least well-formed, NoCurrency otherwise.
func (p *Policy) currency() string {
	if p != nil && IsCurrency(p.doc.CostModel.Currency) {
		return p.doc.CostModel.Currency
	}
	return NoCurrency
}

// Admit decides whether work in taskID/contextID, starting on the UTC day of
// day and estimated at estimateMicro, fits under every applicable ceiling,
// given the spend spent reports (nil means nothing spent yet).
//
// Each applicable ceiling is charged the spend of its own scope: the task's
// spend for a task ceiling, the context's for a context ceiling, the day's
// for a day ceiling. Work with no task or context id yet is charged nothing
// in that scope, so such a ceiling still bounds this one estimate.
func (p *Policy) Admit(taskID, contextID string, day time.Time, estimateMicro int64, spent SpendLookup) Decision {
	estimate := Money{AmountMicro: max(estimateMicro, 0), Currency: p.currency()}
	if p == nil || p.err != nil {
		// Fail closed, and never hold: the document's ask_owner is no more
		// trustworthy than the rest of it.
		return Decision{Refusal: BudgetInsufficient(estimate, ""), Estimate: estimate}
	}
	dayKey := DayKey(day)
	applicable := make([]CeilingSpend, 0, len(p.doc.Ceilings))
	for _, c := range p.doc.Ceilings {
		if !c.AppliesTo(taskID, contextID) {
			continue
		}
		var key string
		switch c.Scope {
		case ScopeTask:
			key = taskID
		case ScopeContext:
			key = contextID
		case ScopeDay:
			key = dayKey
		}
		var s int64
		if spent != nil && key != "" {
			s = spent.SpentMicro(c.Scope, key)
		}
		applicable = append(applicable, CeilingSpend{Ceiling: c, SpentMicro: s})
	}
	binding, remaining, ok := BindingCeiling(applicable, estimate.AmountMicro)
	d := Decision{Admit: ok, Binding: binding, Remaining: remaining, Estimate: estimate}
	switch {
	case ok:
	case p.doc.OnExhausted == OnExhaustedAskOwner:
		d.Hold = true
	default:
		d.Refusal = BudgetInsufficient(estimate, "")
	}
	return d
}

// Ledger accounts metered spend to its task, its context and the UTC day of
// the metering instant, and answers SpendLookup. The zero Ledger is ready to
// use. It only grows: callers Forget finished tasks, closed contexts and
// past days.
type Ledger struct {
	mu    sync.Mutex
	spent map[ledgerKey]int64
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{spent: make(map[ledgerKey]int64)} }

type ledgerKey struct{ scope, key string }

var _ SpendLookup = (*Ledger)(nil)

// Record adds micro to taskID, contextID and the UTC day of at. An empty id
// is not a scope and is skipped; a negative amount is ignored (spend is
// never refunded by metering). Sums saturate rather than wrap.
func (l *Ledger) Record(taskID, contextID string, at time.Time, micro int64) {
	if micro <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spent == nil {
		l.spent = make(map[ledgerKey]int64)
	}
	add := func(scope, key string) {
		if key == "" {
			return
		}
		k := ledgerKey{scope, key}
		cur := l.spent[k]
		if cur > math.MaxInt64-micro {
			l.spent[k] = math.MaxInt64
			return
		}
		l.spent[k] = cur + micro
	}
	add(ScopeTask, taskID)
	add(ScopeContext, contextID)
	add(ScopeDay, DayKey(at))
}

// SpentMicro implements SpendLookup.
func (l *Ledger) SpentMicro(scope, key string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spent[ledgerKey{scope, key}]
}

// Forget drops the spend accounted to one scope key.
func (l *Ledger) Forget(scope, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.spent, ledgerKey{scope, key})
}
