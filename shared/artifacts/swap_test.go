package artifacts

import (
	"encoding/base64"
	"testing"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// served reads ref in parts as a reader would and reports the bytes and
// the digest the answers claim; ok is false when a fetch was refused.
func (h *harness) served(reader keys.Signer, ref string) (data []byte, digest string, ok bool) {
	h.t.Helper()
	var offset int64
	for range 10_000 {
		f, err := h.call(reader, "fetch", map[string]any{"ref": ref, "offset": offset})
		if err != nil {
			return nil, "", false
		}
		part, derr := base64.StdEncoding.DecodeString(f["data_b64"].(string))
		if derr != nil {
			h.t.Fatal(derr)
		}
		data, digest = append(data, part...), f["digest"].(string)
		if f["done"] == true {
			return data, digest, true
		}
		offset = int64(f["next_offset"].(float64))
	}
	h.t.Fatal("fetch never done")
	return nil, "", false
}

// TestArtifactsPartSwappedAfterCommit: a part put that passed its check
// (the upload still pending) before the commit sealed the artifact, and
// whose bytes land after the commit hashed them, is never served under the
// committed digest: the fetch of that part is refused.
func TestArtifactsPartSwappedAfterCommit(t *testing.T) {
	h := start(t, 1, Limits{ChunkBytes: 1000})
	owner, reader := h.agent(), bustest.Agent(t)
	data := randomBytes(t, 2000)
	stored := h.upload(owner, data, nil)
	ref := stored["ref"].(string)
	id, _, err := parseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	// The late write of a putPart that checked "pending" before the seal.
	if _, err := h.workers[0].obj.PutBytes(t.Context(), partName(id, 1), randomBytes(t, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.call(reader, "fetch", map[string]any{"ref": ref}); err != nil {
		t.Fatalf("the unchanged part 0: %v", err)
	}
	h.refuse(reader, "fetch", map[string]any{"ref": ref, "offset": 1000}, errs.ArtifactGone)
	if got, digest, ok := h.served(reader, ref); ok {
		t.Fatalf("served %s under the committed %s", digestOf(got), digest)
	}
}

// TestArtifactsPartRacesCommit: parts rewritten (other bytes, same length)
// while the owner commits, on three copies, many times: whatever was
// committed, the bytes served always hash to the digest they are served
// under.
func TestArtifactsPartRacesCommit(t *testing.T) {
	h := start(t, 3, Limits{ChunkBytes: 1000})
	owner, reader := h.agent(), bustest.Agent(t)
	for round := range 20 {
		data := randomBytes(t, 2000)
		b := h.must(owner, "put.begin", map[string]any{"size": len(data), "digest": digestOf(data)})
		id := b["object_id"].(string)
		for i := range 2 {
			h.must(owner, "put", map[string]any{"object_id": id, "index": i, "data_b64": b64(data[i*1000 : (i+1)*1000])})
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 3 {
				// Refused once committed (CONFLICT); that is the point.
				_, _ = h.call(owner, "put", map[string]any{"object_id": id, "index": round % 2, "data_b64": b64(randomBytes(t, 1000))})
			}
		}()
		_, cerr := h.call(owner, "put.commit", map[string]any{"object_id": id})
		<-done
		if cerr != nil {
			continue // the rewrite landed before the hash: refused, nothing stored
		}
		if got, digest, ok := h.served(reader, Ref(id)); ok && digestOf(got) != digest {
			t.Fatalf("round %d: served bytes hashing to %s under %s", round, digestOf(got), digest)
		}
	}
}
