package creds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
