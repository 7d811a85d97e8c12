package engagement_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// fakeDir is the registry as the tests set it.
type fakeDir struct {
	mu     sync.Mutex
	agents map[string]engagement.AgentInfo
	err    error
}

func (f *fakeDir) Agent(_ context.Context, agent string, _ time.Time) (engagement.AgentInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return engagement.AgentInfo{}, f.err
	}
	return f.agents[agent], nil
}

func (f *fakeDir) set(agent string, info engagement.AgentInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info.Registered = true
	f.agents[agent] = info
}

// memTerms is the bus bucket in memory, with revisions.
type memTerms struct {
	mu   sync.Mutex
	vals map[string][]byte
	revs map[string]uint64
	seq  uint64
	fail error
}

func newMemTerms() *memTerms { return &memTerms{vals: map[string][]byte{}, revs: map[string]uint64{}} }

func (m *memTerms) Get(_ context.Context, key string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, 0, m.fail
	}
	return m.vals[key], m.revs[key], nil
}

func (m *memTerms) Put(_ context.Context, key string, value []byte, rev uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	if m.revs[key] != rev {
		return engagement.ErrConflict
	}
	m.seq++
	m.vals[key], m.revs[key] = value, m.seq
	return nil
}

func (m *memTerms) Delete(_ context.Context, key string, rev uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.revs[key] != rev {
		return engagement.ErrConflict
	}
	delete(m.vals, key)
	delete(m.revs, key)
	return nil
}

func (m *memTerms) terms(t *testing.T, key string) *commerce.EngagementTerms {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[key]
	if !ok {
		return nil
	}
	var out commerce.EngagementTerms
	if err := json.Unmarshal(v, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// world is one engagement service with a provider and a client agent, each
// registered under its own owner key, and a stranger.
type world struct {
	t                          *testing.T
	svc                        *engagement.Service
	dir                        *fakeDir
	terms                      *memTerms
	clock                      *clock
	provider, client, stranger *keys.Agent
	pOwner, cOwner, sOwner     *keys.Agent
	accounts                   map[string]bool
}

var epoch = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

func newKey(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newWorld(t *testing.T) *world {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	w := &world{t: t, dir: &fakeDir{agents: map[string]engagement.AgentInfo{}}, terms: newMemTerms(), clock: &clock{t: epoch},
		provider: newKey(t), client: newKey(t), stranger: newKey(t), pOwner: newKey(t), cOwner: newKey(t), sOwner: newKey(t),
		accounts: map[string]bool{}}
	w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize", "translate"}})
	w.dir.set(w.client.Public(), engagement.AgentInfo{Owner: w.cOwner.Public(), Offerings: []string{"buy"}})
	w.dir.set(w.stranger.Public(), engagement.AgentInfo{Owner: w.sOwner.Public()})
	w.svc = engagement.New(engagement.Config{Store: st, Directory: w.dir, Terms: w.terms, Now: w.clock.Now,
		Accounts: func(_ context.Context, agent string) (bool, error) { return w.accounts[agent], nil }})
	return w
}

// template is a standing proposal's value: every grade one this runtime
// enforces (no volume or scope graded enforced: the provider publishes no
// SKU in newWorld).
func (w *world) template() map[string]any {
	return map[string]any{
		"sow": "v1", "id": "sow_test0000000001", "version": 1, "starts_at": nil, "ends_at": nil,
		"parties": map[string]any{
			"provider": map[string]any{"agent": w.provider.Public(), "owner": "Provider Ltd"},
			"client":   nil, "grade": "evidence"},
		"scope":          map[string]any{"offerings": []any{"summarize"}, "grade": "evidence"},
		"price":          map[string]any{"arrangement": "no_charge", "grade": "recorded"},
		"change_control": map[string]any{"review_window_days": 7, "approval": map[string]any{"formation": "agent", "amendment": "agent"}, "grade": "enforced"},
		"termination":    map[string]any{"convenience_notice_hours": 24, "grade": "recorded"},
		"disputes":       map[string]any{"posture": "escalate_to_owners", "grade": "evidence"},
	}
}

// clone deep-copies a document value.
func clone(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sign appends role's signature by k and returns the bytes as a client
// would send them (indented: not canonical, so exact-bytes storage shows).
func (w *world) sign(doc map[string]any, role string, k keys.Signer) []byte {
	w.t.Helper()
	s, err := sow.Sign(doc, k, role, w.clock.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	sigs, _ := doc["signatures"].([]any)
	doc["signatures"] = append(sigs, map[string]any{"role": s.Role, "key": s.Key, "signed_at": s.SignedAt, "sig": s.Sig})
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// instance completes a template for the client: the seat, the term.
func (w *world) instance(tmpl map[string]any) map[string]any {
	d := clone(w.t, tmpl)
	delete(d, "signatures")
	d["parties"].(map[string]any)["client"] = map[string]any{"agent": w.client.Public(), "owner": "Client Inc"}
	d["starts_at"] = w.clock.Now().Format(time.RFC3339)
	d["ends_at"] = w.clock.Now().AddDate(0, 6, 0).Format(time.RFC3339)
	return d
}

// form files tmpl, countersigns and signs it; it returns the agreed value.
func (w *world) form(tmpl map[string]any) map[string]any {
	w.t.Helper()
	ctx := context.Background()
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(w.t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		w.t.Fatalf("file: %v", err)
	}
	inst := w.instance(tmpl)
	if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
		w.t.Fatalf("countersign: %v", err)
	}
	if _, err := w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner)); err != nil {
		w.t.Fatalf("sign: %v", err)
	}
	return inst
}

// act builds and signs an act under tag.
func (w *world) act(tag string, k keys.Signer, members map[string]any) []byte {
	w.t.Helper()
	obj := map[string]any{"v": 1, "client": w.client.Public(), "seller": w.provider.Public(), "offering": "summarize",
		"sow_id": "sow_test0000000001", "at": w.clock.Now().Format(time.RFC3339)}
	if _, set := members["proposal_sha256"]; tag == engagement.TagAmendment && !set {
		obj["proposal_sha256"] = w.openDigest()
	}
	for k, v := range members {
		if v == nil {
			delete(obj, k)
			continue
		}
		obj[k] = v
	}
	if err := engagement.SignAct(tag, obj, k); err != nil {
		w.t.Fatal(err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// openDigest is the hex SHA-256 of the open proposal's bytes, what a
// resolution binds itself to (zeros when none is open).
func (w *world) openDigest() string {
	v, err := w.svc.Engagement(context.Background(), w.client.Public(), w.provider.Public(), "summarize")
	if err != nil || v.Open == nil {
		return strings.Repeat("0", 64)
	}
	sum := sha256.Sum256([]byte(v.Open.Document))
	return hex.EncodeToString(sum[:])
}

func (w *world) view() *engagement.View {
	w.t.Helper()
	v, err := w.svc.Engagement(context.Background(), w.client.Public(), w.provider.Public(), "summarize")
	if err != nil {
		w.t.Fatalf("view: %v", err)
	}
	return v
}

// refused asserts err is the refusal code.
func refused(t *testing.T, err error, code errs.Code, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want %s", what, code)
	}
	if got := errs.CodeOf(err); got != code {
		t.Fatalf("%s: %s (%v), want %s", what, got, err, code)
	}
}

var errBus = errors.New("bus down")
