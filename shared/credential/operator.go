package credential

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// KindOperator is the Mint.Kind of an operator test credential.
const KindOperator = "operator"

// OperatorResult is a minted operator test credential. Seed and Creds are
// the secret; the caller writes them to a file and shows nothing else of
// them.
type OperatorResult struct {
	PublicKey string         `json:"public_key"`
	Name      string         `json:"name"`
	JWT       string         `json:"jwt"`
	Seed      string         `json:"seed"`
	Creds     string         `json:"creds"`
	ExpiresAt string         `json:"expires_at"`
	Mesh      map[string]any `json:"mesh"`
}

// MintOperator mints the operator's wide test credential
// (creds.OperatorPermissions) for a fresh key, valid for ttl, which must
// be given and be at most creds.MaxOperatorLifetime. The mint is recorded
// like every other, so `RevokeOperator` (and an account-wide sweep of
// revocations) covers it, and logged without its seed.
func (s *Service) MintOperator(ctx context.Context, label string, ttl time.Duration) (OperatorResult, error) {
	if ttl <= 0 {
		return OperatorResult{}, bad("an operator credential needs an explicit ttl (for example 1h), at most 24h")
	}
	if ttl > creds.MaxOperatorLifetime {
		return OperatorResult{}, bad("an operator credential lives at most 24h; give a shorter ttl")
	}
	label = strings.TrimSpace(label)
	if len(label) > 64 || strings.ContainsAny(label, "\r\n") {
		return OperatorResult{}, bad("the label is one line of at most 64 characters")
	}
	if err := s.minting(); err != nil {
		return OperatorResult{}, err
	}
	k, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return OperatorResult{}, errs.Wrap(errs.InternalError, "operator credential key", err)
	}
	name := creds.OperatorLabel
	if label != "" {
		name += " " + label
	}
	var res OperatorResult
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		now := s.now()
		expires := now.Add(ttl)
		tok, err := s.cfg.Trust.MintUser(creds.UserSpec{PublicKey: k.Public(), Name: name, Kind: creds.KindOperator,
			Permissions: creds.OperatorPermissions(), Expires: expires})
		if err != nil {
			return errs.Wrap(errs.InternalError, "the operator credential could not be signed", err)
		}
		m := Mint{ID: protocol.NewID(), Kind: KindOperator, Key: k.Public(), IssuedAt: ms(now), ExpiresAt: ms(expires)}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		seed := k.Seed()
		cf, err := jwt.FormatUserConfig(tok, seed)
		if err != nil {
			return err
		}
		res = OperatorResult{PublicKey: k.Public(), Name: name, JWT: tok, Seed: string(seed), Creds: string(cf),
			ExpiresAt: protocol.FormatTime(expires), Mesh: s.meshBlock()}
		return nil
	})
	if err != nil {
		return OperatorResult{}, txErr(err)
	}
	s.log.Warn("operator test credential minted: it publishes and subscribes mesh.> and _INBOX.>; revoke it with `meshd admin operator-credential revoke`",
		"key", res.PublicKey, "name", res.Name, "expires_at", res.ExpiresAt)
	return res, nil
}

// RevokeOperator revokes an operator credential at the broker, with the
// other revocations (recorded in the store, so a stopped mesh applies it
// when it starts). Only a key minted by MintOperator is taken: the command
// is not a way to revoke an arbitrary credential.
func (s *Service) RevokeOperator(ctx context.Context, key string) error {
	if !keys.IsUserPublicKey(key) {
		return bad("give the operator credential's public key (U…, 56 characters), as minting printed it")
	}
	var now time.Time
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		var mints []Mint
		if err := tx.Query(CollMints, store.Where("key", key), &mints); err != nil {
			return err
		}
		operator := false
		for _, m := range mints {
			operator = operator || m.Kind == KindOperator
		}
		if !operator {
			return errs.Newf(errs.NotFound, "no operator credential was minted for %s", key)
		}
		return recordRevocations(tx, []string{key}, now)
	})
	if err != nil {
		return txErr(err)
	}
	s.log.Info("operator test credential revoked", "key", key)
	return s.revoke(ctx, []string{key}, now)
}
