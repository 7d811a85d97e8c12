package creds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// ClaimsUpdateSubject is where a full ("dir") account resolver accepts account
// JWT updates from system-account users.
const ClaimsUpdateSubject = "$SYS.REQ.CLAIMS.UPDATE"

// claimsUpdateReply mirrors the broker's reply to a claims update; it is
// declared here so that minting and pushing credentials never link the broker.
type claimsUpdateReply struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// PushAccountJWT sends an updated account JWT to the running broker over a
// system-account connection and waits for it to be accepted. The broker
// applies it at once: revoked user keys lose their connections, and the new
// limits hold, without a restart. With several servers, the first answer is
// returned and the resolvers spread the update among themselves.
func PushAccountJWT(ctx context.Context, nc *nats.Conn, accountJWT string) error {
	if nc == nil {
		return errors.New("push account jwt: no connection")
	}
	msg, err := nc.RequestWithContext(ctx, ClaimsUpdateSubject, []byte(accountJWT))
	if err != nil {
		return fmt.Errorf("push account jwt: %w", err)
	}
	var reply claimsUpdateReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("push account jwt: decode reply: %w", err)
	}
	switch {
	case reply.Error != nil:
		return fmt.Errorf("push account jwt: refused for %s (%d): %s",
			reply.Error.Account, reply.Error.Code, reply.Error.Description)
	case reply.Data == nil:
		return fmt.Errorf("push account jwt: reply has neither data nor error: %q", msg.Data)
	}
	return nil
}

// AccountLookupSubject is where a full resolver answers with an account's
// current JWT.
func AccountLookupSubject(account string) string {
	return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.LOOKUP"
}

// Revoker revokes credential keys on a running cluster it reaches only
// over NATS (the cloud deployment, which has no resolver directory of its
// own): it asks the resolver for the mesh account's current JWT, adds the
// revocations, re-signs it with the operator key and pushes it back.
// Revocations already in the JWT are kept, because the current JWT is the
// starting point.
type Revoker struct {
	Trust *Trust
	// Sys is a system-account connection (MintSystemUser).
	Sys *nats.Conn
	// mu serialises read-modify-write cycles from this process; the
	// resolver itself applies whole JWTs, so two processes revoking at once
	// can lose one update — callers retry what the store recorded.
	mu sync.Mutex
}

// Revoke implements the credential service's Revoker.
func (r *Revoker) Revoke(ctx context.Context, keys []string, at time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	mesh := r.Trust.PublicKeys().MeshAccount
	msg, err := r.Sys.RequestWithContext(ctx, AccountLookupSubject(mesh), nil)
	if err != nil {
		return fmt.Errorf("revoke: look up the mesh account: %w", err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		return fmt.Errorf("revoke: the resolver's mesh account jwt: %w", err)
	}
	if err := RevokeCredentials(claims, at, keys...); err != nil {
		return err
	}
	signed, err := r.Trust.EncodeAccount(claims)
	if err != nil {
		return err
	}
	return PushAccountJWT(ctx, r.Sys, signed)
}
