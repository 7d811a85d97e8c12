package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/registry"
)

// BusCommerce is Commerce the way the control plane reaches the bus (as
// shared/accountview does): registry records through the registry
// worker's get and discover, signed with the services key, so a private
// registration stays private; agreements straight from the commerce
// bucket, which the agreements service writes and the console only reads.
type BusCommerce struct {
	Bus *bus.Caller
	JS  jetstream.JetStream
	// Credentials lists an account's agents; Registrar resolves handles
	// (nil: a handle is looked up as unknown).
	Credentials *credential.Service
	Registrar   *registrar.Service
}

// maxAgreementsRead bounds the agreements read for one owner.
const maxAgreementsRead = 1000

// Agent asks mesh.registry.get.<agent>.
func (c *BusCommerce) Agent(ctx context.Context, agent string) (map[string]any, error) {
	if !keys.IsUserPublicKey(agent) {
		return nil, nil
	}
	rec, err := c.Bus.Call(ctx, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, map[string]any{})
	if errs.CodeOf(err) == errs.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry get %s: %w", agent, err)
	}
	return rec, nil
}

// Listing asks mesh.registry.discover for as many public registrations as
// one answer holds.
func (c *BusCommerce) Listing(ctx context.Context) ([]map[string]any, bool, error) {
	out, err := c.Bus.Call(ctx, protocol.SubjDiscover, protocol.TypeDiscover, map[string]any{"limit": registry.MaxDiscoverLimit})
	if err != nil {
		return nil, false, fmt.Errorf("registry discover: %w", err)
	}
	list, _ := out["agents"].([]any)
	recs := make([]map[string]any, 0, len(list))
	for _, v := range list {
		if m, ok := v.(map[string]any); ok {
			recs = append(recs, m)
		}
	}
	total, _ := out["total"].(float64)
	return recs, int(total) <= len(list), nil
}

// Agreements reads the commerce bucket's agr.*.<owner>.* records. A bucket
// not made yet (no agreement was ever filed) holds none.
func (c *BusCommerce) Agreements(ctx context.Context, owner string) ([]HeldAgreement, error) {
	if !keys.IsUserPublicKey(owner) {
		return nil, nil
	}
	kv, err := c.JS.KeyValue(ctx, commerce.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kv %s: %w", commerce.Bucket, err)
	}
	watch, err := kv.Watch(ctx, commerce.AgreementPrefix+"*."+owner+".*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("kv %s: watch: %w", commerce.Bucket, err)
	}
	defer func() { _ = watch.Stop() }()
	var out []HeldAgreement
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, fmt.Errorf("kv %s: watch closed", commerce.Bucket)
			}
			if e == nil || len(out) >= maxAgreementsRead {
				return out, nil
			}
			parts := strings.Split(strings.TrimPrefix(e.Key(), commerce.AgreementPrefix), ".")
			if len(parts) != 3 {
				continue
			}
			h := HeldAgreement{Seller: parts[0], Owner: parts[1], SKU: parts[2]}
			// A record that does not decode is listed as unreadable (its
			// agreement left empty) rather than hidden.
			_ = json.Unmarshal(e.Value(), &h.Record)
			out = append(out, h)
		}
	}
}

// AccountAgents lists the account's enabled agents.
func (c *BusCommerce) AccountAgents(ctx context.Context, accountID string) ([]AccountAgent, error) {
	ags, err := c.Credentials.Agents(ctx, accountID)
	if err != nil {
		return nil, err
	}
	var out []AccountAgent
	for _, a := range ags {
		if a.Enabled {
			out = append(out, AccountAgent{ID: a.ID, Label: a.Label, Handle: a.Handle})
		}
	}
	return out, nil
}

// HandleAgent looks the handle up in the registrar's store.
func (c *BusCommerce) HandleAgent(ctx context.Context, handle string) (string, error) {
	if c.Registrar == nil {
		return "", nil
	}
	h, err := c.Registrar.Lookup(ctx, handle, "")
	if code := errs.CodeOf(err); code == errs.NotFound || code == errs.InvalidRequest {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return h.AgentID, nil
}
