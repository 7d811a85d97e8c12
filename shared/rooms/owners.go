package rooms

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/pancard"
)

// RegistrarOwners is the Owners of a rooms worker running apart from the
// registrar (the cloud's rooms-worker): it reverse-resolves an agent with
// GET <registrar>/api/resolve?agent_id=… and believes the card only once
// its signature verifies with a current key of the registrar's key set
// (GET /api/registrar-key), as any resolver does.
//
// The operator is the card's operator.id (account.OperatorID of the
// verified address), never parsed out of the handle: a handle is
// <name>.<email> and a name may hold dots. meshd asks its registrar in
// process instead and computes the same id from the address.
type RegistrarOwners struct {
	base string
	http *http.Client
	now  func() time.Time

	mu     sync.Mutex
	keys   []string
	keysAt time.Time
	cache  map[string]cachedOwner
}

type cachedOwner struct {
	owner Owner
	until time.Time
}

// Cache and refresh bounds of RegistrarOwners: an owner is remembered a
// few minutes (the registrar limits reverse resolves per address, and
// usage asks on every call); the key set is fetched again for a card
// signed by a key it does not list, at most once a minute.
const (
	ownerCacheTTL  = 5 * time.Minute
	ownerCacheSize = 4096
	keySetRefresh  = time.Minute
)

// NewRegistrarOwners returns the Owners asking the registrar at base
// (http or https).
func NewRegistrarOwners(base string) (*RegistrarOwners, error) {
	base = strings.TrimRight(strings.TrimSpace(base), "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("the registrar URL %q is not an http(s) URL", base)
	}
	return &RegistrarOwners{base: base, http: &http.Client{Timeout: 10 * time.Second}, now: time.Now, cache: map[string]cachedOwner{}}, nil
}

// Owner resolves agentID to its handle and operator. An agent bound to no
// handle, or to one reserved with no agent, is NOT_NAMED; a registrar that
// cannot be reached or whose card does not verify is UNAVAILABLE.
func (o *RegistrarOwners) Owner(ctx context.Context, agentID string) (Owner, error) {
	now := o.now()
	o.mu.Lock()
	c, ok := o.cache[agentID]
	o.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.owner, nil
	}
	status, body, err := o.get(ctx, "/api/resolve?agent_id="+url.QueryEscape(agentID))
	switch {
	case err != nil:
		return Owner{}, errs.Wrap(errs.Unavailable, "the registrar cannot be reached to resolve the room's creator; retry shortly", err)
	case status == http.StatusNotFound:
		return Owner{}, notNamed(agentID)
	case status != http.StatusOK:
		return Owner{}, errs.Newf(errs.Unavailable, "the registrar answered HTTP %d to resolving the room's creator; retry shortly", status)
	}
	res, err := pancard.ParseResolution(body)
	if err != nil {
		return Owner{}, errs.Wrap(errs.Unavailable, "the registrar's answer for the room's creator cannot be read", err)
	}
	key, err := o.trusted(ctx, res.RegistrarKey)
	if err != nil {
		return Owner{}, err
	}
	card, err := res.Verify(key, o.base, now)
	if err != nil {
		return Owner{}, errs.Wrap(errs.Unavailable, "the registrar's card for the room's creator does not verify", err)
	}
	agent, err := pancard.AgentOf(card)
	if err != nil || agent != agentID {
		return Owner{}, notNamed(agentID)
	}
	owner := Owner{Handle: card.Handle, Operator: card.Operator.ID}
	if owner.Operator == "" {
		return Owner{}, errs.New(errs.Unavailable, "the registrar's card names no operator id (operator.id), so the room cannot be counted against its operator's quota; the registrar must be this mesh's")
	}
	o.mu.Lock()
	if len(o.cache) >= ownerCacheSize {
		clear(o.cache)
	}
	o.cache[agentID] = cachedOwner{owner: owner, until: now.Add(ownerCacheTTL)}
	o.mu.Unlock()
	return owner, nil
}

func notNamed(agentID string) error {
	return errs.Newf(errs.NotNamed, "agent %s is bound to no handle: claim one and pair this agent (mesh-adapter join), then try again", agentID)
}

// trusted returns key when it is a current key of the registrar's key set,
// fetching the set on first use and again (at most once a minute) for a
// key it does not list.
func (o *RegistrarOwners) trusted(ctx context.Context, key string) (string, error) {
	o.mu.Lock()
	have, fresh := slices.Contains(o.keys, key), o.now().Sub(o.keysAt) < keySetRefresh
	o.mu.Unlock()
	if have {
		return key, nil
	}
	if !fresh {
		status, body, err := o.get(ctx, "/api/registrar-key")
		if err != nil || status != http.StatusOK {
			return "", errs.Wrap(errs.Unavailable, "the registrar's key set cannot be read to check the creator's card; retry shortly",
				fmt.Errorf("HTTP %d: %v", status, err))
		}
		current, err := pancard.CurrentKeys(body, o.base)
		if err != nil {
			return "", errs.Wrap(errs.Unavailable, "the registrar's key set cannot be used", err)
		}
		o.mu.Lock()
		o.keys, o.keysAt = current, o.now()
		o.mu.Unlock()
		if slices.Contains(current, key) {
			return key, nil
		}
	}
	return "", errs.Newf(errs.Unavailable, "the creator's card is signed by %s, which the registrar's key set does not list as current", key)
}

// get fetches path from the registrar: its status and at most 1 MiB of
// its body.
func (o *RegistrarOwners) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := o.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}
