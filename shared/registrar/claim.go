package registrar

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
)

// legacyOperator is an address's operator name as this registrar kept it
// before the name moved to the address's account (CollOperators). Claim
// and Sweep move each one there.
type legacyOperator struct {
	Email string `json:"email"`
	Name  string `json:"name"`
	SetAt int64  `json:"set_at"`
}

// Claimed is the answer of Claim.
type Claimed struct {
	Handle       string `json:"handle"`
	OperatorName string `json:"operator_name"`
	// Existing is set when the session's address already held the handle
	// (claiming it again is not an error).
	Existing bool `json:"-"`
}

// errTaken is the refusal of a handle someone else holds.
func errTaken(handle string) error {
	return errs.Newf(errs.Conflict, "taken: the handle %s is already claimed; pick another name", handle).WithDetail("reason", "taken")
}

// Claim claims `<name>.<email>` for the session's address (POST
// /api/handles/claim). Uniqueness is on the case-folded whole handle, first
// come first served, decided in one transaction. The first claim of an
// address must name its operator (OPERATOR_REQUIRED otherwise); later
// claims inherit that name, and an operator_name given with them is
// ignored. The name is the address's account's (account.SetOperatorName;
// an address with no account gets one to hold it), the same one a key
// minted in the console or by the operator shows. A handle the same
// address already holds is answered as claimed again.
func (s *Service) Claim(ctx context.Context, token, name, operatorName string) (Claimed, error) {
	if token == "" {
		return Claimed{}, errNoToken
	}
	name, err := CheckName(name)
	if err != nil {
		return Claimed{}, err
	}
	if operatorName, err = CheckOperatorName(operatorName); err != nil {
		return Claimed{}, err
	}
	now := s.now()
	var out Claimed
	var handle string
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		out = Claimed{}
		sess, err := s.sessionIn(tx, token, now)
		if err != nil {
			return err
		}
		handle = HandleOf(name, sess.Email)
		id := HandleID(handle)
		var h account.Handle
		exists, err := getOptional(tx, account.CollHandles, id, &h)
		if err != nil {
			return err
		}
		if exists {
			if h.Email != sess.Email {
				return errTaken(h.Handle)
			}
			op, err := operatorNameIn(tx, h.Email)
			if err != nil {
				return err
			}
			out = Claimed{Handle: h.Handle, OperatorName: cmp.Or(op, h.OperatorName), Existing: true}
			return nil
		}
		// The operator name lives on the address's account (account.
		// SetOperatorName): the first one given stays and a later one is
		// ignored, whichever door it came through. A name this registrar
		// kept itself before moves there now.
		var legacy legacyOperator
		hasLegacy, err := getOptional(tx, CollOperators, sess.Email, &legacy)
		if err != nil {
			return err
		}
		acct, err := account.AccountOfEmail(tx, sess.Email)
		if err != nil {
			return err
		}
		if hasLegacy && legacy.Name != "" {
			operatorName = legacy.Name
		}
		if (acct == nil || acct.OperatorName == "") && operatorName == "" {
			return errs.New(errs.OperatorRequired, "the first handle of an address needs an operator name: send operator_name (the person or organisation running the agent, at most 80 characters; later handles inherit it)")
		}
		// Writes.
		op, err := account.SetOperatorName(tx, sess.Email, acct, operatorName, now)
		if err != nil {
			return err
		}
		if hasLegacy {
			if err := tx.Delete(CollOperators, sess.Email); err != nil {
				return err
			}
		}
		h = account.Handle{Handle: handle, Email: sess.Email, OperatorName: op, ClaimedAt: ms(now), ClaimedVia: sess.Provenance}
		// A handle claimed for the address of a verified account belongs
		// to that account too, so the account's agent key exchange may
		// bind it.
		if acct != nil && acct.Verified && !acct.Disabled {
			h.AccountID = acct.ID
		}
		out = Claimed{Handle: handle, OperatorName: op}
		return tx.Create(account.CollHandles, id, h)
	})
	s.dropExpiredSession(ctx, token, err)
	if errors.Is(err, store.ErrExists) {
		// Another claim of the same handle committed first (a store
		// whose transactions conflict at commit reports it so).
		return Claimed{}, errTaken(handle)
	}
	if err != nil {
		return Claimed{}, txErr(err)
	}
	if !out.Existing {
		s.log.Info("handle claimed", "handle", out.Handle)
	}
	return out, nil
}

// operatorNameIn is, in tx, the operator name of an address as the cards
// and the console show it: its account's, or one this registrar kept
// before the name moved to accounts; "" when it has neither.
func operatorNameIn(tx store.Tx, email string) (string, error) {
	acct, err := account.AccountOfEmail(tx, email)
	if err != nil {
		return "", err
	}
	if acct != nil && acct.OperatorName != "" {
		return acct.OperatorName, nil
	}
	var legacy legacyOperator
	if _, err := getOptional(tx, CollOperators, email, &legacy); err != nil {
		return "", err
	}
	return legacy.Name, nil
}

// pairing is a pairing code as stored, under the hash of the code.
type pairing struct {
	// ID is the document's own id, so that a query (the per-address cap,
	// the sweep) can delete it.
	ID        string `json:"id"`
	HandleID  string `json:"handle_id"`
	Handle    string `json:"handle"`
	Email     string `json:"email"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt int64  `json:"expires_at"`
}

// pairingID is the store id of a pairing code: its keyed hash (codeHasher).
func (s *Service) pairingID(code string) string { return s.codes.Hash("pan-pair", code) }

// PairingStarted is the answer of StartPairing.
type PairingStarted struct {
	Code      string
	Handle    string
	ExpiresAt time.Time
}

// StartPairing issues a single-use pairing code for a handle the session's
// address holds (POST /api/pair/start). It lives ten minutes. An address
// has at most ten live codes (429 pair-codes-per-address beyond): the
// console opens a session per request, so a cap per session would not hold.
func (s *Service) StartPairing(ctx context.Context, token, handle string) (PairingStarted, error) {
	if token == "" {
		return PairingStarted{}, errNoToken
	}
	if strings.TrimSpace(handle) == "" {
		return PairingStarted{}, errs.New(errs.InvalidRequest, "handle is required: the handle to bind, e.g. coder.ana@example.org")
	}
	id := HandleID(handle)
	now := s.now()
	var out PairingStarted
	// A fresh code colliding with a live one is a 1-in-a-billion event;
	// try a few times rather than fail.
	for range 3 {
		code := NewPairingCode()
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			sess, err := s.sessionIn(tx, token, now)
			if err != nil {
				return err
			}
			var h account.Handle
			found, err := getOptional(tx, account.CollHandles, id, &h)
			switch {
			case err != nil:
				return err
			case !found:
				return errs.Newf(errs.NotFound, "no handle %s: claim it first with POST /api/handles/claim", strings.TrimSpace(handle))
			case h.Email != sess.Email:
				return errs.Newf(errs.Forbidden, "the handle %s belongs to another address; only its holder can pair an agent with it", h.Handle)
			}
			// At most LivePairingCodes live codes per address; its expired
			// ones are deleted on the way.
			var pending []pairing
			if err := tx.Query(CollPairing, store.Where("email", h.Email), &pending); err != nil {
				return err
			}
			var live []int64
			var expired []string
			for _, p := range pending {
				switch {
				case now.UnixMilli() < p.ExpiresAt:
					live = append(live, p.ExpiresAt)
				case p.ID != "":
					expired = append(expired, p.ID)
				}
			}
			if limit := s.limits.LivePairingCodes; len(live) >= limit {
				after := slices.Min(live) - now.UnixMilli()
				return errs.Newf(errs.RateLimited, "this address already has %d live pairing codes (at most %d; each lasts %d minutes): use one, or retry in %d s",
					len(live), limit, int(PairingTTL/time.Minute), (after+999)/1000).WithRetryAfter(after).WithDetail("limit", "pair-codes-per-address")
			}
			for _, id := range expired {
				if err := tx.Delete(CollPairing, id); err != nil {
					return err
				}
			}
			out = PairingStarted{Code: code, Handle: h.Handle, ExpiresAt: now.Add(PairingTTL)}
			return tx.Create(CollPairing, s.pairingID(code), pairing{ID: s.pairingID(code), HandleID: id, Handle: h.Handle, Email: h.Email,
				CreatedAt: ms(now), ExpiresAt: ms(now.Add(PairingTTL))})
		})
		if errors.Is(err, store.ErrExists) {
			continue
		}
		if err != nil {
			s.dropExpiredSession(ctx, token, err)
			return PairingStarted{}, txErr(err)
		}
		return out, nil
	}
	return PairingStarted{}, errs.New(errs.Unavailable, "no free pairing code could be drawn; retry")
}

// errPairingGone is the one answer for a code that is not (or no longer)
// usable: the spec's "pairing code unknown, used or expired".
var errPairingGone = errs.New(errs.NotFound, "pairing code unknown, used or expired: request a new one")

// CompletePairing binds the agent to the handle of a pairing code (POST
// /api/pair/complete; no session: the code is the capability and the
// signature proves the agent key). signature is standard base64 Ed25519
// over `pan-pair-v1:<CODE>:<agent_id>`, checked before the code is touched,
// so a bad signature never spends it. The code is consumed in the
// transaction that binds the handle. Limited to 60 an hour per client IP
// (an IPv6 client by its /64), counting only well-formed, verifying
// attempts.
func (s *Service) CompletePairing(ctx context.Context, code, agentID, signature, ip string) (string, error) {
	// The body is checked, and the signature verified, before the per-IP
	// limit is taken: a malformed or unsigned request costs a store write
	// nobody, and only a request that could spend a code is counted.
	norm, err := NormalizePairingCode(code)
	if err != nil {
		return "", err
	}
	if !keys.IsUserPublicKey(agentID) {
		return "", errs.New(errs.InvalidRequest, "agent_id must be the agent's public key (U followed by 55 characters)")
	}
	if signature == "" {
		return "", errs.New(errs.InvalidRequest, "signature is required: standard base64 Ed25519 over pan-pair-v1:<CODE>:<agent_id> by the agent key")
	}
	if _, err := protocol.Base64Std.Decode(signature); err != nil {
		return "", errs.Newf(errs.InvalidRequest, "signature must be a standard base64 Ed25519 signature (64 bytes) over pan-pair-v1:<CODE>:<agent_id>: %v", err)
	}
	// The signer may have signed the code as typed (upper-cased) or in its
	// canonical form; both name the same code.
	typed := strings.ToUpper(strings.TrimSpace(code))
	if protocol.VerifyPair(typed, agentID, signature) != nil && protocol.VerifyPair(norm, agentID, signature) != nil {
		return "", errs.Newf(errs.IdentityMismatch, "the signature does not verify: sign pan-pair-v1:%s:%s with that agent's key (standard base64); the code was not used", norm, agentID)
	}
	ip = httpx.LimitKey(ip)
	now := s.now()
	if err := s.st.RunTx(ctx, func(tx store.Tx) error {
		return ratelimit.Take(tx, CollRateLimits, now,
			ratelimit.Limit{Name: "pair-per-ip", Key: ip, Max: s.limits.PairingPerIP, Window: s.limits.Window})
	}); err != nil {
		return "", s.limited(err)
	}
	var handle string
	var outcome error
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		handle, outcome = "", nil
		var p pairing
		found, err := getOptional(tx, CollPairing, s.pairingID(norm), &p)
		if err != nil {
			return err
		}
		if !found {
			outcome = errPairingGone
			return nil
		}
		var h account.Handle
		hFound, err := getOptional(tx, account.CollHandles, p.HandleID, &h)
		if err != nil {
			return err
		}
		switch {
		case now.UnixMilli() >= p.ExpiresAt:
			outcome = errPairingGone
			return tx.Delete(CollPairing, s.pairingID(norm))
		case !hFound || h.Email != p.Email:
			outcome = errs.Newf(errs.NotFound, "the handle %s of that pairing code is no longer held; the code was withdrawn", p.Handle)
			return tx.Delete(CollPairing, s.pairingID(norm))
		}
		if err := tx.Delete(CollPairing, s.pairingID(norm)); err != nil {
			return err
		}
		handle = h.Handle
		return tx.Update(account.CollHandles, p.HandleID, map[string]any{"agent_id": agentID, "bound_at": ms(now), "binding": "agent-key"})
	})
	if err != nil {
		return "", txErr(err)
	}
	if outcome != nil {
		return "", outcome
	}
	s.log.Info("handle bound", "handle", handle, "agent", agentID)
	return handle, nil
}

// Mine lists the handles the session's address holds, oldest first (the
// console's Handles page; upstream's GET /api/handles/mine).
func (s *Service) Mine(ctx context.Context, token string) ([]account.Handle, error) {
	var out []account.Handle
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		sess, err := s.sessionIn(tx, token, s.now())
		if err != nil {
			return err
		}
		out = nil
		if err := tx.Query(account.CollHandles, store.Where("email", sess.Email), &out); err != nil {
			return err
		}
		op, err := operatorNameIn(tx, sess.Email)
		for i := range out {
			out[i].OperatorName = cmp.Or(op, out[i].OperatorName)
		}
		return err
	})
	if err != nil {
		s.dropExpiredSession(ctx, token, err)
		if errs.CodeOf(err) != "" {
			return nil, err
		}
		return nil, errs.Wrap(errs.Unavailable, "the registrar cannot list handles right now; retry shortly", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ClaimedAt < out[j].ClaimedAt })
	return out, nil
}
