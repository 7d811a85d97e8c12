package artifacts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

type harness struct {
	t       *testing.T
	nc      *nats.Conn
	clock   *bustest.Clock
	workers []*Worker
}

// start runs copies of the worker on one broker, sharing a test clock; the
// sweep runs only when the test calls it.
func start(t *testing.T, copies int, l Limits) *harness {
	t.Helper()
	m := bustest.Start(t)
	h := &harness{t: t, nc: bustest.Client(t, m), clock: &bustest.Clock{}}
	for range copies {
		w, err := Start(t.Context(), bustest.Env(t, m, Name, h.clock.Now), Config{Limits: l, SweepEvery: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	return h
}

// call signs payload as signer, stamped with the test clock (the workers
// refuse envelopes outside their freshness window), and calls
// mesh.artifacts.<verb>.
func (h *harness) call(signer keys.Signer, verb string, payload any) (map[string]any, error) {
	h.t.Helper()
	req, err := protocol.New(protocol.TypeRequest, signer.Public(), payload)
	if err != nil {
		h.t.Fatal(err)
	}
	req.TS = protocol.FormatTime(h.clock.Now())
	if err := req.Sign(signer); err != nil {
		h.t.Fatal(err)
	}
	data, err := req.Marshal()
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.t.Context(), 30*time.Second)
	defer cancel()
	msg, err := h.nc.RequestWithContext(ctx, protocol.ArtifactVerbSubject(verb), data)
	if err != nil {
		h.t.Fatalf("%s: %v", verb, err)
	}
	rep, err := protocol.Decode(msg.Data)
	if err != nil {
		h.t.Fatalf("%s: answer: %v", verb, err)
	}
	if e := bus.ErrorOf(rep); e != nil {
		return nil, e
	}
	var out map[string]any
	if err := json.Unmarshal(rep.Payload, &out); err != nil {
		h.t.Fatalf("%s answer %s: %v", verb, rep.Payload, err)
	}
	return out, nil
}

func (h *harness) must(signer keys.Signer, verb string, payload any) map[string]any {
	h.t.Helper()
	out, err := h.call(signer, verb, payload)
	if err != nil {
		h.t.Fatalf("%s: %v", verb, err)
	}
	return out
}

func (h *harness) refuse(signer keys.Signer, verb string, payload any, want errs.Code) *errs.Error {
	h.t.Helper()
	out, err := h.call(signer, verb, payload)
	if err == nil {
		h.t.Fatalf("%s answered %v; want %s", verb, out, want)
	}
	e := errs.As(err)
	if e.Code != want {
		h.t.Fatalf("%s: %s %q; want %s", verb, e.Code, e.Message, want)
	}
	return e
}

// upload puts data in parts through put.begin, put and put.commit, the
// parts sent at once (so several copies take them).
func (h *harness) upload(owner keys.Signer, data []byte, extra map[string]any) map[string]any {
	h.t.Helper()
	begin := map[string]any{"size": len(data), "digest": digestOf(data)}
	for k, v := range extra {
		begin[k] = v
	}
	b := h.must(owner, "put.begin", begin)
	id, chunk, n := b["object_id"].(string), int(b["chunk_bytes"].(float64)), int(b["chunks"].(float64))
	if b["ref"] != Ref(id) || n != (len(data)+chunk-1)/chunk {
		h.t.Fatalf("put.begin answered %v for %d bytes", b, len(data))
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			part := data[i*chunk : min((i+1)*chunk, len(data))]
			if _, err := h.call(owner, "put", map[string]any{"object_id": id, "index": i, "data_b64": b64(part)}); err != nil {
				h.t.Errorf("part %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	return h.must(owner, "put.commit", map[string]any{"object_id": id})
}

// download fetches ref from offset 0 to done, and checks the answers agree.
func (h *harness) download(reader keys.Signer, ref string) []byte {
	h.t.Helper()
	var out []byte
	var offset int64
	for range 10_000 {
		f := h.must(reader, "fetch", map[string]any{"ref": ref, "offset": offset})
		if f["offset"] != float64(offset) {
			h.t.Fatalf("fetch from %d answered offset %v", offset, f["offset"])
		}
		data, err := base64.StdEncoding.DecodeString(f["data_b64"].(string))
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, data...)
		if f["done"] == true {
			if _, ok := f["next_offset"]; ok || int64(len(out)) != int64(f["size"].(float64)) {
				h.t.Fatalf("last part %v after %d bytes", f, len(out))
			}
			if digestOf(out) != f["digest"] {
				h.t.Fatalf("downloaded bytes hash to %s, the store says %s", digestOf(out), f["digest"])
			}
			return out
		}
		offset = int64(f["next_offset"].(float64))
	}
	h.t.Fatal("download never done")
	return nil
}

func (h *harness) usageOf(owner keys.Signer) (bytes, objects float64) {
	h.t.Helper()
	u := h.must(owner, "usage", map[string]any{})
	return u["bytes"].(float64), u["objects"].(float64)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return DigestPrefix + hex.EncodeToString(sum[:])
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestArtifactsChunked: a ~3 MB file put in parts through three copies,
// read back in parts, stated, refused removal by another agent, removed by
// its owner; usage follows.
func TestArtifactsChunked(t *testing.T) {
	h := start(t, 3, Limits{})
	owner, other := h.agent(), h.agent()
	data := randomBytes(t, 3<<20+12345)

	stored := h.upload(owner, data, map[string]any{"name": "model.bin", "media_type": "application/x-model"})
	ref := stored["ref"].(string)
	if stored["digest"] != digestOf(data) || stored["size"] != float64(len(data)) || stored["name"] != "model.bin" ||
		stored["media_type"] != "application/x-model" || stored["expires_at"] == nil {
		t.Fatalf("put.commit answered %v", stored)
	}
	// Committing again answers the same artifact.
	if again := h.must(owner, "put.commit", map[string]any{"object_id": strings.TrimPrefix(ref, refPrefix)}); again["ref"] != ref {
		t.Fatalf("second commit answered %v", again)
	}

	// Whoever holds the ref reads it.
	if got := h.download(other, ref); !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes that differ from the %d put", len(got), len(data))
	}
	// From an offset inside a part.
	f := h.must(other, "fetch", map[string]any{"ref": ref, "offset": DefaultChunkBytes + 10})
	if got, _ := base64.StdEncoding.DecodeString(f["data_b64"].(string)); !bytes.Equal(got, data[DefaultChunkBytes+10:2*DefaultChunkBytes]) ||
		f["next_offset"] != float64(2*DefaultChunkBytes) {
		t.Fatalf("fetch from inside a part answered %d bytes, next %v", len(got), f["next_offset"])
	}
	h.refuse(other, "fetch", map[string]any{"ref": ref, "offset": len(data)}, errs.InputInvalid)

	st := h.must(other, "stat", map[string]any{"ref": ref})
	if st["state"] != stateStored || st["gone"] != false || st["size"] != float64(len(data)) || st["digest"] != digestOf(data) {
		t.Fatalf("stat answered %v", st)
	}
	if b, n := h.usageOf(owner); b != float64(len(data)) || n != 1 {
		t.Fatalf("usage %v bytes in %v artifacts; want %d in 1", b, n, len(data))
	}
	if b, n := h.usageOf(other); b != 0 || n != 0 {
		t.Fatalf("the reader's usage is %v bytes in %v", b, n)
	}

	h.refuse(other, "remove", map[string]any{"ref": ref}, errs.Forbidden)
	if r := h.must(owner, "remove", map[string]any{"ref": ref}); r["removed"] != true {
		t.Fatalf("remove answered %v", r)
	}
	h.refuse(other, "fetch", map[string]any{"ref": ref}, errs.ArtifactGone)
	if st := h.must(other, "stat", map[string]any{"ref": ref}); st["gone"] != true {
		t.Fatalf("stat after remove: %v", st)
	}
	if r := h.must(owner, "remove", map[string]any{"ref": ref}); r["removed"] != false {
		t.Fatalf("second remove answered %v", r)
	}
	if b, n := h.usageOf(owner); b != 0 || n != 0 {
		t.Fatalf("usage after remove: %v bytes in %v", b, n)
	}
	// The parts are gone from the object store.
	if _, err := h.workers[0].obj.GetInfo(t.Context(), partName(strings.TrimPrefix(ref, refPrefix), 0)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("part 0 after remove: %v", err)
	}
}

func TestArtifactsPut(t *testing.T) {
	h := start(t, 1, Limits{})
	owner := h.agent()
	data := []byte("a small report")

	got := h.must(owner, "put", map[string]any{"data_b64": b64(data), "name": "report.txt", "media_type": "text/plain"})
	if got["digest"] != digestOf(data) || got["size"] != float64(len(data)) || got["media_type"] != "text/plain" {
		t.Fatalf("put answered %v", got)
	}
	f := h.must(owner, "fetch", map[string]any{"ref": got["ref"]})
	if f["data_b64"] != b64(data) || f["done"] != true || f["name"] != "report.txt" {
		t.Fatalf("fetch answered %v", f)
	}
	if _, ok := f["next_offset"]; ok {
		t.Fatalf("a one-part file has a next offset: %v", f)
	}

	// Defaults: octet-stream, 8 days; retain_days is clamped to 30.
	plain := h.must(owner, "put", map[string]any{"data_b64": b64(nil)})
	if plain["media_type"] != DefaultMediaType {
		t.Fatalf("put without a media type: %v", plain)
	}
	long := h.must(owner, "put", map[string]any{"data_b64": b64(data), "retain_days": 365})
	exp, _ := protocol.ParseTime(long["expires_at"].(string))
	if d := exp.Sub(h.clock.Now()); d > DefaultMaxRetain || d < DefaultMaxRetain-time.Minute {
		t.Fatalf("retain_days 365 kept for %v; want the 30-day maximum", d)
	}

	e := h.refuse(owner, "put", map[string]any{"data_b64": b64(make([]byte, DefaultChunkBytes+1))}, errs.PayloadTooLarge)
	if !strings.Contains(e.Message, "put.begin") {
		t.Fatalf("refusal %q does not point at put.begin", e.Message)
	}
	h.refuse(owner, "put", map[string]any{"data_b64": "not base64!"}, errs.InputInvalid)
	h.refuse(owner, "fetch", map[string]any{"ref": "mesh:artifacts:" + newID()}, errs.NotFound)
	h.refuse(owner, "fetch", map[string]any{"ref": "sha256:abc"}, errs.InputInvalid)
}

func TestArtifactsCommitChecks(t *testing.T) {
	h := start(t, 3, Limits{ChunkBytes: 1000})
	owner, other := h.agent(), h.agent()
	data := randomBytes(t, 2500)

	b := h.must(owner, "put.begin", map[string]any{"size": len(data), "digest": digestOf(data)})
	id := b["object_id"].(string)
	if b["chunks"] != float64(3) || b["chunk_bytes"] != float64(1000) {
		t.Fatalf("put.begin answered %v", b)
	}
	part := func(i int, chunk []byte) map[string]any {
		return map[string]any{"object_id": id, "index": i, "data_b64": b64(chunk)}
	}
	h.must(owner, "put", part(0, data[:1000]))
	h.refuse(other, "put", part(1, data[1000:2000]), errs.Forbidden)
	h.refuse(owner, "put", part(1, data[1000:1999]), errs.InputInvalid) // short
	h.refuse(owner, "put", part(3, data[:500]), errs.InputInvalid)      // no such part
	h.refuse(owner, "put", map[string]any{"object_id": id, "data_b64": b64(data[:10])}, errs.InputInvalid)
	h.must(owner, "put", part(2, data[2000:]))

	// Not readable before the commit; the commit waits for the missing part.
	h.refuse(owner, "fetch", map[string]any{"ref": Ref(id)}, errs.NotFound)
	e := h.refuse(owner, "put.commit", map[string]any{"object_id": id}, errs.InputInvalid)
	if !strings.Contains(e.Message, "part 1 of 3") {
		t.Fatalf("commit with a missing part: %q", e.Message)
	}
	h.refuse(other, "put.commit", map[string]any{"object_id": id}, errs.Forbidden)
	h.must(owner, "put", part(1, data[1000:2000]))
	h.must(owner, "put", part(1, data[1000:2000])) // a part sent twice is kept once
	if got := h.must(owner, "put.commit", map[string]any{"object_id": id}); got["digest"] != digestOf(data) {
		t.Fatalf("commit answered %v", got)
	}
	h.refuse(owner, "put", part(0, data[:1000]), errs.Conflict)
	if got := h.download(other, Ref(id)); !bytes.Equal(got, data) {
		t.Fatal("downloaded bytes differ")
	}

	// Bytes that do not hash to the declared digest are not stored.
	wrong := h.must(owner, "put.begin", map[string]any{"size": 10, "digest": digestOf([]byte("0123456789"))})
	wid := wrong["object_id"].(string)
	h.must(owner, "put", map[string]any{"object_id": wid, "index": 0, "data_b64": b64([]byte("9876543210"))})
	if b, n := h.usageOf(owner); b != 2510 || n != 2 {
		t.Fatalf("usage with a begun upload: %v bytes in %v; want 2510 in 2", b, n)
	}
	e = h.refuse(owner, "put.commit", map[string]any{"object_id": wid}, errs.InputInvalid)
	if !strings.Contains(e.Message, digestOf([]byte("9876543210"))) {
		t.Fatalf("digest refusal %q does not name what arrived", e.Message)
	}
	h.refuse(owner, "put.commit", map[string]any{"object_id": wid}, errs.ArtifactGone)
	if b, n := h.usageOf(owner); b != 2500 || n != 1 {
		t.Fatalf("usage after the refused commit: %v bytes in %v; want 2500 in 1", b, n)
	}

	// A begun upload its owner gives up on is removed with its ref.
	gave := h.must(owner, "put.begin", map[string]any{"size": 5, "digest": digestOf([]byte("hello"))})
	if r := h.must(owner, "remove", map[string]any{"ref": gave["ref"]}); r["removed"] != true {
		t.Fatalf("remove of a begun upload: %v", r)
	}
	if b, _ := h.usageOf(owner); b != 2500 {
		t.Fatalf("usage after removing a begun upload: %v", b)
	}

	h.refuse(owner, "put.begin", map[string]any{"size": DefaultObjectBytes + 1, "digest": digestOf(nil)}, errs.PayloadTooLarge)
	h.refuse(owner, "put.begin", map[string]any{"size": 10}, errs.InputInvalid)
	h.refuse(owner, "put.commit", map[string]any{"object_id": newID()}, errs.NotFound)
}

// TestArtifactsQuota: one owner's bytes and objects are bounded, races of
// three copies included; removing gives the quota back.
func TestArtifactsQuota(t *testing.T) {
	const size, fits = 1000, 8
	h := start(t, 3, Limits{OwnerBytes: fits * size, OwnerObjects: 10})
	owner := h.agent()

	var wg sync.WaitGroup
	results := make([]map[string]any, 20)
	errsOf := make([]error, 20)
	for i := range results {
		wg.Go(func() {
			results[i], errsOf[i] = h.call(owner, "put", map[string]any{"data_b64": b64(randomBytes(t, size))})
		})
	}
	wg.Wait()
	var refs []string
	for i, err := range errsOf {
		switch {
		case err == nil:
			refs = append(refs, results[i]["ref"].(string))
		case errs.As(err).Code != errs.QuotaExceeded:
			t.Fatalf("put: %v", err)
		}
	}
	if len(refs) != fits {
		t.Fatalf("%d puts stored; want %d", len(refs), fits)
	}
	if b, n := h.usageOf(owner); b != fits*size || n != fits {
		t.Fatalf("usage %v bytes in %v; want %d in %d", b, n, fits*size, fits)
	}
	// A begun upload counts from put.begin.
	h.refuse(owner, "put.begin", map[string]any{"size": 1, "digest": digestOf([]byte("x"))}, errs.QuotaExceeded)
	h.must(owner, "remove", map[string]any{"ref": refs[0]})
	h.must(owner, "put.begin", map[string]any{"size": size, "digest": digestOf(make([]byte, size))})

	// The object count.
	small := h.agent()
	for range 10 {
		h.must(small, "put", map[string]any{"data_b64": b64([]byte("x"))})
	}
	e := h.refuse(small, "put", map[string]any{"data_b64": b64([]byte("x"))}, errs.QuotaExceeded)
	if !strings.Contains(e.Message, "10 artifacts") {
		t.Fatalf("object-count refusal %q", e.Message)
	}
}

func TestArtifactsLink(t *testing.T) {
	h := start(t, 1, Limits{})
	owner, friend, stranger := h.agent(), h.agent(), h.agent()
	data := []byte("shared for an hour")
	stored := h.must(owner, "put", map[string]any{"data_b64": b64(data), "name": "notes.md"})
	ref := stored["ref"].(string)

	// Anyone holding the ref may link it; the link reads and stats.
	l := h.must(friend, "link", map[string]any{"ref": ref, "ttl_s": 600, "download_name": "shared.md"})
	lref := l["link"].(string)
	if !strings.HasPrefix(lref, linkPrefix) || l["url"] != lref || l["ref"] != ref || l["name"] != "shared.md" ||
		l["digest"] != digestOf(data) || l["size"] != float64(len(data)) {
		t.Fatalf("link answered %v", l)
	}
	if got := h.download(stranger, lref); !bytes.Equal(got, data) {
		t.Fatal("the link read other bytes")
	}
	st := h.must(stranger, "stat", map[string]any{"ref": lref})
	if st["link_expires_at"] != l["expires_at"] || st["state"] != stateStored {
		t.Fatalf("stat of a link: %v", st)
	}
	h.refuse(owner, "remove", map[string]any{"ref": lref}, errs.Forbidden)
	h.refuse(friend, "link", map[string]any{"ref": lref}, errs.InputInvalid)

	// Past its ttl the link is gone; the artifact is not.
	h.clock.Advance(11 * time.Minute)
	h.refuse(stranger, "fetch", map[string]any{"ref": lref}, errs.ArtifactGone)
	h.must(friend, "fetch", map[string]any{"ref": ref})
	if err := h.workers[0].Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.workers[0].kv.Get(t.Context(), linkKey(strings.TrimPrefix(lref, linkPrefix))); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("an expired link after the sweep: %v", err)
	}

	// A link never outlives its artifact, and dies with it.
	l2 := h.must(friend, "link", map[string]any{"ref": ref, "ttl_s": 30 * 24 * 3600})
	exp, _ := protocol.ParseTime(l2["expires_at"].(string))
	if art, _ := protocol.ParseTime(stored["expires_at"].(string)); exp.After(art) {
		t.Fatalf("link expires %v, after its artifact %v", exp, art)
	}
	h.must(owner, "remove", map[string]any{"ref": ref})
	h.refuse(stranger, "fetch", map[string]any{"ref": l2["link"]}, errs.ArtifactGone)
}

// TestArtifactsSweep: expired artifacts and abandoned uploads are dropped
// and their quota given back; a tombstone answers gone, then not found.
func TestArtifactsSweep(t *testing.T) {
	h := start(t, 3, Limits{})
	owner := h.agent()
	kept := h.must(owner, "put", map[string]any{"data_b64": b64([]byte("kept")), "retain_days": 3})
	brief := h.must(owner, "put", map[string]any{"data_b64": b64([]byte("brief")), "retain_days": 1})
	begun := h.must(owner, "put.begin", map[string]any{"size": 10, "digest": digestOf(make([]byte, 10))})
	h.must(owner, "put", map[string]any{"object_id": begun["object_id"], "index": 0, "data_b64": b64(make([]byte, 10))})

	h.clock.Advance(25 * time.Hour)
	// Expired reads as gone before any sweep.
	h.refuse(owner, "fetch", map[string]any{"ref": brief["ref"]}, errs.ArtifactGone)
	if st := h.must(owner, "stat", map[string]any{"ref": brief["ref"]}); st["gone"] != true {
		t.Fatalf("stat of an expired artifact: %v", st)
	}
	// Three copies sweep at once; each thing is done once.
	var wg sync.WaitGroup
	for _, w := range h.workers {
		wg.Go(func() {
			if err := w.Sweep(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if b, n := h.usageOf(owner); b != 4 || n != 1 {
		t.Fatalf("usage after the sweep: %v bytes in %v; want the 4 kept bytes", b, n)
	}
	h.refuse(owner, "put.commit", map[string]any{"object_id": begun["object_id"]}, errs.ArtifactGone)
	h.must(owner, "fetch", map[string]any{"ref": kept["ref"]})
	if _, err := h.workers[0].obj.GetInfo(t.Context(), partName(begun["object_id"].(string), 0)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("an abandoned upload's part after the sweep: %v", err)
	}

	h.clock.Advance(DefaultTombstone + time.Hour)
	if err := h.workers[1].Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.refuse(owner, "stat", map[string]any{"ref": brief["ref"]}, errs.NotFound)
	if b, n := h.usageOf(owner); b != 0 || n != 0 {
		t.Fatalf("usage after everything expired: %v bytes in %v", b, n)
	}

	// Quota held for an artifact the store does not know is given back.
	w := h.workers[2]
	if err := w.reserve(t.Context(), owner.Public(), newID(), 7); err != nil {
		t.Fatal(err)
	}
	if err := w.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b, n := h.usageOf(owner); b != 0 || n != 0 {
		t.Fatalf("leaked reservation after the sweep: %v bytes in %v", b, n)
	}
}

// TestLeaderPartInfo: the commit's second look at a part, at the object
// store stream's leader, finds a stored part and not a deleted or missing
// one.
func TestLeaderPartInfo(t *testing.T) {
	h := start(t, 1, Limits{})
	w := h.workers[0]
	if _, err := w.obj.PutBytes(t.Context(), partName("x", 0), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if info, err := w.leaderPartInfo(t.Context(), partName("x", 0)); err != nil || info.Size != 5 || info.Name != partName("x", 0) {
		t.Fatalf("stored part: %+v, %v", info, err)
	}
	if err := w.obj.Delete(t.Context(), partName("x", 0)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{partName("x", 0), partName("never", 0)} {
		if _, err := w.leaderPartInfo(t.Context(), name); !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Fatalf("%s: %v; want not found", name, err)
		}
	}
}
