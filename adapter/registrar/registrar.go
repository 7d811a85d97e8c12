// Package registrar is the adapter's client of the handle registrar (spec
// §4.1, upstream-notes §12): claiming a handle by email, pairing an agent
// with it, and resolving a handle to its agent. A resolved card is
// verified offline against the registrar's signing key, and both that key
// and each handle's agent are pinned (Pins): a binding that changes is
// refused until the user accepts it, a registrar key that changes is
// refused outright.
package registrar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// ErrOperatorRequired is a first claim without an operator name.
var ErrOperatorRequired = errors.New("the first claim needs an operator name")

// Error is a registrar refusal.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("the registrar refused: %s (HTTP %d)", e.Message, e.Status)
}

// Client talks to one registrar.
type Client struct {
	Base string
	HTTP *http.Client
	// Pins remembers the registrar's key and each handle's agent
	// (pins.json in the state directory); nil verifies every card against
	// the registrar's published key set and remembers nothing.
	Pins *Pins
	// Now is the clock cards are checked against (time.Now when nil).
	Now func() time.Time
}

// New returns a client of the registrar at base.
func New(base string) *Client {
	return &Client{Base: strings.TrimRight(base, "/"), HTTP: &http.Client{Timeout: 15 * time.Second}}
}

func (c *Client) do(ctx context.Context, method, path, bearer string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return fmt.Errorf("registrar URL %q: %w", c.Base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("the registrar at %s cannot be reached: %w", c.Base, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
			Code  string `json:"code"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		if e.Code == "OPERATOR_REQUIRED" {
			return ErrOperatorRequired
		}
		return &Error{Status: resp.StatusCode, Message: e.Error}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("the registrar's answer to %s: %w", path, err)
		}
	}
	return nil
}

// StartEmail asks for a verification code by mail.
func (c *Client) StartEmail(ctx context.Context, email string) error {
	return c.do(ctx, http.MethodPost, "/api/handles/start", "", map[string]any{"email": email}, nil)
}

// Verify exchanges the mailed code for a session token.
func (c *Client) Verify(ctx context.Context, email, code string) (string, error) {
	var out struct {
		Token string `json:"token"`
	}
	if err := c.do(ctx, http.MethodPost, "/api/handles/verify", "", map[string]any{"email": email, "code": strings.TrimSpace(code)}, &out); err != nil {
		return "", err
	}
	return out.Token, nil
}

// Claim claims <name>.<email>; operator may be empty after the first claim.
func (c *Client) Claim(ctx context.Context, token, name, operator string) (string, error) {
	body := map[string]any{"name": name}
	if operator != "" {
		body["operator_name"] = operator
	}
	var out struct {
		Handle string `json:"handle"`
	}
	if err := c.do(ctx, http.MethodPost, "/api/handles/claim", token, body, &out); err != nil {
		return "", err
	}
	return out.Handle, nil
}

// StartPairing asks for a pairing code for handle.
func (c *Client) StartPairing(ctx context.Context, token, handle string) (string, error) {
	var out struct {
		Code string `json:"code"`
	}
	if err := c.do(ctx, http.MethodPost, "/api/pair/start", token, map[string]any{"handle": handle}, &out); err != nil {
		return "", err
	}
	return out.Code, nil
}

// CompletePairing signs pan-pair-v1:<CODE>:<agent-id> with the agent key
// and submits it; it returns the handle now bound.
func (c *Client) CompletePairing(ctx context.Context, code string, agent *keys.Agent) (string, error) {
	var out struct {
		Handle string `json:"handle"`
	}
	code = strings.ToUpper(strings.TrimSpace(code))
	body := map[string]any{"code": code, "agent_id": agent.Public(), "signature": protocol.SignPair(agent, code)}
	if err := c.do(ctx, http.MethodPost, "/api/pair/complete", "", body, &out); err != nil {
		var re *Error
		if errors.As(err, &re) && (re.Status == http.StatusNotFound || re.Status == http.StatusGone || re.Status == http.StatusConflict) {
			if strings.Contains(re.Message, "unknown, used or expired") {
				return "", fmt.Errorf("the pairing code %s is unknown, used or expired: request a new one", code)
			}
			return "", fmt.Errorf("the pairing code %s: %s", code, re.Message)
		}
		return "", err
	}
	return out.Handle, nil
}
