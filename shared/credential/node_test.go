package credential

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// countingStore counts the writes of its transactions by collection.
type countingStore struct {
	store.Store
	mu     sync.Mutex
	writes map[string]int
}

func (s *countingStore) RunTx(ctx context.Context, fn func(store.Tx) error) error {
	return s.Store.RunTx(ctx, func(tx store.Tx) error { return fn(countingTx{tx, s}) })
}

func (s *countingStore) count(coll string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes[coll]
}

type countingTx struct {
	store.Tx
	s *countingStore
}

func (t countingTx) wrote(coll string) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.s.writes[coll]++
}

func (t countingTx) Set(coll, id string, doc any) error {
	t.wrote(coll)
	return t.Tx.Set(coll, id, doc)
}

func (t countingTx) Create(coll, id string, doc any) error {
	t.wrote(coll)
	return t.Tx.Create(coll, id, doc)
}

// recordingRevoker keeps the keys it was asked to revoke.
type recordingRevoker struct{ keys []string }

func (r *recordingRevoker) Revoke(_ context.Context, keys []string, _ time.Time) error {
	r.keys = append(r.keys, keys...)
	return nil
}

func newTestService(t *testing.T) (*Service, *countingStore, *recordingRevoker) {
	t.Helper()
	bs, err := boltstore.Open(filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	tr, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: bs, writes: map[string]int{}}
	rv := &recordingRevoker{}
	return New(Config{Store: cs, Trust: tr, Revoker: rv}), cs, rv
}

func nodeRequest(t *testing.T, node *keys.Node, agents ...*keys.Agent) NodeRequest {
	t.Helper()
	ts := time.Now().Unix()
	ids := make([]string, len(agents))
	r := NodeRequest{NodeID: node.Public(), TS: &ts}
	for i, a := range agents {
		ids[i] = a.Public()
		r.Agents = append(r.Agents, AgentSig{ID: a.Public(), Sig: protocol.SignNodeAgent(a, ts, node.Public())})
	}
	sig, err := protocol.SignNodeCred(node, ts, ids)
	if err != nil {
		t.Fatal(err)
	}
	r.NodeSig = sig
	return r
}

func mustGen[R keys.Role](t *testing.T) *keys.Key[R] {
	t.Helper()
	k, err := keys.Generate[R]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRenewalLeavesHostRecordsAsTheyAre: a node renewing for the same
// roster finds every agent's host record already naming it and does not
// write it again (the mint is still recorded); a new node is added to the
// records; and a retire still revokes every node that carried the agent.
func TestRenewalLeavesHostRecordsAsTheyAre(t *testing.T) {
	ctx := context.Background()
	s, cs, rv := newTestService(t)
	n1, n2 := mustGen[keys.NodeRole](t), mustGen[keys.NodeRole](t)
	a, b := mustGen[keys.AgentRole](t), mustGen[keys.AgentRole](t)

	if _, err := s.NodeCredential(ctx, nodeRequest(t, n1, a, b)); err != nil {
		t.Fatal(err)
	}
	if got := cs.count(CollHosts); got != 2 {
		t.Fatalf("first mint wrote %d host records, want 2", got)
	}
	if _, err := s.NodeCredential(ctx, nodeRequest(t, n1, a, b)); err != nil {
		t.Fatal(err)
	}
	if got := cs.count(CollHosts); got != 2 {
		t.Fatalf("a renewal for the same roster rewrote host records: %d writes in all, want 2", got)
	}
	if got := cs.count(CollMints); got != 2 {
		t.Fatalf("%d mint records, want one per mint (2)", got)
	}
	if _, err := s.NodeCredential(ctx, nodeRequest(t, n2, a)); err != nil {
		t.Fatal(err)
	}
	if got := cs.count(CollHosts); got != 3 {
		t.Fatalf("a new node's mint wrote %d host records in all, want 3", got)
	}
	var h hosts
	if err := store.Get(ctx, cs, CollHosts, a.Public(), &h); err != nil {
		t.Fatal(err)
	}
	if want := []string{n1.Public(), n2.Public()}; h.AgentID != a.Public() || !slices.Equal(h.Keys, want) {
		t.Fatalf("host record of a = %+v, want agent %s keys %v", h, a.Public(), want)
	}
	if err := s.RetireAgent(ctx, a.Public(), "test"); err != nil {
		t.Fatal(err)
	}
	if want := []string{n1.Public(), n2.Public()}; !slices.Equal(rv.keys, want) {
		t.Fatalf("retire revoked %v, want %v", rv.keys, want)
	}
}

// TestRosterRefusalIsTheFirstInOrder: however the roster's verifications
// are shared out, a request is refused for the first signature that fails
// in the order node, then agents as listed, and nothing is recorded.
func TestRosterRefusalIsTheFirstInOrder(t *testing.T) {
	ctx := context.Background()
	s, cs, _ := newTestService(t)
	node := mustGen[keys.NodeRole](t)
	agents := make([]*keys.Agent, MaxRoster)
	for i := range agents {
		agents[i] = mustGen[keys.AgentRole](t)
	}
	other := mustGen[keys.AgentRole](t)
	spoil := func(r NodeRequest, i int) NodeRequest {
		r.Agents = slices.Clone(r.Agents)
		r.Agents[i].Sig = protocol.SignNodeAgent(other, *r.TS, r.NodeID) // valid base64, wrong key
		return r
	}
	good := nodeRequest(t, node, agents...)
	badNode := good
	badNode.NodeSig = good.Agents[0].Sig
	for _, c := range []struct {
		name   string
		req    NodeRequest
		prefix string // agent_prefix of the refusal; "" for node_sig
	}{
		{"node and an agent", spoil(badNode, 9), ""},
		{"node", badNode, ""},
		{"first agent", spoil(good, 0), agents[0].Public()[:12]},
		{"last agent", spoil(good, MaxRoster-1), agents[MaxRoster-1].Public()[:12]},
		{"two agents", spoil(spoil(good, 11), 3), agents[3].Public()[:12]},
		{"two agents far apart", spoil(spoil(good, 15), 1), agents[1].Public()[:12]},
	} {
		_, err := s.NodeCredential(ctx, c.req)
		var e *errs.Error
		if !errors.As(err, &e) || e.Code != errs.IdentityMismatch {
			t.Fatalf("%s: err = %v, want IDENTITY_MISMATCH", c.name, err)
		}
		got, _ := e.Details["agent_prefix"].(string)
		if got != c.prefix || (c.prefix == "") != strings.Contains(e.Message, "node_sig") {
			t.Fatalf("%s: refused %q (agent_prefix %q), want agent_prefix %q", c.name, e.Message, got, c.prefix)
		}
	}
	if n := cs.count(CollMints) + cs.count(CollHosts); n != 0 {
		t.Fatalf("refused requests wrote %d records", n)
	}
	if _, err := s.NodeCredential(ctx, good); err != nil {
		t.Fatalf("the unspoiled request: %v", err)
	}
}

// TestShareChecksRunsEachOnce: however the shares fall between the
// verifiers and the caller, every check runs exactly once before
// shareChecks returns, from many callers at once.
func TestShareChecksRunsEachOnce(t *testing.T) {
	var wg sync.WaitGroup
	for caller := range 8 {
		wg.Go(func() {
			for n := range 40 {
				counts := make([]int32, n)
				var mu sync.Mutex
				shareChecks(n, func(from, to int) {
					mu.Lock()
					defer mu.Unlock()
					for i := from; i < to; i++ {
						counts[i]++
					}
				})
				for i, c := range counts {
					if c != 1 {
						t.Errorf("caller %d, n %d: check %d ran %d times", caller, n, i, c)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
