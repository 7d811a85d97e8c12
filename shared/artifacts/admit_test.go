package artifacts

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// register files agent in the registry's bucket as the registry does
// (the fields the store reads: id, sandbox, trust_tier).
func (h *harness) register(agent *keys.Agent, sandbox bool) {
	h.t.Helper()
	kv, err := h.workers[0].svc.JS.CreateOrUpdateKeyValue(h.t.Context(), jetstream.KeyValueConfig{Bucket: RegistryBucket})
	if err != nil {
		h.t.Fatal(err)
	}
	rec := map[string]any{"id": agent.Public(), "name": "test agent", "sandbox": sandbox}
	if sandbox {
		rec["trust_tier"] = "sandbox"
	}
	b, err := json.Marshal(rec)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := kv.Put(h.t.Context(), agent.Public(), b); err != nil {
		h.t.Fatal(err)
	}
}

// agent is a registered agent outside the sandbox: one that may store.
func (h *harness) agent() *keys.Agent {
	h.t.Helper()
	a := bustest.Agent(h.t)
	h.register(a, false)
	return a
}

// TestArtifactsOnlyRegisteredAgentsStore: keys cost nothing, so a quota
// per key binds only keys the registry vouches for. An agent not
// registered (before the registry's bucket exists, and after) and one in
// the sandbox are refused put, put.begin and link, saying what to do; a
// registered agent stores; anyone holding a ref reads it.
func TestArtifactsOnlyRegisteredAgentsStore(t *testing.T) {
	h := start(t, 1, Limits{})
	fresh, sandboxed := bustest.Agent(t), bustest.Agent(t)
	small := map[string]any{"data_b64": b64([]byte("x"))}
	begin := map[string]any{"size": 1, "digest": digestOf([]byte("x"))}

	// No registry bucket yet: nobody is registered.
	if e := h.refuse(fresh, "put", small, errs.Forbidden); !strings.Contains(e.Message, "mesh.registry.register") {
		t.Fatalf("refusal of an unregistered agent %q does not say to register", e.Message)
	}

	owner := h.agent()
	h.register(sandboxed, true)
	stored := h.must(owner, "put", small)
	for _, caller := range []*keys.Agent{fresh, sandboxed} {
		h.refuse(caller, "put", small, errs.Forbidden)
		h.refuse(caller, "put.begin", begin, errs.Forbidden)
		h.refuse(caller, "link", map[string]any{"ref": stored["ref"]}, errs.Forbidden)
		if b, n := h.usageOf(caller); b != 0 || n != 0 {
			t.Fatalf("a refused caller holds %v bytes in %v", b, n)
		}
		// Reading needs only the ref.
		h.must(caller, "fetch", map[string]any{"ref": stored["ref"]})
		h.must(caller, "stat", map[string]any{"ref": stored["ref"]})
	}
	if e := h.refuse(sandboxed, "put", small, errs.Forbidden); !strings.Contains(e.Message, "sandbox") {
		t.Fatalf("refusal of a sandbox agent %q does not say why", e.Message)
	}
	h.must(owner, "put.begin", begin)
	h.must(owner, "link", map[string]any{"ref": stored["ref"]})
}

// TestArtifactsStoreBytes: the object store is bounded as a whole
// (Limits.StoreBytes), whatever the quotas add up to; a put past it is
// QUOTA_EXCEEDED and holds no quota.
func TestArtifactsStoreBytes(t *testing.T) {
	const part = 64 << 10
	h := start(t, 1, Limits{StoreBytes: 4 * part, ChunkBytes: part})
	st, err := h.workers[0].obj.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.(*jetstream.ObjectBucketStatus).StreamInfo().Config; cfg.MaxBytes != 4*part {
		t.Fatalf("the object store's MaxBytes is %d, want %d", cfg.MaxBytes, 4*part)
	}
	owner := h.agent()
	stored := 0
	for range 10 {
		_, err := h.call(owner, "put", map[string]any{"data_b64": b64(randomBytes(t, part))})
		if err != nil {
			if e := errs.As(err); e.Code != errs.QuotaExceeded || !strings.Contains(e.Message, "full") {
				t.Fatalf("put into a full store: %s %q", e.Code, e.Message)
			}
			break
		}
		stored++
	}
	if stored == 0 || stored >= 4 {
		t.Fatalf("%d puts of %d bytes stored in a %d-byte store", stored, part, 4*part)
	}
	if b, n := h.usageOf(owner); b != float64(stored*part) || n != float64(stored) {
		t.Fatalf("usage %v bytes in %v after the store filled; want %d in %d", b, n, stored*part, stored)
	}
}
