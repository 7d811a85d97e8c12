package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// RenewTimeout is the deadline of one renewal request (spec §8: 15 s, no
// retry inside the call).
const RenewTimeout = 15 * time.Second

// ConnectTimeout bounds one attempt to connect to the broker.
const ConnectTimeout = 5 * time.Second

// ErrRevoked is a renewal the mesh refused, as opposed to one that failed:
// the agent was retired, its account disabled, or the roster is otherwise
// not allowed. The runtime treats it as revocation and stops renewing
// (spec §3.3). Message is the server's own text.
type ErrRevoked struct {
	Status  int
	Code    string
	Message string
	// Reason is the refusal's details.reason: for a retired agent, the
	// reason given when it was retired.
	Reason string
}

func (e *ErrRevoked) Error() string {
	return fmt.Sprintf("credential renewal refused (%d %s): %s", e.Status, e.Code, e.Message)
}

// NodeCredentialRenewer renews through POST {ControlURL}/v1/node-credential
// (spec §4.6): the node key signs the roster, every agent signs its consent.
type NodeCredentialRenewer struct {
	ControlURL string
	NodeKey    *keys.Node
	// HTTPClient nil is http.DefaultClient; the 15 s deadline applies
	// either way.
	HTTPClient *http.Client
	// Now stamps the request (nil: time.Now).
	Now func() time.Time
	// SharedInbox asks for the shared _INBOX.> grant instead of a private
	// reply prefix alone: only for a node whose connection uses NATS's
	// default inbox prefix. This runtime sets its own (Config.InboxPrefix).
	SharedInbox bool
}

// RenewError is a renewal that failed without being refused (network, 5xx,
// rate limit, a stale timestamp): the runtime retries it an hour later.
type RenewError struct {
	Status  int
	Code    string
	Message string
	Err     error
}

func (e *RenewError) Error() string {
	if e.Err != nil {
		return "credential renewal failed: " + e.Err.Error()
	}
	return fmt.Sprintf("credential renewal failed (%d %s): %s", e.Status, e.Code, e.Message)
}

func (e *RenewError) Unwrap() error { return e.Err }

// Renew implements Renewer.
func (r *NodeCredentialRenewer) Renew(ctx context.Context, agents []*keys.Agent) (string, time.Time, error) {
	if r.NodeKey == nil || r.ControlURL == "" {
		return "", time.Time{}, errors.New("renew: ControlURL and NodeKey are required")
	}
	if len(agents) == 0 {
		return "", time.Time{}, errors.New("renew: no agents to renew for")
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	ts := now().Unix()
	ids := make([]string, len(agents))
	entries := make([]map[string]string, len(agents))
	for i, a := range agents {
		ids[i] = a.Public()
		entries[i] = map[string]string{"id": a.Public(), "sig": protocol.SignNodeAgent(a, ts, r.NodeKey.Public())}
	}
	nodeSig, err := protocol.SignNodeCred(r.NodeKey, ts, ids)
	if err != nil {
		return "", time.Time{}, err
	}
	req := map[string]any{"node_id": r.NodeKey.Public(), "agents": entries, "ts": ts, "node_sig": nodeSig}
	if !r.SharedInbox {
		req["private_inbox"] = true
	}
	body, err := json.Marshal(req)
	if err != nil {
		return "", time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, RenewTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(r.ControlURL, "/")+"/v1/node-credential", bytes.NewReader(body))
	if err != nil {
		return "", time.Time{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	client := r.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return "", time.Time{}, &RenewError{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", time.Time{}, &RenewError{Status: resp.StatusCode, Err: err}
	}
	var out struct {
		OK        bool    `json:"ok"`
		JWT       string  `json:"jwt"`
		ExpiresAt *string `json:"expires_at"`
		Error     string  `json:"error"`
		Code      string  `json:"code"`
		Details   struct {
			Reason string `json:"reason"`
		} `json:"details"`
	}
	_ = json.Unmarshal(raw, &out)
	if resp.StatusCode != http.StatusOK {
		msg := out.Error
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		if refusal(resp.StatusCode) {
			return "", time.Time{}, &ErrRevoked{Status: resp.StatusCode, Code: out.Code, Message: msg, Reason: out.Details.Reason}
		}
		return "", time.Time{}, &RenewError{Status: resp.StatusCode, Code: out.Code, Message: msg}
	}
	if !out.OK || out.JWT == "" {
		return "", time.Time{}, &RenewError{Status: resp.StatusCode, Message: "the answer carries no credential"}
	}
	var exp time.Time
	if out.ExpiresAt != nil && *out.ExpiresAt != "" {
		if exp, err = protocol.ParseTime(*out.ExpiresAt); err != nil {
			return "", time.Time{}, &RenewError{Status: resp.StatusCode, Message: "expires_at is not a time", Err: err}
		}
	}
	return out.JWT, exp, nil
}

// refusal tells a refusal by the mesh from a failure: every 4xx except those
// that say "not now" or "not here" — 401 (the door's clock and ours differ:
// a stale timestamp), 404 (wrong control URL), 408, 425 and 429. A 403
// (agent retired, account disabled), 409 (roster spans two accounts) or 400
// will not change by retrying.
func refusal(status int) bool {
	if status < 400 || status >= 500 {
		return false
	}
	switch status {
	case http.StatusUnauthorized, http.StatusNotFound, http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return true
}

// RenewNow renews the credential for the hosted agents now, installs it and
// reconnects with it (nats ForceReconnect: subscriptions are restored, and
// what arrived in the gap is in the mailboxes, drained after the reconnect).
// It returns once the connection is back, or when ctx ends. The renewed
// credential is a node credential, so from then on the node key signs the
// nonce, whatever signed it before.
//
// A refusal (*ErrRevoked) is treated as revocation: it is reported in
// Health and to Warn as "credential_revoked" and "credential_renewal_failed",
// and the automatic schedule stops; RenewNow itself may still be called.
func (n *Node) RenewNow(ctx context.Context) error {
	if n.cfg.Renewer == nil {
		return errors.New("node: no Renewer configured")
	}
	n.renewMu.Lock()
	defer n.renewMu.Unlock()
	// The roster is read under renewMu: a Host changes it only while
	// holding the lock, so this renewal covers every agent hosted so far.
	return n.renewLocked(ctx, n.rosterKeys(), true)
}

// rosterKeys are the keys of the hosted agents.
func (n *Node) rosterKeys() []*keys.Agent {
	agents := n.hosted()
	ks := make([]*keys.Agent, len(agents))
	for i, a := range agents {
		ks[i] = a.key
	}
	return ks
}

// renewLocked renews the credential for the roster ks; the caller holds
// renewMu. own says ks is the node's current roster (RenewNow, the
// schedule) rather than a roster a Host proposes: only the refusal of the
// node's own roster is the revocation of its credential (spec §3.3). A
// failed proposal is returned to the Host and leaves the credential state,
// and so the schedule, as it was.
func (n *Node) renewLocked(ctx context.Context, ks []*keys.Agent, own bool) error {
	if len(ks) == 0 {
		return errors.New("node: no hosted agents to renew the credential for")
	}
	token, _, err := n.cfg.Renewer.Renew(ctx, ks)
	if err == nil {
		err = n.checkReplyPrefix(token)
	}
	if err == nil {
		err = n.setCredential(Credential{JWT: token, Sign: n.cfg.NodeKey.SignNonce})
	}
	if err != nil && !own {
		n.log.Warn("credential renewal for a new roster failed; the current credential stays", "agents", len(ks), "err", err)
		return err
	}
	n.credMu.Lock()
	n.cs.lastAttempt = n.now()
	var revoked *ErrRevoked
	if err != nil {
		n.cs.lastErr = err.Error()
		if errors.As(err, &revoked) {
			n.cs.revoked = true
		}
	} else {
		n.cs.lastErr, n.cs.lastAttempt, n.cs.revoked = "", time.Time{}, false
	}
	n.credMu.Unlock()
	if err != nil {
		if revoked != nil {
			n.warn(Warning{Code: "credential_revoked", Message: "the mesh refused to renew the credential; renewal stopped: " + revoked.Message, Err: err})
		}
		n.warn(Warning{Code: "credential_renewal_failed", Message: err.Error(), Err: err})
		n.reportHealth()
		return err
	}
	n.log.Info("credential renewed", "agents", len(ks))
	err = n.reconnect(ctx)
	n.reportHealth()
	return err
}

// reconnect forces a reconnect so the next CONNECT carries the new JWT.
//
// Closing the socket while inbound messages sit unread in it makes the
// kernel reset the connection, and the broker then loses what this node had
// written just before (measured: answers sent by handlers under load went
// missing). So: every publish from a flush point on is recorded, the flush
// confirms everything before it reached the broker, and once the
// connection is back the recorded messages are published again. Receivers
// drop the copies that did arrive by their (from, id) dedup, and the
// mailbox stream a republished request by its Nats-Msg-Id (an answer stored
// twice is dropped when drained, by the same dedup). Inbound messages lost in the gap are the
// mailbox's: it is drained after the reconnect.
func (n *Node) reconnect(ctx context.Context) error {
	n.startRecording()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_ = n.nc.FlushWithContext(fctx)
	cancel()
	if err := n.nc.ForceReconnect(); err != nil {
		n.stopRecording()
		return fmt.Errorf("node: reconnect with the renewed credential: %w", err)
	}
	err := n.waitConnected(ctx)
	replay := n.stopRecording()
	for _, m := range replay {
		if perr := n.nc.PublishMsg(m); perr != nil {
			n.log.Warn("republish after reconnect", "subject", m.Subject, "err", perr)
		}
	}
	if len(replay) > 0 {
		n.log.Info("republished after reconnect", "messages", len(replay))
	}
	return err
}

// waitConnected polls until the connection is up again.
func (n *Node) waitConnected(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for n.nc.Status() != nats.CONNECTED {
		if n.nc.IsClosed() {
			return errors.New("node: the connection is closed")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node: waiting for the reconnect: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// ReplyPrefixOf returns the private reply prefix the credential c grants
// (protocol.PrivateInboxPrefix of its own key, when it may subscribe
// everything under it), or "".
func ReplyPrefixOf(c *jwt.UserClaims) string {
	if c == nil {
		return ""
	}
	p := protocol.PrivateInboxPrefix(c.Subject)
	if slices.Contains(c.Sub.Allow, p+".>") {
		return p
	}
	return ""
}

// checkReplyPrefix refuses a renewed credential that does not grant the
// reply prefix this connection was made with: replies would stop arriving
// the moment it is used. It happens only when the credential key changes
// (a bootstrap credential renewed for a different node key); the adapter
// avoids it by adopting the bootstrap credential key as its node key.
func (n *Node) checkReplyPrefix(token string) error {
	c, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return fmt.Errorf("node: renewed credential JWT: %w", err)
	}
	want := n.cfg.InboxPrefix + ".>"
	if n.cfg.InboxPrefix == "" {
		want = protocol.SharedInboxSpace // NATS's default prefix
	}
	if !slices.Contains(c.Sub.Allow, want) {
		return fmt.Errorf("node: the renewed credential does not cover this connection's replies (%s); it is saved, restart the node to use it", want)
	}
	return nil
}
