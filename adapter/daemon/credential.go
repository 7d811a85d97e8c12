package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// controlClient calls the mesh control plane.
type controlClient struct {
	base string
	http *http.Client
}

// httpError is a control-plane refusal: its status and {error, code}.
type httpError struct {
	Status  int
	Code    string
	Message string
}

func (e *httpError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("%s (%s, HTTP %d)", e.Message, e.Code, e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// HTTPStatus is the status the control plane answered a failed call with
// (for example Bootstrap's), or 0 when it did not answer at all.
func HTTPStatus(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

// post sends body as JSON to path and decodes the answer into out.
func (c controlClient) post(ctx context.Context, path string, body, out any) error {
	return c.do(ctx, http.MethodPost, path, body, out)
}

// get reads path and decodes the answer into out.
func (c controlClient) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, out)
}

func (c controlClient) do(ctx context.Context, method, path string, body, out any) error {
	if c.base == "" {
		return errors.New("no control URL: pass --control-url or set MESH_CONTROL_URL (meshd prints it when it starts)")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.base, "/")+path, rd)
	if err != nil {
		return fmt.Errorf("control URL %q: %w", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("cannot reach the mesh's control plane at %s: is meshd running?", c.base)
		}
		return fmt.Errorf("the control plane at %s cannot be reached: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("control plane %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
			Code  string `json:"code"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &httpError{Status: resp.StatusCode, Code: e.Code, Message: e.Error}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("control plane %s: unexpected answer: %w", path, err)
		}
	}
	return nil
}

// meshInfo is the "mesh" object of credential answers: a guest lease names
// every endpoint in nats_endpoints, a bootstrap its WebSocket ones in
// endpoints (spec §4.5).
type meshInfo struct {
	Name          string   `json:"name"`
	NATSEndpoints []string `json:"nats_endpoints"`
	Endpoints     []string `json:"endpoints"`
}

func (m meshInfo) urls() []string {
	if len(m.NATSEndpoints) > 0 {
		return m.NATSEndpoints
	}
	return m.Endpoints
}

// Redeemed is what an am_ agent key was exchanged for.
type Redeemed struct {
	Credential *state.Credential
	NATSURLs   []string
	// Label is the name the key was minted with; Handle the handle bound
	// to the agent, when one is.
	Label, Handle string
}

// Bootstrap redeems an am_ agent key for agent (POST /v1/bootstrap), with
// the agent's proof of possession. The key is spent by the call, so the
// caller saves everything it returns before doing anything else. The
// credential's key becomes the adapter's node key (up): renewal then binds
// the node credential to the same key, so the connection's reply prefix
// never changes.
func Bootstrap(ctx context.Context, controlURL, agentKey string, agent *keys.Agent, hc *http.Client) (*Redeemed, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	var out struct {
		Creds     string   `json:"creds"`
		JWT       string   `json:"jwt"`
		Seed      string   `json:"seed"`
		Label     string   `json:"label"`
		Handle    *string  `json:"handle"`
		ExpiresAt string   `json:"expires_at"`
		Mesh      meshInfo `json:"mesh"`
	}
	// The proof says this adapter holds the agent's seed, which the
	// control plane requires for any agent key with a history (an owner, a
	// registration, mail, a retirement); private_inbox asks for a
	// credential whose replies only this connection can read.
	body := map[string]any{"token": agentKey, "agent_id": agent.Public(),
		"proof": protocol.SignBootstrap(agent, agentKey), "private_inbox": true}
	err := controlClient{base: controlURL, http: hc}.post(ctx, "/v1/bootstrap", body, &out)
	if err != nil {
		return nil, fmt.Errorf("redeem the agent key: %w", err)
	}
	jwt, seed := out.JWT, out.Seed
	if jwt == "" || seed == "" {
		if jwt, seed, err = parseCreds(out.Creds); err != nil {
			return nil, fmt.Errorf("redeem the agent key: %w", err)
		}
	}
	r := &Redeemed{Credential: &state.Credential{Kind: "bootstrap", JWT: jwt, Seed: seed, ExpiresAt: out.ExpiresAt},
		NATSURLs: out.Mesh.urls(), Label: out.Label}
	if out.Handle != nil {
		r.Handle = *out.Handle
	}
	return r, nil
}

// parseCreds reads a NATS .creds file's JWT and seed.
func parseCreds(creds string) (jwt, seed string, err error) {
	block := func(name string) string {
		begin := "-----BEGIN " + name + "-----"
		i := strings.Index(creds, begin)
		if i < 0 {
			return ""
		}
		rest := creds[i+len(begin):]
		j := strings.Index(rest, "------END "+name+"------")
		if j < 0 {
			j = strings.Index(rest, "-----END "+name+"-----")
		}
		if j < 0 {
			return ""
		}
		return strings.TrimSpace(rest[:j])
	}
	jwt, seed = block("NATS USER JWT"), block("USER NKEY SEED")
	if jwt == "" || seed == "" {
		return "", "", errors.New("the answer carries no usable credentials")
	}
	return jwt, seed, nil
}

// guestLease is a leased guest credential (POST /v1/guest).
type guestLease struct {
	Key       *keys.Agent
	JWT       string
	ExpiresAt string
	NATS      []string
}

func leaseGuest(ctx context.Context, cc controlClient) (*guestLease, error) {
	var out struct {
		JWT       string   `json:"jwt"`
		Seed      string   `json:"seed"`
		PublicKey string   `json:"publicKey"`
		ExpiresAt string   `json:"expires_at"`
		Mesh      meshInfo `json:"mesh"`
	}
	if err := cc.post(ctx, "/v1/guest", nil, &out); err != nil {
		return nil, fmt.Errorf("lease a guest credential: %w", err)
	}
	k, err := keys.FromSeed[keys.AgentRole]([]byte(out.Seed))
	if err != nil || k.Public() != out.PublicKey {
		return nil, errors.New("lease a guest credential: the seed does not match the leased key")
	}
	return &guestLease{Key: k, JWT: out.JWT, ExpiresAt: out.ExpiresAt, NATS: out.Mesh.urls()}, nil
}

// heartbeat keeps the lease alive; release ends it.
func (g *guestLease) heartbeat(ctx context.Context, cc controlClient) error {
	ts := time.Now().Unix()
	var out struct {
		ExpiresAt string `json:"expires_at"`
	}
	err := cc.post(ctx, "/v1/guest/heartbeat", map[string]any{"publicKey": g.Key.Public(), "ts": ts, "sig": protocol.SignGuestHeartbeat(g.Key, ts)}, &out)
	if err == nil && out.ExpiresAt != "" {
		g.ExpiresAt = out.ExpiresAt
	}
	return err
}

func (g *guestLease) release(ctx context.Context, cc controlClient) error {
	ts := time.Now().Unix()
	return cc.post(ctx, "/v1/guest/release", map[string]any{"publicKey": g.Key.Public(), "ts": ts, "sig": protocol.SignGuestRelease(g.Key, ts)}, nil)
}

// savingRenewer renews through the node-credential door and saves each new
// credential before the runtime uses it, so a restart connects with the
// newest one.
type savingRenewer struct {
	inner node.Renewer
	dir   *state.Dir
}

func (r *savingRenewer) Renew(ctx context.Context, agents []*keys.Agent) (string, time.Time, error) {
	jwt, exp, err := r.inner.Renew(ctx, agents)
	if err != nil {
		return jwt, exp, err
	}
	conf, err := r.dir.Config()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("save the renewed credential: %w", err)
	}
	conf.Credential = &state.Credential{Kind: "node", JWT: jwt, ExpiresAt: protocol.FormatTime(exp)}
	if err := r.dir.SaveConfig(conf); err != nil {
		return "", time.Time{}, fmt.Errorf("save the renewed credential: %w", err)
	}
	return jwt, exp, nil
}

// credentialFor builds the runtime credential from a saved one.
func credentialFor(c *state.Credential, nodeKey *keys.Node) (node.Credential, error) {
	switch c.Kind {
	case "node":
		return node.Credential{JWT: c.JWT, Sign: nodeKey.SignNonce}, nil
	case "bootstrap":
		k, err := keys.FromSeed[keys.CredentialRole]([]byte(c.Seed))
		if err != nil {
			return node.Credential{}, fmt.Errorf("the saved credential's seed: %w", err)
		}
		return node.Credential{JWT: c.JWT, Sign: k.SignNonce}, nil
	}
	return node.Credential{}, fmt.Errorf("the saved credential is of kind %q, which this adapter does not know", c.Kind)
}

// adoptCredentialKey makes a bootstrap credential's key the node key, as
// up does right after the exchange; here for an identity saved before up
// did (or an up interrupted between the two saves). The node credential it
// is renewed for binds to the node key, and the connection's private reply
// prefix is named after the credential key: one key keeps the prefix
// across renewal.
func adoptCredentialKey(dir *state.Dir, id *state.Identity, ks *state.Keys, c *state.Credential) error {
	if c == nil || c.Kind != "bootstrap" {
		return nil
	}
	k, err := keys.FromSeed[keys.NodeRole]([]byte(c.Seed))
	if err != nil {
		return fmt.Errorf("the saved credential's seed: %w", err)
	}
	if k.Public() == ks.Node.Public() {
		return nil
	}
	id.NodeSeed = c.Seed
	if err := dir.SaveIdentity(*id); err != nil {
		return fmt.Errorf("adopt the credential key as the node key: %w", err)
	}
	ks.Node = k
	return nil
}

// servicesKey is the services key to pin: the one saved in conf, else the
// one /v1/capabilities names, saved for the next start (the pin then holds
// even when the control plane cannot be reached). "" when neither is known:
// the node then trusts the broker's permissions alone, and says so.
func (a *adapter) servicesKey(ctx context.Context, conf *state.Config) string {
	if conf.ServicesKey != "" || a.cc.base == "" {
		return conf.ServicesKey
	}
	var caps struct {
		ServicesKey string `json:"services_key"`
	}
	if err := a.cc.get(ctx, "/v1/capabilities", &caps); err != nil || !keys.IsUserPublicKey(caps.ServicesKey) {
		a.log.Warn("the mesh's services key is not known (GET /v1/capabilities): answers from the bus are not pinned to it this time", "err", err)
		return ""
	}
	conf.ServicesKey = caps.ServicesKey
	if err := a.dir.SaveConfig(*conf); err != nil {
		a.log.Warn("the services key was not saved; it is asked again at the next start", "err", err)
	}
	return conf.ServicesKey
}
