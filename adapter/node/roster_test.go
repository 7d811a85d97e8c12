package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
)

// rosterRenewer mints credentials for every roster except those naming a
// refused agent, which it refuses as the door refuses a retired agent
// (403). It keeps the rosters it was asked for.
type rosterRenewer struct {
	fakeRenewer
	refused string
	mu      sync.Mutex
	rosters [][]string
}

func (r *rosterRenewer) Renew(ctx context.Context, agents []*keys.Agent) (string, time.Time, error) {
	ids := make([]string, len(agents))
	for i, a := range agents {
		ids[i] = a.Public()
	}
	slices.Sort(ids)
	r.mu.Lock()
	r.rosters = append(r.rosters, ids)
	r.mu.Unlock()
	if slices.Contains(ids, r.refused) {
		r.calls.Add(1)
		return "", time.Time{}, &ErrRevoked{Status: 403, Code: "FORBIDDEN", Message: "agent " + r.refused + " retired or revoked"}
	}
	return r.fakeRenewer.Renew(ctx, agents)
}

func (r *rosterRenewer) lastRoster() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rosters) == 0 {
		return nil
	}
	return r.rosters[len(r.rosters)-1]
}

// A refused Host is the refusal of a roster the node does not have yet: it
// fails that Host, and the credential of the agents already hosted — and
// its renewal — carry on (H2).
func TestRefusedHostLeavesTheCredentialAlone(t *testing.T) {
	tm := newMesh(t)
	kA, kB, nk := agentKey(t), agentKey(t), nodeKey(t)
	var off atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
	r := &rosterRenewer{fakeRenewer: fakeRenewer{tm: tm, t: t, nk: nk, life: 30 * 24 * time.Hour}, refused: kB.Public()}
	warn := &warnings{}
	n := tm.startNode(t, nk, []*keys.Agent{kA}, func(c *Config) {
		c.Credential = tm.nodeCredential(t, nk, time.Now().Add(3*time.Hour), kA)
		c.Renewer, c.Now, c.Warn, c.CheckEvery = r, now, warn.add, 10*time.Millisecond
	})
	h := newCounter()
	tm.host(t, n, AgentConfig{Key: kA, Name: "a", Offerings: []Offering{{ID: "echo"}}, Handler: h.handle})
	before := n.Health().Credential

	_, err := n.Host(t.Context(), AgentConfig{Key: kB, Name: "b", Handler: refuseAll})
	var refusal *ErrRevoked
	if !errors.As(err, &refusal) || refusal.Status != 403 {
		t.Fatalf("Host of a retired agent: %v", err)
	}
	if n.Agent(kB.Public()) != nil {
		t.Fatal("the refused agent is hosted")
	}
	after := n.Health().Credential
	if after.Revoked || after.LastError != "" || !after.RenewAt.Equal(before.RenewAt) || warn.has("credential_revoked") || warn.has("credential_renewal_failed") {
		t.Fatalf("a refused Host touched the credential: health %+v, warnings %v", after, warn.codes())
	}

	// Agent A keeps working.
	kC := agentKey(t)
	caller := tm.startNode(t, nodeKey(t), []*keys.Agent{kC}, nil)
	c := tm.host(t, caller, AgentConfig{Key: kC, Name: "c", Handler: refuseAll})
	if res, err := c.Request(t.Context(), kA.Public(), "echo", "hi", RequestOptions{Timeout: asyncWait}); err != nil || res.Status != "completed" {
		t.Fatalf("agent A after the refused Host: %+v %v", res, err)
	}

	// And A's credential is still renewed at two thirds, for A's roster.
	calls := r.calls.Load()
	off.Store(int64(2*time.Hour + time.Minute))
	eventually(t, "the renewal of A's roster", func() bool {
		return r.calls.Load() == calls+1 && n.Health().Credential.RenewAt.After(before.RenewAt)
	})
	if got := r.lastRoster(); !slices.Equal(got, []string{kA.Public()}) {
		t.Fatalf("renewed for %v", got)
	}
	if h := n.Health().Credential; h.Revoked || h.LastError != "" {
		t.Fatalf("health after the renewal %+v", h)
	}
}

// Concurrent Hosts each add their agent to the roster: every renewal
// covers every agent hosted before it, so no Host returns success with a
// credential that omits its agent (M6).
func TestConcurrentHostsAllCovered(t *testing.T) {
	tm := newMesh(t)
	k0, nk := agentKey(t), nodeKey(t)
	r := &rosterRenewer{fakeRenewer: fakeRenewer{tm: tm, t: t, nk: nk, life: time.Hour}}
	n := tm.startNode(t, nk, []*keys.Agent{k0}, func(c *Config) { c.Renewer = r })
	tm.host(t, n, AgentConfig{Key: k0, Name: "zero", Handler: refuseAll})

	const hosts = 8
	ks := make([]*keys.Agent, hosts)
	for i := range ks {
		ks[i] = agentKey(t)
	}
	h := newCounter()
	var wg sync.WaitGroup
	errc := make(chan error, 2*hosts)
	for _, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Host(t.Context(), AgentConfig{Key: k, Name: "agent", Offerings: []Offering{{ID: "echo"}}, Handler: h.handle})
			if err != nil {
				errc <- err
			}
		}()
	}
	// The same agent twice at once: exactly one Host succeeds.
	dup := agentKey(t)
	var dupOK atomic.Int64
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.Host(t.Context(), AgentConfig{Key: dup, Name: "dup", Handler: refuseAll}); err == nil {
				dupOK.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("Host: %v", err)
	}
	if dupOK.Load() != 1 {
		t.Fatalf("the same agent was hosted %d times", dupOK.Load())
	}
	for _, k := range append(ks, k0, dup) {
		if !n.covers(k.Public()) {
			t.Fatalf("the credential does not cover agent %s", k.Public())
		}
	}

	// Every agent hears its requests live: its inbox subscription was
	// allowed by the credential in force.
	kC := agentKey(t)
	caller := tm.startNode(t, nodeKey(t), []*keys.Agent{kC}, nil)
	c := tm.host(t, caller, AgentConfig{Key: kC, Name: "c", Handler: refuseAll})
	failures := make(chan error, hosts)
	for _, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Request(t.Context(), k.Public(), "echo", "hi", RequestOptions{Timeout: asyncWait})
			if err != nil || res.Status != "completed" || res.Output.(map[string]any)["source"] != "live" {
				failures <- fmt.Errorf("agent %s: %+v %v", k.Public(), res, err)
			}
		}()
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
}
