// Package allowance is the adapter's side of owner allowances (spec §4.2
// "allowance set/show/clear", upstream-notes §4.2, EXT-8): the owner's
// signed limit on the agent's own model spending, kept in the adapter's
// state directory, enforced at admission and charged after each harness
// invocation. It also reads the amounts and estimates people type on the
// command line (ParseMoney, ParseEstimate).
//
// The document, its signature, metering arithmetic and the admission
// decision are shared/protocol's; this package only stores, loads and
// wires them. Everything fails closed: a stored allowance that does not
// verify, or a spend ledger that cannot be read, counts every ceiling as
// exhausted. Only the absence of an allowance file means "no allowance".
package allowance

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// File names inside the state directory.
const (
	PolicyFile = "allowance.json"
	LedgerFile = "allowance-ledger.json"
)

// Errors a caller may want to tell apart.
var (
	// ErrPer1kRequired: a set that starts a new document (none stored, or
	// the stored one is untrusted) must declare the cost model.
	ErrPer1kRequired = errors.New("--per-1k-tokens is required")
	// ErrCurrency: amounts in one document share one currency.
	ErrCurrency = errors.New("currency mismatch")
	// ErrFailsClosed: the stored allowance does not verify, so nothing can
	// be metered against it (and nothing is admitted under it).
	ErrFailsClosed = errors.New("allowance fails closed")
)

// Store keeps one agent's allowance and spend ledger in a state directory.
// Every call reads the files afresh, so an `allowance set` run in another
// process takes effect at the next admission of the running adapter.
// Metering writes the ledger; only one process (the running adapter) may
// meter per directory, and a Store serialises its own calls.
type Store struct {
	dir   string
	agent string
	owner keys.Signer
	mu    sync.Mutex // orders Set/Clear and ledger read-modify-writes
}

// Open prepares a Store over dir (created 0700 if missing) for the agent
// whose public key is agent, owned by owner. owner's public key is the only
// one whose allowance is enforced; its Sign is used only by Set.
func Open(dir, agent string, owner keys.Signer) (*Store, error) {
	if !keys.IsUserPublicKey(agent) {
		return nil, fmt.Errorf("open allowance store: agent %q is not a user public key", agent)
	}
	if owner == nil || !keys.IsUserPublicKey(owner.Public()) {
		return nil, errors.New("open allowance store: an owner key is required")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open allowance store: %w", err)
	}
	return &Store{dir: dir, agent: agent, owner: owner}, nil
}

func (s *Store) policyPath() string { return filepath.Join(s.dir, PolicyFile) }
func (s *Store) ledgerPath() string { return filepath.Join(s.dir, LedgerFile) }

// Policy returns the stored allowance as an enforceable policy, checked
// with protocol.LoadPolicy(...).For(agent, owner). present is false when
// there is no allowance file: there is no allowance and everything is
// admitted (p is then nil, which protocol would treat as fail-closed, so
// callers must look at present first). A file that exists but cannot be
// read, parsed or verified, or that governs another agent or is signed by
// anyone but the owner, yields a policy that fails closed (p.Err() says
// why) until another Set replaces it.
func (s *Store) Policy() (p *protocol.Policy, present bool) {
	p, present, _ = s.load()
	return p, present
}

// load is Policy plus the read error, which Show reports.
func (s *Store) load() (p *protocol.Policy, present bool, readErr error) {
	data, err := os.ReadFile(s.policyPath())
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, false, nil
	case err != nil:
		// A nil *Policy fails closed; the reason is returned separately
		// because protocol's own message would say only "no allowance".
		return nil, true, fmt.Errorf("read %s: %w", PolicyFile, err)
	}
	return protocol.LoadPolicy(data).For(s.agent, s.owner.Public()), true, nil
}

// failReason says why a present policy fails closed, or "" when it holds.
func failReason(p *protocol.Policy, readErr error) string {
	if readErr != nil {
		return readErr.Error()
	}
	if err := p.Err(); err != nil {
		return err.Error()
	}
	return ""
}

// SetRequest is one `allowance set` command.
type SetRequest struct {
	// Amount is the ceiling.
	Amount protocol.Money
	// Per1k is the price of 1,000 tokens (--per-1k-tokens): required when
	// the set starts a new document, kept from the stored one when nil.
	Per1k *protocol.Money
	// Context (--context) narrows the ceiling to one context id. Alone it
	// makes a context ceiling; with ScopeTask, a per-task ceiling that
	// applies only to tasks in that context.
	Context string
	// ScopeTask (--scope task) makes a per-task ceiling: each task is
	// accounted separately.
	ScopeTask bool
	// OnExhausted is refuse, ask_owner or the flag spelling ask-owner; ""
	// keeps the stored behaviour (refuse on a new document).
	OnExhausted string
}

// ceiling is the ceiling the request sets. Without --scope task or
// --context it is a day ceiling: the spec's default is per UTC day.
func (r SetRequest) ceiling() protocol.Ceiling {
	c := protocol.Ceiling{Scope: protocol.ScopeDay, AmountMicro: r.Amount.AmountMicro, ContextID: r.Context}
	switch {
	case r.ScopeTask:
		c.Scope = protocol.ScopeTask
	case r.Context != "":
		c.Scope = protocol.ScopeContext
	}
	return c
}

func (r SetRequest) onExhausted() (string, error) {
	switch strings.ReplaceAll(r.OnExhausted, "-", "_") {
	case "":
		return "", nil
	case protocol.OnExhaustedRefuse:
		return protocol.OnExhaustedRefuse, nil
	case protocol.OnExhaustedAskOwner:
		return protocol.OnExhaustedAskOwner, nil
	}
	return "", fmt.Errorf("--on-exhausted %q: use refuse or ask-owner", r.OnExhausted)
}

// validate checks what can be checked without the stored document.
func (r SetRequest) validate() error {
	if err := checkMoney("amount", r.Amount); err != nil {
		return err
	}
	if r.Per1k != nil {
		if err := checkMoney("--per-1k-tokens", *r.Per1k); err != nil {
			return err
		}
		if r.Per1k.Currency != r.Amount.Currency {
			return fmt.Errorf("%w: the amount is in %s but --per-1k-tokens is in %s; both must be in the same currency",
				ErrCurrency, r.Amount.Currency, r.Per1k.Currency)
		}
	}
	if r.Context != "" && (strings.TrimSpace(r.Context) != r.Context || strings.IndexFunc(r.Context, unicode.IsControl) >= 0 || !utf8.ValidString(r.Context)) {
		return fmt.Errorf("--context %q: a context id is valid UTF-8 with no surrounding spaces or control characters", r.Context)
	}
	_, err := r.onExhausted()
	return err
}

// checkMoney refuses what a signed document could not carry.
func checkMoney(what string, m protocol.Money) error {
	switch {
	case !protocol.IsCurrency(m.Currency):
		return fmt.Errorf("%s: currency %q is not an ISO 4217 code", what, m.Currency)
	case m.AmountMicro < 0 || m.AmountMicro > protocol.MaxSafeInteger:
		return fmt.Errorf("%s: %d micro-units is outside 0..%d", what, m.AmountMicro, int64(protocol.MaxSafeInteger))
	}
	return nil
}

// Set applies one `allowance set` and saves the re-signed document.
//
// The stored document is the base only if it verifies as this agent's,
// signed by the owner: re-signing a document that failed verification
// would launder whatever was tampered into it, so an untrusted file is
// replaced by a new document holding only this ceiling (and, like a first
// set, needs Per1k). On a trusted base the ceiling with the same scope,
// context_id and task_id is replaced in place and the others are kept, as
// are the cost model (unless Per1k is given) and on_exhausted (unless
// given). The document has one currency; changing it needs Clear first.
func (s *Store) Set(req SetRequest, now time.Time) (protocol.Allowance, error) {
	if err := req.validate(); err != nil {
		return protocol.Allowance{}, fmt.Errorf("allowance set: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	doc, err := s.base(req)
	if err != nil {
		return protocol.Allowance{}, fmt.Errorf("allowance set: %w", err)
	}
	// A fresh document has no currency yet; a stored one keeps its own,
	// since its other ceilings are amounts in it.
	if cur := doc.CostModel.Currency; cur != "" && cur != req.Amount.Currency {
		return protocol.Allowance{}, fmt.Errorf("allowance set: %w: the allowance is kept in %s, the amount is in %s (run `allowance clear` first to start over in %s)",
			ErrCurrency, cur, req.Amount.Currency, req.Amount.Currency)
	}
	if req.Per1k != nil {
		doc.CostModel = protocol.CostModel{Per1kTokensMicro: req.Per1k.AmountMicro, Currency: req.Per1k.Currency}
	}
	doc.Ceilings = putCeiling(doc.Ceilings, req.ceiling())
	if oe, _ := req.onExhausted(); oe != "" {
		doc.OnExhausted = oe
	}
	doc.UpdatedAt = protocol.FormatTime(now)
	doc.Sig = ""
	if err := protocol.SignAllowance(&doc, s.owner); err != nil {
		return protocol.Allowance{}, fmt.Errorf("allowance set: %w", err)
	}
	if err := s.savePolicy(doc); err != nil {
		return protocol.Allowance{}, fmt.Errorf("allowance set: %w", err)
	}
	return doc, nil
}

// base is the document a Set starts from: the stored one when it is
// trusted, otherwise a fresh one, which needs the request's Per1k.
func (s *Store) base(req SetRequest) (protocol.Allowance, error) {
	p, present, readErr := s.load()
	if present && readErr == nil && p.Err() == nil {
		doc, _ := p.Document()
		doc.Ceilings = append([]protocol.Ceiling(nil), doc.Ceilings...)
		return doc, nil
	}
	if req.Per1k == nil {
		if present {
			return protocol.Allowance{}, fmt.Errorf("%w: the stored allowance fails verification (%s), so none of it is carried over and this set starts a new document; give --per-1k-tokens <price>",
				ErrPer1kRequired, failReason(p, readErr))
		}
		return protocol.Allowance{}, fmt.Errorf("%w on the first set: give the price of 1,000 tokens, e.g. --per-1k-tokens $0.0015", ErrPer1kRequired)
	}
	return protocol.Allowance{
		V:           protocol.AllowanceVersion,
		Agent:       s.agent,
		OwnerKey:    s.owner.Public(),
		OnExhausted: protocol.OnExhaustedRefuse,
	}, nil
}

// putCeiling replaces the ceiling with c's scope and narrowing, keeping
// its position (order only breaks ties between equal remainders), or
// appends c.
func putCeiling(list []protocol.Ceiling, c protocol.Ceiling) []protocol.Ceiling {
	for i, old := range list {
		if old.Scope == c.Scope && old.ContextID == c.ContextID && old.TaskID == c.TaskID {
			list[i] = c
			return list
		}
	}
	return append(list, c)
}

// savePolicy writes the signed canonical document (plus a newline) to
// allowance.json, atomically and 0600.
func (s *Store) savePolicy(doc protocol.Allowance) error {
	b, err := doc.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode allowance: %w", err)
	}
	return writeDurable(s.policyPath(), append(b, '\n'))
}

// Clear removes the allowance (the agent is then unlimited). The spend
// ledger is kept: today's spend still counts if an allowance is set again.
// Clearing when there is none is not an error.
func (s *Store) Clear() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(s.policyPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("allowance clear: %w", err)
	}
	syncDir(s.dir)
	return nil
}

// Admit decides whether work in taskID/contextID whose prompt is promptChars
// characters may start at now. The estimate is the prompt's tokens
// (ceil(chars/4)) at the allowance's rate; the output is not known yet and
// is charged by Meter. With no allowance file everything is admitted. A
// policy that fails closed refuses (never holds), and an unreadable ledger
// counts every ceiling as exhausted.
func (s *Store) Admit(taskID, contextID string, promptChars int, now time.Time) protocol.Decision {
	p, present, _ := s.load()
	if !present {
		return protocol.Decision{Admit: true, Remaining: math.MaxInt64}
	}
	estimate := p.Meter(protocol.EstimateTokens(promptChars))
	var spent protocol.SpendLookup = exhausted
	if l, err := readLedger(s.ledgerPath()); err == nil {
		spent = l.lookup(estimate.Currency)
	}
	return p.Admit(taskID, contextID, now, estimate.AmountMicro, spent)
}

// Meter charges one finished harness invocation: ceil((prompt+output)/4)
// tokens (the spec meters "ceil(chars/4) of prompt plus output", one
// rounding over the sum) at the allowance's rate, floored to the
// micro-unit, accounted to the task, its context and the UTC day of at,
// and saved before Meter returns. It returns the cost.
//
// With no allowance file nothing is metered (there is no rate) and the
// zero Money is returned. Under a policy that fails closed the rate is
// untrusted: nothing is metered and the error wraps ErrFailsClosed. A
// ledger that cannot be read is left untouched (rewriting it would
// discard the spend it holds) and reported.
func (s *Store) Meter(taskID, contextID string, promptChars, outputChars int, at time.Time) (protocol.Money, error) {
	p, present, readErr := s.load()
	if !present {
		return protocol.Money{}, nil
	}
	if reason := failReason(p, readErr); reason != "" {
		return protocol.Money{}, fmt.Errorf("meter: %w (%s): invocation not metered", ErrFailsClosed, reason)
	}
	cost := p.Meter(protocol.EstimateTokens(addChars(promptChars, outputChars)))
	if cost.AmountMicro <= 0 {
		return cost, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := readLedger(s.ledgerPath())
	if err != nil {
		return cost, fmt.Errorf("meter: %w; not overwriting it, invocation not recorded", err)
	}
	l.record(taskID, contextID, at, cost)
	l.pruneDays()
	if err := saveLedger(s.ledgerPath(), l); err != nil {
		return cost, fmt.Errorf("meter: save spend ledger: %w", err)
	}
	return cost, nil
}

// addChars sums two character counts, negatives as zero, saturating
// rather than wrapping so a huge invocation never meters as small.
func addChars(a, b int) int {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}
