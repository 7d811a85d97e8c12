package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// put answers mesh.artifacts.put. A whole file {data_b64, media_type?,
// name?, retain_days?} of at most ChunkBytes is stored at once and answered
// as stored; a part of a begun upload {object_id, index, data_b64} is kept
// for put.commit and answered {object_id, index, size}.
func (w *Worker) put(ctx context.Context, r *bus.Request) (any, error) {
	p, err := parsePut(r.Env.Payload, w.limits.ChunkBytes)
	if err != nil {
		return nil, err
	}
	if p.part() {
		return w.putPart(ctx, r.Env.From, p)
	}
	if err := w.mayStore(ctx, r.Env.From); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(p.Data)
	o, err := w.open(ctx, r.Env.From, int64(len(p.Data)), hex.EncodeToString(sum[:]), p.MediaType, p.Name, p.RetainDays)
	if err != nil {
		return nil, err
	}
	if _, err := w.obj.PutBytes(ctx, partName(o.ID, 0), p.Data); err != nil {
		err = w.storeFailed(o.ID, err)
		if errs.CodeOf(err) == errs.QuotaExceeded {
			// Refused whole: nothing to wait for, the quota goes back now.
			if _, _, derr := w.drop(context.WithoutCancel(ctx), o.ID, "the store was full", statePending); derr != nil {
				w.svc.Log.Warn("artifacts: drop refused put", "id", o.ID, "err", derr)
			}
		}
		// Otherwise pending and reserved: the sweep gives the quota back
		// at the upload's deadline.
		return nil, err
	}
	return w.seal(ctx, o.ID, []string{o.DigestHex})
}

// jsStoreFailed is the JetStream error of a message a stream refused to
// store because one of its limits is reached: for the object store, its
// MaxBytes (Limits.StoreBytes).
const jsStoreFailed jetstream.ErrorCode = 10077

// storeFailed is the answer to a put the object store did not keep: a
// full store is QUOTA_EXCEEDED; anything else is the store's error.
func (w *Worker) storeFailed(name string, err error) error {
	if api := (*jetstream.APIError)(nil); errors.As(err, &api) && api.ErrorCode == jsStoreFailed {
		return errs.Newf(errs.QuotaExceeded, "the mesh's artifact store is full (%d bytes in all): try again once artifacts expire, or ask the mesh's operator to raise it",
			w.limits.StoreBytes)
	}
	return fmt.Errorf("artifacts: store %s: %w", name, err)
}

// begin answers mesh.artifacts.put.begin {size, digest, media_type?, name?,
// retain_days?}: it reserves the quota and answers {object_id, ref,
// chunk_bytes, chunks, upload_expires_at}. The parts follow as put
// {object_id, index, data_b64}, index 0 to chunks-1, each chunk_bytes long
// but the last; then put.commit {object_id}.
func (w *Worker) begin(ctx context.Context, r *bus.Request) (any, error) {
	b, err := parseBegin(r.Env.Payload, w.limits.ObjectBytes)
	if err != nil {
		return nil, err
	}
	if err := w.mayStore(ctx, r.Env.From); err != nil {
		return nil, err
	}
	o, err := w.open(ctx, r.Env.From, b.Size, b.DigestHex, b.MediaType, b.Name, b.RetainDays)
	if err != nil {
		return nil, err
	}
	return map[string]any{"object_id": o.ID, "ref": Ref(o.ID), "chunk_bytes": o.ChunkBytes, "chunks": o.parts(),
		"upload_expires_at": protocol.FormatTime(o.UploadBy)}, nil
}

// open records a pending artifact of owner and reserves its size. The
// record comes first, so quota is never held for an artifact the store
// does not know (the sweep gives back what a pending one holds at its
// deadline).
func (w *Worker) open(ctx context.Context, owner string, size int64, digestHex, mediaType, name string, retainDays int) (object, error) {
	now := w.now()
	retain := w.limits.Retain
	if retainDays > 0 {
		retain = min(time.Duration(retainDays)*24*time.Hour, w.limits.MaxRetain)
	}
	o := object{ID: newID(), Owner: owner, Name: name, MediaType: mediaType, Size: size, DigestHex: digestHex,
		ChunkBytes: w.limits.ChunkBytes, State: statePending, Retain: retain, CreatedAt: now, UploadBy: now.Add(w.limits.UploadTTL)}
	b, err := json.Marshal(o)
	if err != nil {
		return object{}, err
	}
	if _, err := w.kv.Create(ctx, objKey(o.ID), b); err != nil {
		return object{}, fmt.Errorf("artifacts: record %s: %w", o.ID, err)
	}
	if err := w.reserve(ctx, owner, o.ID, size); err != nil {
		// Nothing is held and nothing stored: the record goes.
		if derr := w.kv.Delete(context.WithoutCancel(ctx), objKey(o.ID)); derr != nil {
			w.svc.Log.Warn("artifacts: forget refused upload", "id", o.ID, "err", derr)
		}
		return object{}, err
	}
	return o, nil
}

// putPart keeps one part of a begun upload.
func (w *Worker) putPart(ctx context.Context, from string, p *putRequest) (any, error) {
	o, err := w.owned(ctx, from, p.ObjectID)
	if err != nil {
		return nil, err
	}
	if err := w.pending(ctx, o); err != nil {
		return nil, err
	}
	if p.Index >= o.parts() {
		return nil, errs.Newf(errs.InputInvalid, "upload %s has %d parts, index 0 to %d", o.ID, o.parts(), o.parts()-1)
	}
	if want := o.partLen(p.Index); int64(len(p.Data)) != want {
		return nil, errs.Newf(errs.InputInvalid, "part %d of upload %s is %d bytes, not %d: every part is chunk_bytes (%d) long but the last",
			p.Index, o.ID, want, len(p.Data), o.ChunkBytes)
	}
	answer := map[string]any{"object_id": o.ID, "index": p.Index, "size": len(p.Data)}
	// A part is written once. Sent again with the same bytes it is kept
	// as it is; other bytes are refused, so no part is replaced while a
	// commit reads it (its chunks purged under the reader) or after the
	// commit hashed it (fetch would refuse it: PartDigests).
	sum := sha256.Sum256(p.Data)
	info, err := w.partInfo(ctx, partName(o.ID, p.Index))
	switch {
	case err == nil:
		if d, derr := jetstream.DecodeObjectDigest(info.Digest); derr == nil && bytes.Equal(d, sum[:]) {
			return answer, nil
		}
		return nil, errs.Newf(errs.Conflict, "part %d of upload %s was sent already with other bytes, and a part cannot change: begin the upload again to send different bytes",
			p.Index, o.ID)
	case !errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, fmt.Errorf("artifacts: %s: %w", partName(o.ID, p.Index), err)
	}
	if _, err := w.obj.PutBytes(ctx, partName(o.ID, p.Index), p.Data); err != nil {
		return nil, w.storeFailed(partName(o.ID, p.Index), err)
	}
	return answer, nil
}

// commit answers mesh.artifacts.put.commit {object_id}: it checks that
// every part arrived with its length and that the whole hashes to the
// declared digest, then answers the stored artifact. Bytes that do not
// hash to the digest are dropped (the upload must begin again); a missing
// part is refused and the upload waits for it. Committing again answers
// the stored artifact.
func (w *Worker) commit(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		ObjectID string `json:"object_id"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	if !idPattern.MatchString(p.ObjectID) {
		return nil, errs.New(errs.InputInvalid, "object_id must be the id put.begin returned")
	}
	o, err := w.owned(ctx, r.Env.From, p.ObjectID)
	if err != nil {
		return nil, err
	}
	if o.State == stateStored {
		return storedReply(o), nil
	}
	if err := w.pending(ctx, o); err != nil {
		return nil, err
	}
	for i := range o.parts() {
		info, err := w.partInfo(ctx, partName(o.ID, i))
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, errs.Newf(errs.InputInvalid, "part %d of %d of upload %s has not arrived: send it with mesh.artifacts.put {object_id, index, data_b64}, then commit again",
				i, o.parts(), o.ID)
		}
		if err != nil {
			return nil, fmt.Errorf("artifacts: %s: %w", partName(o.ID, i), err)
		}
		if int64(info.Size) != o.partLen(i) {
			return nil, fmt.Errorf("artifacts: %s is %d bytes, not %d", partName(o.ID, i), info.Size, o.partLen(i))
		}
	}
	h := sha256.New()
	parts := make([]string, o.parts())
	for i := range parts {
		ph := sha256.New()
		if err := w.readPart(ctx, o.ID, i, io.MultiWriter(h, ph)); err != nil {
			return nil, err
		}
		parts[i] = hex.EncodeToString(ph.Sum(nil))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != o.DigestHex {
		if _, _, err := w.drop(ctx, o.ID, "the bytes did not match the declared digest", statePending); err != nil {
			w.svc.Log.Warn("artifacts: drop mismatched upload", "id", o.ID, "err", err)
		}
		return nil, errs.Newf(errs.InputInvalid, "the parts of upload %s hash to %s%s, not the declared %s%s: nothing was stored; begin again",
			o.ID, DigestPrefix, got, DigestPrefix, o.DigestHex)
	}
	return w.seal(ctx, o.ID, parts)
}

// partInfo is a part's object info. The object store reads it with a
// direct get, which on a cluster a replica may answer before it has a part
// just put through another server; a part reported missing is looked up
// again at the stream's leader before the commit is refused.
func (w *Worker) partInfo(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	info, err := w.obj.GetInfo(ctx, name)
	if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return info, err
	}
	return w.leaderPartInfo(ctx, name)
}

// leaderPartInfo reads a part's object info from the object store
// stream's leader: the last message on the object's meta subject (NATS
// ADR-20), which a deleted object leaves marked deleted.
func (w *Worker) leaderPartInfo(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	req, err := json.Marshal(struct {
		LastBy string `json:"last_by_subj"`
	}{"$O." + ObjectStore + ".M." + base64.URLEncoding.EncodeToString([]byte(name))})
	if err != nil {
		return nil, err
	}
	msg, err := w.svc.NC.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.OBJ_"+ObjectStore, req)
	if err != nil {
		return nil, fmt.Errorf("artifacts: %s from the leader: %w", name, err)
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("artifacts: %s from the leader: %w", name, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound, resp.Error == nil && resp.Message == nil:
		return nil, jetstream.ErrObjectNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("artifacts: %s from the leader: %w", name, resp.Error)
	}
	var li jetstream.ObjectInfo
	if err := json.Unmarshal(resp.Message.Data, &li); err != nil {
		return nil, fmt.Errorf("artifacts: %s from the leader: %w", name, err)
	}
	if li.Deleted {
		return nil, jetstream.ErrObjectNotFound
	}
	return &li, nil
}

// missingPart is the answer when the object store reads no part i of
// artifact id, whose record says it is there: the part was removed since,
// or (on a cluster) the replica that answered has not got it yet, which
// the leader tells apart.
func (w *Worker) missingPart(ctx context.Context, id string, i int) error {
	if _, err := w.leaderPartInfo(ctx, partName(id, i)); err == nil {
		return errs.Newf(errs.Unavailable, "artifact %s is still being copied between the mesh's servers; retry in a moment", Ref(id))
	}
	return errs.Newf(errs.ArtifactGone, "artifact %s was removed", Ref(id))
}

// partReadTimeout bounds the reading of one part (512 KiB, read in
// milliseconds). The object store's reader waits for the chunks of the
// version of the part it looked up; were the part replaced meanwhile,
// they are purged and never come, and the call would wait out its whole
// deadline.
const partReadTimeout = 10 * time.Second

// readPart copies part i of artifact id to dst (the object store checks
// the part's own digest as it reads).
func (w *Worker) readPart(ctx context.Context, id string, i int, dst io.Writer) error {
	rctx, cancel := context.WithTimeout(ctx, partReadTimeout)
	defer cancel()
	res, err := w.obj.Get(rctx, partName(id, i))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return w.missingPart(ctx, id, i)
	}
	if err != nil {
		return fmt.Errorf("artifacts: read %s: %w", partName(id, i), err)
	}
	defer func() { _ = res.Close() }()
	if _, err := io.Copy(dst, res); err != nil {
		return fmt.Errorf("artifacts: read %s: %w", partName(id, i), err)
	}
	return nil
}

// seal moves a pending artifact to stored, its life counted from now, with
// the digests of its parts as they were hashed, and answers it; an
// artifact another copy stored already is answered as it is.
func (w *Worker) seal(ctx context.Context, id string, partDigests []string) (any, error) {
	now := w.now()
	o, _, err := w.transition(ctx, id, []string{statePending}, func(o *object) {
		o.State, o.ExpiresAt, o.PartDigests = stateStored, now.Add(o.Retain), partDigests
	})
	if err != nil {
		return nil, err
	}
	if o.State != stateStored {
		return nil, gone(o)
	}
	return storedReply(o), nil
}

// owned loads artifact id, which must be from's.
func (w *Worker) owned(ctx context.Context, from, id string) (object, error) {
	o, found, err := w.load(ctx, id)
	if err != nil {
		return object{}, err
	}
	if !found {
		return object{}, errs.Newf(errs.NotFound, "no upload %s: begin one with mesh.artifacts.put.begin", id)
	}
	if o.Owner != from {
		return object{}, errs.Newf(errs.Forbidden, "upload %s is another agent's: only the agent that began it may send its parts or commit it", id)
	}
	return o, nil
}

// pending refuses an upload that is no longer taking parts.
func (w *Worker) pending(ctx context.Context, o object) error {
	switch {
	case o.State == stateStored:
		return errs.Newf(errs.Conflict, "upload %s is committed already: its ref is %s", o.ID, Ref(o.ID))
	case o.State == stateGone:
		return gone(o)
	case w.now().After(o.UploadBy):
		if _, _, err := w.drop(ctx, o.ID, "abandoned", statePending); err != nil {
			w.svc.Log.Warn("artifacts: drop abandoned upload", "id", o.ID, "err", err)
		}
		return errs.Newf(errs.ArtifactGone, "upload %s was not committed by %s and is dropped: begin again",
			o.ID, protocol.FormatTime(o.UploadBy))
	}
	return nil
}

// gone is the ARTIFACT_GONE answer for o.
func gone(o object) error {
	why := o.GoneWhy
	if why == "" {
		why = "expired"
	}
	return errs.Newf(errs.ArtifactGone, "artifact %s is gone (%s)", Ref(o.ID), why)
}

// storedReply is a stored artifact as put and put.commit answer it: a ref
// part {ref, media_type, size, digest, name?} and its expiry.
func storedReply(o object) map[string]any {
	out := map[string]any{"ref": Ref(o.ID), "media_type": o.MediaType, "size": o.Size,
		"digest": DigestPrefix + o.DigestHex, "expires_at": protocol.FormatTime(o.ExpiresAt)}
	if o.Name != "" {
		out["name"] = o.Name
	}
	return out
}

// resolve reads a ref (an artifact's or a link's) to its artifact. A link
// that expired is gone; lnk is the link when ref is one.
func (w *Worker) resolve(ctx context.Context, ref string) (o object, lnk *link, err error) {
	id, isLink, err := parseRef(ref)
	if err != nil {
		return object{}, nil, err
	}
	if isLink {
		raw, found, err := bus.LeaderGet(ctx, w.svc.NC, Bucket, linkKey(id))
		if err != nil {
			return object{}, nil, err
		}
		var l link
		if found {
			if err := json.Unmarshal(raw, &l); err != nil {
				return object{}, nil, fmt.Errorf("artifacts: decode %s: %w", linkKey(id), err)
			}
		}
		if !found || w.now().After(l.ExpiresAt) {
			return object{}, nil, errs.Newf(errs.ArtifactGone, "link %s has expired: ask whoever gave it for a new one", ref)
		}
		lnk, id = &l, l.Object
	}
	o, found, err := w.load(ctx, id)
	if err != nil {
		return object{}, nil, err
	}
	if !found {
		return object{}, nil, errs.Newf(errs.NotFound, "no artifact %s on this mesh", ref)
	}
	return o, lnk, nil
}

// readable refuses an artifact that cannot be read: not committed yet,
// gone, or past its expiry.
func (w *Worker) readable(o object) error {
	switch {
	case o.State == statePending:
		return errs.Newf(errs.NotFound, "artifact %s is still being uploaded: its owner has not committed it", Ref(o.ID))
	case o.State == stateGone:
		return gone(o)
	case w.now().After(o.ExpiresAt):
		return errs.Newf(errs.ArtifactGone, "artifact %s expired at %s", Ref(o.ID), protocol.FormatTime(o.ExpiresAt))
	}
	return nil
}

// fetch answers mesh.artifacts.fetch {ref, offset?} with the bytes from
// offset (default 0) to the end of the part it falls in: {ref, media_type,
// size, digest, name?, offset, data_b64, done, next_offset?}. A file of
// at most chunk_bytes comes whole in one answer; a larger one is read by
// asking again from next_offset until done.
func (w *Worker) fetch(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Ref    string `json:"ref"`
		Offset int64  `json:"offset"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	o, _, err := w.resolve(ctx, p.Ref)
	if err != nil {
		return nil, err
	}
	if err := w.readable(o); err != nil {
		return nil, err
	}
	if p.Offset < 0 || (p.Offset >= o.Size && !(p.Offset == 0 && o.Size == 0)) {
		return nil, errs.Newf(errs.InputInvalid, "offset %d is outside the artifact's %d bytes", p.Offset, o.Size)
	}
	i := int(p.Offset / o.ChunkBytes)
	var buf bytes.Buffer
	if err := w.readPart(ctx, o.ID, i, &buf); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	if int64(len(data)) != o.partLen(i) {
		return nil, fmt.Errorf("artifacts: %s is %d bytes, not %d", partName(o.ID, i), len(data), o.partLen(i))
	}
	sum := sha256.Sum256(data)
	switch got := hex.EncodeToString(sum[:]); {
	case len(o.PartDigests) == o.parts() && got != o.PartDigests[i]:
		// Rewritten by a part put that raced the commit: these are not
		// the bytes the digest was computed over.
		w.svc.Log.Warn("artifacts: a part changed after its commit", "id", o.ID, "part", i)
		return nil, errs.Newf(errs.ArtifactGone, "artifact %s was changed after its commit and can no longer be read: its owner must put it again", Ref(o.ID))
	case o.parts() == 1 && got != o.DigestHex:
		// A whole file in one answer: checked here as the reader will.
		return nil, fmt.Errorf("artifacts: %s does not match its digest", o.ID)
	}
	data = data[p.Offset-int64(i)*o.ChunkBytes:]
	next := p.Offset + int64(len(data))
	out := map[string]any{"ref": p.Ref, "media_type": o.MediaType, "size": o.Size, "digest": DigestPrefix + o.DigestHex,
		"offset": p.Offset, "data_b64": base64.StdEncoding.EncodeToString(data), "done": next >= o.Size}
	if next < o.Size {
		out["next_offset"] = next
	}
	if o.Name != "" {
		out["name"] = o.Name
	}
	return out, nil
}

// stat answers mesh.artifacts.stat {ref} without the bytes: {ref,
// media_type, size, digest, name?, state, created_at, expires_at?, gone,
// link_expires_at?}. A removed or expired artifact is answered with gone
// true for Limits.Tombstone, then not at all.
func (w *Worker) stat(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Ref string `json:"ref"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	o, lnk, err := w.resolve(ctx, p.Ref)
	if err != nil {
		return nil, err
	}
	expired := o.State == stateStored && w.now().After(o.ExpiresAt)
	state := o.State
	if expired {
		state = stateGone
	}
	out := map[string]any{"ref": p.Ref, "media_type": o.MediaType, "size": o.Size, "digest": DigestPrefix + o.DigestHex,
		"state": state, "created_at": protocol.FormatTime(o.CreatedAt), "gone": state == stateGone}
	if o.State == stateStored {
		out["expires_at"] = protocol.FormatTime(o.ExpiresAt)
	}
	if o.Name != "" {
		out["name"] = o.Name
	}
	if lnk != nil {
		out["link_expires_at"] = protocol.FormatTime(lnk.ExpiresAt)
	}
	return out, nil
}

// remove answers mesh.artifacts.remove {ref} with {ref, removed}: only the
// artifact's owner may, and only with its own ref (holding a ref lets one
// read; a forwarded ref must not be a delete button). A begun upload may
// be removed too, which gives its reservation back at once. Removing again
// answers removed false.
func (w *Worker) remove(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Ref string `json:"ref"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	id, isLink, err := parseRef(p.Ref)
	if err != nil {
		return nil, err
	}
	if isLink {
		return nil, errs.New(errs.Forbidden, "a link reads an artifact and nothing more: its owner removes it with the artifact's own ref")
	}
	o, err := w.owned(ctx, r.Env.From, id)
	if err != nil {
		if errs.As(err).Code == errs.Forbidden {
			return nil, errs.Newf(errs.Forbidden, "artifact %s is another agent's: only its owner may remove it", p.Ref)
		}
		return nil, err
	}
	_, removed, err := w.drop(ctx, o.ID, "removed by its owner", statePending, stateStored)
	if err != nil {
		return nil, err
	}
	return map[string]any{"ref": p.Ref, "removed": removed}, nil
}

// usage answers mesh.artifacts.usage with the caller's use of the quota:
// {bytes, objects, max_bytes, max_objects} (begun uploads count).
func (w *Worker) usage(ctx context.Context, r *bus.Request) (any, error) {
	u, _, err := bus.GetJSON[usage](ctx, w.kv, usageKey(r.Env.From))
	if err != nil {
		return nil, fmt.Errorf("artifacts: usage of %s: %w", r.Env.From, err)
	}
	return map[string]any{"bytes": u.Bytes, "objects": u.Objects, "max_bytes": w.limits.OwnerBytes, "max_objects": w.limits.OwnerObjects}, nil
}

// link answers mesh.artifacts.link {ref, ttl_s?, download_name?} with a
// link: another reference to the artifact, which anyone given it may fetch
// and stat with until it expires (ttl_s, default Limits.LinkTTL, at most
// MaxLinkTTL, never past the artifact's own expiry): {ref, link, url,
// expires_at, media_type, size, digest, name?}. url is the link again: the
// mesh serves no HTTP downloads, and a link is read with
// mesh.artifacts.fetch. Whoever holds the artifact's ref may make one.
func (w *Worker) link(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Ref          string  `json:"ref"`
		TTLSeconds   int64   `json:"ttl_s"`
		DownloadName *string `json:"download_name"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	if _, isLink, err := parseRef(p.Ref); err != nil {
		return nil, err
	} else if isLink {
		return nil, errs.New(errs.InputInvalid, "link the artifact's own ref, not another link")
	}
	name, err := text("download_name", p.DownloadName, maxName)
	if err != nil {
		return nil, err
	}
	if p.TTLSeconds < 0 {
		return nil, errs.New(errs.InputInvalid, "ttl_s must not be negative (omit it for the default)")
	}
	if err := w.mayStore(ctx, r.Env.From); err != nil {
		return nil, err
	}
	o, _, err := w.resolve(ctx, p.Ref)
	if err != nil {
		return nil, err
	}
	if err := w.readable(o); err != nil {
		return nil, err
	}
	ttl := w.limits.LinkTTL
	if p.TTLSeconds > 0 {
		ttl = min(time.Duration(p.TTLSeconds)*time.Second, w.limits.MaxLinkTTL)
	}
	l := link{Object: o.ID, ExpiresAt: w.now().Add(ttl), DownloadName: name, By: r.Env.From}
	if o.ExpiresAt.Before(l.ExpiresAt) {
		l.ExpiresAt = o.ExpiresAt
	}
	b, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	id := newID()
	if _, err := w.kv.Create(ctx, linkKey(id), b); err != nil {
		return nil, fmt.Errorf("artifacts: record link: %w", err)
	}
	if name == "" {
		name = o.Name
	}
	out := map[string]any{"ref": p.Ref, "link": LinkRef(id), "url": LinkRef(id), "expires_at": protocol.FormatTime(l.ExpiresAt),
		"media_type": o.MediaType, "size": o.Size, "digest": DigestPrefix + o.DigestHex}
	if name != "" {
		out["name"] = name
	}
	return out, nil
}
