package credential

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
)

// NodeRequest is the body of POST /v1/node-credential (spec §4.6). TS is a
// pointer so that a missing ts is told apart from 0.
type NodeRequest struct {
	NodeID  string     `json:"node_id"`
	Agents  []AgentSig `json:"agents"`
	TS      *int64     `json:"ts"`
	NodeSig string     `json:"node_sig"`
	// PrivateInbox asks for no shared _INBOX.> grant (BootstrapRequest).
	// It is outside the signed string: it only ever narrows the credential.
	PrivateInbox bool `json:"private_inbox,omitempty"`
	// Client is the caller's rate-limit key (httpx.ClientKey) and Network
	// its network's (httpx.NetworkKey), set by the handler, never read from
	// the body.
	Client  string `json:"-"`
	Network string `json:"-"`
}

// AgentSig is one roster entry: the agent's consent to this node.
type AgentSig struct {
	ID  string `json:"id"`
	Sig string `json:"sig"`
}

// NodeResult is the 200 answer.
type NodeResult struct {
	OK        bool           `json:"ok"`
	JWT       string         `json:"jwt"`
	NodeID    string         `json:"node_id"`
	Agents    []string       `json:"agents"`
	ExpiresAt any            `json:"expires_at"` // ISO string, or null without expiry
	Mesh      map[string]any `json:"mesh"`
	// InboxPrefix is the reply prefix the node sets on its connection
	// (BootstrapResult.InboxPrefix).
	InboxPrefix string `json:"inbox_prefix"`
}

func bad(msg string) error { return errs.New(errs.InvalidRequest, msg) }

func unauth(code errs.Code, msg string) *errs.Error {
	return errs.New(code, msg).WithStatus(http.StatusUnauthorized)
}

// checkRoster is the shape part of §7.3, in its order.
func checkRoster(r NodeRequest) ([]string, error) {
	if r.NodeID == "" || r.TS == nil || r.NodeSig == "" || len(r.Agents) == 0 {
		return nil, bad("node_id, ts, node_sig, agents[] required")
	}
	if !keys.IsUserPublicKey(r.NodeID) {
		return nil, bad("node_id must be a user public key")
	}
	if len(r.Agents) > MaxRoster {
		return nil, bad("a node credential covers at most 16 agents")
	}
	ids := make([]string, 0, len(r.Agents))
	seen := map[string]bool{}
	for _, a := range r.Agents {
		if a.ID == "" || a.Sig == "" {
			return nil, bad("every agents[] entry needs id and sig")
		}
		if !keys.IsUserPublicKey(a.ID) {
			return nil, bad("agent id is not a user public key")
		}
		if seen[a.ID] {
			return nil, bad("duplicate agent id")
		}
		seen[a.ID] = true
		ids = append(ids, a.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

// NodeCredential mints or renews a node credential (spec §4.6). Every key on
// the roster proves possession before anything else is looked at; then the
// roster's standing is checked in the store, and the mint is recorded in
// the same transaction. The credential being renewed is neither needed nor
// looked at: authority is possession of the keys.
func (s *Service) NodeCredential(ctx context.Context, r NodeRequest) (NodeResult, error) {
	ids, err := checkRoster(r)
	if err != nil {
		return NodeResult{}, err
	}
	now := s.now()
	if d := now.Sub(time.Unix(*r.TS, 0)); d > TimestampSkew || d < -TimestampSkew {
		return NodeResult{}, unauth(errs.Unauthorized, "stale timestamp; re-sign with current time")
	}
	if err := verifyRoster(r, ids); err != nil {
		return NodeResult{}, err
	}
	if err := s.minting(); err != nil {
		return NodeResult{}, err
	}
	var expires time.Time
	if !s.cfg.NoExpiry {
		expires = s.expiry(now)
	}
	var res NodeResult
	var minted Mint
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		accountID, hs, err := standing(tx, ids)
		if err != nil {
			return err
		}
		// One key no account owns makes the roster unowned: an account
		// holder must not lift every limit from fifteen fresh keys by
		// adding one agent of its own (review finding).
		unowned := accountID == "" || slices.ContainsFunc(hs, func(h hosts) bool { return h.owner == "" })
		rev, err := revokedAt(tx, r.NodeID)
		if err != nil {
			return err
		}
		if unowned {
			// No account vouches for these keys, and anyone can make keys:
			// count the mint against the caller's address, the node and
			// each agent (docs/security.md). Take reads, then writes: every
			// other read of this transaction is done.
			if err := ratelimit.Take(tx, CollRateLimits, now, s.unownedLimits(r.Client, r.Network, r.NodeID, ids)...); err != nil {
				return limitErr(err)
			}
		}
		// Signed inside the transaction: a revocation serialised after it
		// is later than the JWT's issue time, so the broker refuses it.
		tok, err := s.mint(mintSpec{kind: creds.KindNode, key: r.NodeID, name: "node", hosted: ids, expires: expires, revokedAt: rev, shared: !r.PrivateInbox && !unowned, class: classOf(unowned)})
		if err != nil {
			return err
		}
		for i, id := range ids {
			if err := rememberHost(tx, id, hs[i], r.NodeID); err != nil {
				return err
			}
		}
		m := Mint{ID: protocol.NewID(), Kind: "node", Key: r.NodeID, Agents: ids, AccountID: accountID, IssuedAt: ms(now)}
		if !expires.IsZero() {
			m.ExpiresAt = ms(expires)
		}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		minted = m
		res = NodeResult{OK: true, JWT: tok, NodeID: r.NodeID, Agents: ids, ExpiresAt: isoOrNil(m.ExpiresAt), Mesh: s.meshBlock(),
			InboxPrefix: protocol.PrivateInboxPrefix(r.NodeID)}
		return nil
	})
	if err != nil {
		var e *errs.Error
		if errors.As(err, &e) {
			return NodeResult{}, err
		}
		return NodeResult{}, errs.Wrap(errs.Unavailable, "cannot check the node's standing now; retry; the current credential is unaffected", err)
	}
	s.keepMint(ctx, minted)
	return res, nil
}

// verifyRoster checks node_sig over the request and every agent's
// consent, and refuses as the first failure in that order (the node's,
// then the agents' in request order) is refused. The checks are
// independent, so a verifier goroutine that is idle takes a share of them
// (shareChecks): a mint's latency on a server with a processor to spare is
// its share of the seventeen verifications rather than all of them, and
// the work done is the same. Nothing is read or written before it returns.
func verifyRoster(r NodeRequest, ids []string) error {
	n := len(r.Agents) + 1 // check 0 is the node's
	ok := make([]bool, n)
	check := func(from, to int) {
		for i := from; i < to; i++ {
			if i == 0 {
				ok[0] = protocol.VerifyNodeCred(*r.TS, r.NodeID, ids, r.NodeSig) == nil
				continue
			}
			a := r.Agents[i-1]
			ok[i] = protocol.VerifyNodeAgent(*r.TS, r.NodeID, a.ID, a.Sig) == nil
		}
	}
	shareChecks(n, check)
	if !ok[0] {
		return unauth(errs.IdentityMismatch, "node_sig does not verify against node_id")
	}
	for i, a := range r.Agents {
		if !ok[i+1] {
			return unauth(errs.IdentityMismatch, "agent signature does not verify for "+a.ID[:12]+"…").
				WithDetail("agent_prefix", a.ID[:12])
		}
	}
	return nil
}

// shareChecks runs check over [0, n) in contiguous shares, handing shares
// to verifier goroutines that are waiting for work and running the rest
// itself; it returns when every share is done. A share is at least
// minChecksPerShare checks (a verification is some 25 µs; handing one
// over about 1).
//
// The verifiers are long-lived (GOMAXPROCS-1 of them): a goroutine started
// per request would grow its stack to the verifier's depth every time. A
// share is only handed to one already waiting, never queued, so a busy
// server verifies in the requests' own goroutines as before.
func shareChecks(n int, check func(from, to int)) {
	parts := min(runtime.GOMAXPROCS(0), n/minChecksPerShare)
	if parts <= 1 {
		check(0, n)
		return
	}
	startVerifiers.Do(func() {
		for range max(runtime.GOMAXPROCS(0)-1, 1) {
			go func() {
				for job := range verifierWork {
					job()
				}
			}()
		}
	})
	var wg sync.WaitGroup
	offer := func(from, to int) bool {
		wg.Add(1)
		select {
		case verifierWork <- func() { defer wg.Done(); check(from, to) }:
			return true
		default:
			wg.Done()
			return false
		}
	}
	end := n // this goroutine runs [0, end): the first share, and any share no verifier took
	for p := parts - 1; p >= 1 && offer(p*n/parts, (p+1)*n/parts); p-- {
		end = p * n / parts
	}
	check(0, end)
	wg.Wait()
}

// minChecksPerShare is the least share of a roster's verifications worth
// handing to another goroutine.
const minChecksPerShare = 4

var (
	verifierWork   = make(chan func()) // unbuffered: taken only by a waiting verifier
	startVerifiers sync.Once
)

// standing reads the roster's standing inside tx: every agent not retired,
// every owning account live, at most one owning account. Keys no account
// owns are allowed (spec §4.6 rule 3). It returns the owning account (or
// "") and each agent's host record, read now because a transaction reads
// before it writes.
func standing(tx store.Tx, ids []string) (string, []hosts, error) {
	owner := ""
	hs := make([]hosts, len(ids))
	accounts := map[string]bool{}
	for i, id := range ids {
		var t Tombstone
		dead, err := getOptional(tx, CollTombstones, id, &t)
		if err != nil {
			return "", nil, err
		}
		if dead {
			return "", nil, errs.Newf(errs.Forbidden, "agent %s… retired or revoked: %s; re-link to an account to restore", id[:12], t.Reason).
				WithDetails(map[string]any{"agent_prefix": id[:12], "reason": t.Reason})
		}
		var a agentOwner
		known, err := getOptional(tx, CollAgents, id, &a)
		if err != nil {
			return "", nil, err
		}
		if known && a.AccountID != "" {
			accounts[a.AccountID] = true
			owner = a.AccountID
		}
		if _, err := getOptional(tx, CollHosts, id, &hs[i]); err != nil {
			return "", nil, err
		}
		if known {
			hs[i].owner = a.AccountID
		}
	}
	if len(accounts) > 1 {
		return "", nil, errs.New(errs.Conflict, "roster spans two accounts; mint one credential per account")
	}
	if owner != "" {
		var acct account.Account
		if err := tx.Get(account.CollAccounts, owner, &acct); err != nil {
			return "", nil, err
		}
		if acct.Disabled {
			return "", nil, errs.New(errs.Forbidden, "owning account disabled; no credential is issued for its agents")
		}
	}
	return owner, hs, nil
}

// agentOwner is the one member of an Agent record standing reads.
type agentOwner struct {
	AccountID string `json:"account_id"`
}

// classOf is the fence class of a node credential: unowned when a key of
// its roster has no owning account. Such a credential also never gets the
// shared _INBOX.> grant: anyone can make keys, and the shared space holds
// every upstream client's replies.
func classOf(unowned bool) string {
	if unowned {
		return creds.ClassUnowned
	}
	return ""
}

// UnownedLimits bound node credentials minted for rosters no account owns
// (docs/security.md). Renewal at two thirds of a 30-day life is one mint
// in twenty days, so honest nodes never meet them. Zero fields take
// DefaultUnownedLimits.
type UnownedLimits struct {
	// PerAddress is mints per window from one client address (an IPv6 /64),
	// PerNetwork from its network (an IPv4 /24, an IPv6 /48).
	PerAddress ratelimit.Rate
	PerNetwork ratelimit.Rate
	// PerKey is mints per window naming one node key, or one agent key.
	PerKey ratelimit.Rate
}

// DefaultUnownedLimits: 20 mints an hour per address, 60 per network, 5
// per key. There is no overall limit: anyone could use it up for everyone.
func DefaultUnownedLimits() UnownedLimits {
	return UnownedLimits{PerAddress: ratelimit.Rate{Max: 20, Window: time.Hour}, PerNetwork: ratelimit.Rate{Max: 60, Window: time.Hour},
		PerKey: ratelimit.Rate{Max: 5, Window: time.Hour}}
}

func (l UnownedLimits) withDefaults() UnownedLimits {
	d := DefaultUnownedLimits()
	return UnownedLimits{PerAddress: l.PerAddress.Or(d.PerAddress), PerNetwork: l.PerNetwork.Or(d.PerNetwork), PerKey: l.PerKey.Or(d.PerKey)}
}

// Knobs are the operator settings of l (meshd flags and the same
// MESH_LIMIT_* variables for meshd and the Cloud Functions).
func (l *UnownedLimits) Knobs() []ratelimit.Knob {
	return []ratelimit.Knob{
		ratelimit.RateKnob("limit-unowned-per-address", "node credentials for rosters no account owns, per client address per window", &l.PerAddress),
		ratelimit.RateKnob("limit-unowned-per-network", "node credentials for rosters no account owns, per /24 (IPv6: /48) per window", &l.PerNetwork),
		ratelimit.RateKnob("limit-unowned-per-key", "node credentials for rosters no account owns, per node or agent key per window", &l.PerKey),
	}
}

// unownedLimits are the limits one unowned mint is counted against.
func (s *Service) unownedLimits(client, network, node string, agents []string) []ratelimit.Limit {
	l := s.cfg.Unowned.withDefaults()
	var out []ratelimit.Limit
	if client != "" {
		out = append(out, l.PerAddress.Limit("unowned-mint-per-address", client))
	}
	if network != "" {
		out = append(out, l.PerNetwork.Limit("unowned-mint-per-network", network))
	}
	out = append(out, l.PerKey.Limit("unowned-mint-per-key", node))
	for _, a := range agents {
		if a != node {
			out = append(out, l.PerKey.Limit("unowned-mint-per-key", a))
		}
	}
	return out
}

// limitErr turns a ratelimit refusal into the 429 every store-limited
// route answers (ratelimit.Refusal).
func limitErr(err error) error {
	var ex *ratelimit.Exceeded
	if !errors.As(err, &ex) {
		return err
	}
	return ratelimit.Refusal(ex, "node credentials for keys no account owns (redeem an agent key, am_, so an account owns them)")
}

// SweepLimits deletes the rate-limit counters that no longer matter.
func (s *Service) SweepLimits(ctx context.Context) (int, error) {
	n, err := ratelimit.Sweep(ctx, s.st, CollRateLimits, s.now())
	return n, txErr(err)
}
