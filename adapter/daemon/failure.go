package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"unicode"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The failures to start or send that a person can act on are each one line
// saying what happened and what to do; docs/adapter.md lists them.

// unreachable is a bus that does not answer.
func unreachable(url string) error {
	return fmt.Errorf("cannot reach the mesh at %s: is meshd running?", url)
}

// refused explains a credential renewal the control plane refused: a
// retired agent (the refusal carries the reason it was retired with), or
// another refusal in the control plane's own words.
func refused(rev *node.ErrRevoked) error {
	if rev.Reason != "" {
		return fmt.Errorf("this agent was retired: %s; to go on, redeem a new agent key with `mesh-adapter up` in another --state-dir", OneLine(rev.Reason))
	}
	return fmt.Errorf("the mesh refused this agent's credential: %s (%s)", OneLine(rev.Message), rev.Code)
}

// authRefused reports whether err is the broker refusing the credential
// (unknown, expired or revoked), as opposed to not answering at all.
func authRefused(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// cutShort reports whether err is a connection the broker accepted and
// then ended during the handshake (end of file, a reset, a failed read or
// write): what a client may see instead of the broker's "Authorization
// Violation" when the broker closes the socket before the client has read
// its last line, which happens now and then over WebSocket. Only a dial
// that failed says the broker is not there.
func cutShort(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op != "dial" && !op.Timeout()
}

// connectFailed turns node.Start's error into the line a person reads.
func connectFailed(url string, err error) error {
	var op *net.OpError
	switch {
	case errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.As(err, &op):
		return unreachable(url)
	case authRefused(err):
		return fmt.Errorf("the mesh at %s refused this adapter's credential (%v): run `mesh-adapter up <agent-key>` with a new agent key in another --state-dir", url, err)
	}
	return fmt.Errorf("cannot connect to the mesh at %s: %w", url, err)
}

// renewFailed explains a renewal attempted because the broker refused the
// saved credential.
func renewFailed(controlURL string, err error) error {
	var rev *node.ErrRevoked
	if errors.As(err, &rev) {
		return refused(rev)
	}
	var re *node.RenewError
	if errors.As(err, &re) && re.Status == 0 {
		return fmt.Errorf("the mesh refused this agent's credential, and its control plane at %s cannot be reached to renew it: is meshd running?", controlURL)
	}
	return fmt.Errorf("the mesh refused this agent's credential, and renewing it failed: %v", err)
}

// startNode connects the node. When the broker refuses the saved
// credential (expired, or revoked), the control plane is asked for a new
// one once: it either issues it (saved by the renewer, and the connection
// is tried again) or says why not, which is how a retired agent learns its
// reason.
func (a *adapter) startNode(ctx context.Context, cfg node.Config, renewer node.Renewer) (*node.Node, error) {
	n, err := node.Start(ctx, cfg)
	// A refusal, or a handshake cut short (which may be one), is put to the
	// control plane: it renews the credential or says why not.
	if err != nil && (authRefused(err) || cutShort(err)) && renewer != nil {
		jwt, _, rerr := renewer.Renew(ctx, []*keys.Agent{a.keys.Agent})
		var rev *node.ErrRevoked
		switch {
		case rerr != nil && !authRefused(err) && !errors.As(rerr, &rev):
			// Not a refusal after all, as far as anyone can tell.
			return nil, connectFailed(cfg.NATSURL, err)
		case rerr != nil:
			return nil, renewFailed(a.cc.base, rerr)
		}
		cfg.Credential = node.Credential{JWT: jwt, Sign: a.keys.Node.SignNonce}
		n, err = node.Start(ctx, cfg)
	}
	if err != nil {
		return nil, connectFailed(cfg.NATSURL, err)
	}
	return n, nil
}

// notConnected is why a send cannot go out now, or nil when the node is
// connected. A node that lost its connection keeps reconnecting on its
// own; asking the control plane for a new credential tells a retired agent
// (whose connection the broker closed) from a mesh that is down, and gives
// a node whose credential was merely expired a fresh one.
func (a *adapter) notConnected(ctx context.Context) error {
	if a.node.Health().Connected {
		return nil
	}
	if a.renews {
		err := a.node.RenewNow(ctx)
		var rev *node.ErrRevoked
		switch {
		case errors.As(err, &rev):
			return refused(rev)
		case err == nil:
			return fmt.Errorf("not connected to the mesh at %s right now (the adapter is reconnecting): try again in a moment", a.natsURL)
		}
	}
	return unreachable(a.natsURL)
}

// answerError is the error an answer carries: payload.error (this mesh's
// form), else the envelope member error beside the payload (protocol 0.3),
// else, for a "failed" answer that carries neither, an error saying so.
func answerError(r *node.Result) *errs.Error {
	if r.Error != nil {
		return r.Error
	}
	if r.Env != nil {
		if v, ok := r.Env.Extra["error"]; ok && v != nil {
			return errs.FromWire(v)
		}
	}
	if r.Status == errs.StatusFailed {
		msg := r.Message
		if msg == "" {
			msg = "the recipient answered \"failed\" without an error"
		}
		return &errs.Error{Code: errs.InternalError, Message: msg}
	}
	return nil
}

// Describe is a recipient's error for people: its code and message, and
// what a refusal's details tell (the price of a budget refusal, the
// earliest completion of a deadline refusal).
func Describe(e *errs.Error) error {
	switch e.Code {
	case errs.BudgetInsufficient:
		if est, ok := e.Details["estimate"].(map[string]any); ok {
			if m, err := protocol.MoneyFromValue(est); err == nil {
				return fmt.Errorf("%w (their estimate: %s)", e, m)
			}
		}
	case errs.DeadlineUnmeetable:
		if at, ok := e.Details["earliest_completion"].(string); ok {
			return fmt.Errorf("%w (earliest completion: %s)", e, at)
		}
	}
	return e
}

// OneLine makes text from someone else (an error message, a retirement
// reason) safe to print on one terminal line: line breaks and other
// control and format characters become spaces, runs of spaces one.
func OneLine(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	return b.String()
}
