package rooms

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
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

// driveHarness runs copies of the rooms worker on one broker, with a client
// connection for the test's calls and a view of the bucket, where the test
// provisions rooms by writing their records (provision is another work's).
type driveHarness struct {
	t       *testing.T
	nc      *nats.Conn
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	workers []*Worker
}

func startDrive(t *testing.T, copies int, l Limits) *driveHarness {
	t.Helper()
	m := bustest.Start(t)
	h := &driveHarness{t: t, nc: bustest.Client(t, m)}
	for range copies {
		w, err := Start(t.Context(), bustest.Env(t, m, Name, nil), Config{Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	var err error
	if h.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	if h.kv, err = h.js.KeyValue(t.Context(), Bucket); err != nil {
		t.Fatal(err)
	}
	return h
}

// room provisions a durable room of creator, counted against operator, by
// writing its record; members are an acl room's admitted agents. It
// returns the signed descriptor.
func (h *driveHarness) room(creator keys.Signer, operator, privacy string, members ...string) (string, json.RawMessage) {
	h.t.Helper()
	var id [18]byte
	_, _ = rand.Read(id[:])
	roomID := base64.RawURLEncoding.EncodeToString(id[:])
	now := time.Now().UTC()
	desc := map[string]any{"rooms": DescriptorVersion, "room_id": roomID, "name": "drive test", "channels": []any{"main"},
		"record": DurableRecord(roomID), "privacy": privacy, "creator": creator.Public(), "created_at": protocol.FormatTime(now)}
	sig, err := protocol.SignRoomDescriptor(desc, creator)
	if err != nil {
		h.t.Fatal(err)
	}
	desc["sig"] = sig
	raw, err := json.Marshal(desc)
	if err != nil {
		h.t.Fatal(err)
	}
	r := Room{ID: roomID, Name: "drive test", Privacy: privacy, Channels: []string{"main"}, Creator: creator.Public(),
		Handle: "creator", Operator: operator, Descriptor: raw, CreatedAt: now, LastActive: now}
	if privacy == GradeACL {
		r.Members = append([]string{creator.Public()}, members...)
	}
	b, _ := json.Marshal(r)
	if _, err := h.kv.Create(h.t.Context(), RoomKey(roomID), b); err != nil {
		h.t.Fatal(err)
	}
	return roomID, raw
}

// call signs payload as signer and calls mesh.rooms.<verb>, returning the
// answer's payload, or its error.
func (h *driveHarness) call(signer keys.Signer, verb string, payload map[string]any) (map[string]any, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 20*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, signer, protocol.RoomVerbSubject(verb), protocol.TypeRequest, "", payload)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(rep.Payload, &out); err != nil {
		h.t.Fatalf("%s answer %s: %v", verb, rep.Payload, err)
	}
	return out, nil
}

// must is call that fails the test on an error.
func (h *driveHarness) must(signer keys.Signer, verb string, payload map[string]any) map[string]any {
	h.t.Helper()
	out, err := h.call(signer, verb, payload)
	if err != nil {
		h.t.Fatalf("%s: %v", verb, err)
	}
	return out
}

// refuse is call that wants the error code want.
func (h *driveHarness) refuse(signer keys.Signer, verb string, payload map[string]any, want errs.Code) *errs.Error {
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

func (h *driveHarness) quota(operator string) Quota {
	h.t.Helper()
	q, _, err := bus.GetJSON[Quota](h.t.Context(), h.kv, QuotaKey(operator))
	if err != nil {
		h.t.Fatal(err)
	}
	return q
}

func (h *driveHarness) roomRecord(roomID string) Room {
	h.t.Helper()
	r, found, err := bus.GetJSON[Room](h.t.Context(), h.kv, RoomKey(roomID))
	if err != nil || !found {
		h.t.Fatalf("room %s: found %t, %v", roomID, found, err)
	}
	return r
}

func (h *driveHarness) listing(roomID string) []driveFile {
	h.t.Helper()
	files, err := h.workers[0].driveListing(h.t.Context(), roomID)
	if err != nil {
		h.t.Fatal(err)
	}
	return files
}

func attachPayload(desc json.RawMessage, name string, data []byte) map[string]any {
	return map[string]any{"descriptor": desc, "name": name, "data_b64": base64.StdEncoding.EncodeToString(data)}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDriveAttachFetch(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator, member := bustest.Agent(t), bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	data := []byte("the quarterly numbers, as promised\n")

	p := attachPayload(desc, "numbers.txt", data)
	p["media_type"], p["origin"], p["version"] = "text/plain", "git:abc123", "2"
	got := h.must(member, "attach", p)
	wantRef := "mesh:rooms:" + roomID + "/drive/" + strings.TrimPrefix(digestOf(data), DigestPrefix)
	if got["ref"] != wantRef || got["digest"] != digestOf(data) || got["size"] != float64(len(data)) ||
		got["media_type"] != "text/plain" || got["external"] != nil {
		t.Fatalf("attach answered %v; want ref %s", got, wantRef)
	}

	f := h.must(creator, "fetch", map[string]any{"descriptor": desc, "ref": wantRef})
	back, err := base64.StdEncoding.DecodeString(f["data_b64"].(string))
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("fetched %q, %v; want %q", back, err, data)
	}
	if f["name"] != "numbers.txt" || f["version"] != "2" || f["digest"] != digestOf(data) || f["media_type"] != "text/plain" ||
		f["size"] != float64(len(data)) || f["origin"] != "git:abc123" || f["ref"] != wantRef {
		t.Fatalf("fetch answered %v", f)
	}

	// The descriptor in its token form is the same room.
	token := base64.RawURLEncoding.EncodeToString(desc)
	h.must(member, "fetch", map[string]any{"descriptor": token, "ref": wantRef})

	// The same bytes again, by another member under another name: one file,
	// the first attach's, counted once.
	again := h.must(creator, "attach", attachPayload(desc, "copy.txt", data))
	if again["ref"] != wantRef {
		t.Fatalf("second attach of the same bytes answered %v", again)
	}
	files := h.listing(roomID)
	if len(files) != 1 || files[0].Name != "numbers.txt" || files[0].AttachedBy != member.Public() || files[0].Version != "2" {
		t.Fatalf("drive lists %+v", files)
	}
	if q, r := h.quota("ops@example.com"), h.roomRecord(roomID); q.DriveBytes != int64(len(data))+DriveEntryOverhead ||
		r.DriveBytes != int64(len(data))+DriveEntryOverhead || r.DriveFiles != 1 {
		t.Fatalf("counted quota %d, room %d in %d entries; want %d in 1", q.DriveBytes, r.DriveBytes, r.DriveFiles, int64(len(data))+DriveEntryOverhead)
	}

	// An empty file is a file too.
	empty := h.must(member, "attach", attachPayload(desc, "empty", nil))
	if empty["size"] != float64(0) || empty["digest"] != digestOf(nil) {
		t.Fatalf("empty file: %v", empty)
	}
	e := h.must(member, "fetch", map[string]any{"descriptor": desc, "ref": empty["ref"]})
	if e["data_b64"] != "" {
		t.Fatalf("empty file fetched as %v", e["data_b64"])
	}

	// Refs that are not this room's files.
	other, otherDesc := h.room(creator, "ops@example.com", GradeCapability)
	h.refuse(member, "fetch", map[string]any{"descriptor": otherDesc, "ref": wantRef}, errs.NotFound)
	h.refuse(member, "fetch", map[string]any{"descriptor": desc, "ref": "mesh:rooms:" + other + "/drive/" + strings.Repeat("ab", 32)}, errs.NotFound)
	h.refuse(member, "fetch", map[string]any{"descriptor": desc, "ref": "mesh:rooms:" + roomID + "/drive/" + strings.Repeat("ab", 32)}, errs.NotFound)
	h.refuse(member, "fetch", map[string]any{"descriptor": desc, "ref": "sha256:" + strings.Repeat("ab", 32)}, errs.InputInvalid)

	// A room nobody provisioned.
	_ = h.kv.Delete(t.Context(), RoomKey(other))
	h.refuse(member, "attach", attachPayload(otherDesc, "x", data), errs.NotFound)

	// Bytes gone from the stream while the entry stays: ARTIFACT_GONE.
	if err := h.workers[0].js.DeleteStream(t.Context(), DriveStream); err != nil {
		t.Fatal(err)
	}
	if err := h.workers[0].bindStreams(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.refuse(member, "fetch", map[string]any{"descriptor": desc, "ref": wantRef}, errs.ArtifactGone)
}

func TestDriveFileLimit(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator := bustest.Agent(t)
	_, desc := h.room(creator, "ops@example.com", GradeCapability)

	full := randomBytes(t, DefaultFileBytes)
	if got := h.must(creator, "attach", attachPayload(desc, "full.bin", full)); got["size"] != float64(DefaultFileBytes) {
		t.Fatalf("512 KB file: %v", got)
	}
	e := h.refuse(creator, "attach", attachPayload(desc, "over.bin", randomBytes(t, DefaultFileBytes+1)), errs.PayloadTooLarge)
	if !strings.Contains(e.Message, "524288") || !strings.Contains(e.Message, "mesh.artifacts") {
		t.Fatalf("refusal %q does not name the limit and mesh.artifacts", e.Message)
	}
	if q := h.quota("ops@example.com"); q.DriveBytes != DefaultFileBytes+DriveEntryOverhead {
		t.Fatalf("quota counts %d after the refused file; want %d", q.DriveBytes, DefaultFileBytes+DriveEntryOverhead)
	}
}

func TestDriveOperatorQuota(t *testing.T) {
	const limit = 10_000 + 2*DriveEntryOverhead
	h := startDrive(t, 1, Limits{DriveBytesPerOperator: limit})
	creator := bustest.Agent(t)
	room1, desc1 := h.room(creator, "ops@example.com", GradeCapability)
	room2, desc2 := h.room(creator, "ops@example.com", GradeCapability)
	_, elsewhere := h.room(bustest.Agent(t), "other@example.com", GradeCapability)

	h.must(creator, "attach", attachPayload(desc1, "a", randomBytes(t, 6000)))
	h.must(creator, "attach", attachPayload(desc2, "b", randomBytes(t, 4000))) // exactly the limit
	e := h.refuse(creator, "attach", attachPayload(desc2, "c", randomBytes(t, 1)), errs.QuotaExceeded)
	if !strings.Contains(e.Message, fmt.Sprint(limit)) {
		t.Fatalf("refusal %q does not name the limit", e.Message)
	}
	// Another operator's rooms are not counted with these.
	h.must(creator, "attach", attachPayload(elsewhere, "d", randomBytes(t, 4000)))

	if q := h.quota("ops@example.com"); q.DriveBytes != limit {
		t.Fatalf("quota %d; want %d", q.DriveBytes, limit)
	}
	if r1, r2 := h.roomRecord(room1), h.roomRecord(room2); r1.DriveBytes != 6000+DriveEntryOverhead || r2.DriveBytes != 4000+DriveEntryOverhead ||
		r2.DriveFiles != 1 {
		t.Fatalf("rooms count %d and %d (%d entries); want 6000 and 4000 and an entry's %d each", r1.DriveBytes, r2.DriveBytes, r2.DriveFiles, DriveEntryOverhead)
	}
	if n := len(h.listing(room2)); n != 1 {
		t.Fatalf("room 2 lists %d files after the refusal; want 1", n)
	}
}

// TestDriveQuotaRace: members attach distinct files at once through three
// copies against an operator limit that fits exactly ten; at most ten are
// stored, and topping up afterwards stores exactly ten, counted exactly,
// whichever copies answered. Then ten members attach
// the same bytes at once: one file, counted once.
func TestDriveQuotaRace(t *testing.T) {
	const size, fits, tries = 1000, 10, 25
	h := startDrive(t, 3, Limits{DriveBytesPerOperator: fits * (size + DriveEntryOverhead)})
	creator := bustest.Agent(t)
	roomA, descA := h.room(creator, "ops@example.com", GradeCapability)
	roomB, descB := h.room(creator, "ops@example.com", GradeCapability)

	var wg sync.WaitGroup
	results := make([]error, tries)
	for i := range tries {
		desc := descA
		if i%2 == 1 {
			desc = descB
		}
		wg.Go(func() {
			_, results[i] = h.call(bustest.Agent(t), "attach", attachPayload(desc, fmt.Sprintf("f%d", i), randomBytes(t, size)))
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range results {
		switch {
		case err == nil:
			ok++
		case errs.As(err).Code != errs.QuotaExceeded:
			t.Fatalf("attach: %v", err)
		}
	}
	// Racing at the limit, an attach may be refused while a loser's entry
	// reservation is still counted (it is given back a moment later): so
	// at most ten are stored at once, never more, and topping up one at a
	// time afterwards reaches exactly ten — nothing is leaked.
	if ok < 1 || ok > fits {
		t.Fatalf("%d attaches stored; want 1 to %d", ok, fits)
	}
	for i := 0; ; i++ {
		desc := descA
		if i%2 == 1 {
			desc = descB
		}
		_, err := h.call(bustest.Agent(t), "attach", attachPayload(desc, fmt.Sprintf("top%d", i), randomBytes(t, size)))
		if err != nil {
			if errs.As(err).Code != errs.QuotaExceeded {
				t.Fatalf("top-up attach: %v", err)
			}
			break
		}
		if ok++; ok > fits {
			t.Fatalf("%d attaches stored; the limit fits %d", ok, fits)
		}
	}
	if ok != fits {
		t.Fatalf("%d attaches stored after topping up; want %d", ok, fits)
	}
	q := h.quota("ops@example.com")
	ra, rb := h.roomRecord(roomA), h.roomRecord(roomB)
	files := len(h.listing(roomA)) + len(h.listing(roomB))
	const each = size + DriveEntryOverhead
	if q.DriveBytes != fits*each || ra.DriveBytes+rb.DriveBytes != fits*each || files != fits || ra.DriveFiles+rb.DriveFiles != fits {
		t.Fatalf("quota %d, rooms %d+%d, files %d (counted %d+%d); want %d bytes in %d files", q.DriveBytes, ra.DriveBytes, rb.DriveBytes, files,
			ra.DriveFiles, rb.DriveFiles, fits*each, fits)
	}

	// The same bytes, ten members at once, in a room of another operator.
	roomC, descC := h.room(creator, "same@example.com", GradeCapability)
	same := randomBytes(t, size)
	refs := make([]string, 10)
	for i := range refs {
		wg.Go(func() {
			out, err := h.call(bustest.Agent(t), "attach", attachPayload(descC, fmt.Sprintf("same%d", i), same))
			if err != nil {
				t.Errorf("attach of the same bytes: %v", err)
				return
			}
			refs[i] = out["ref"].(string)
		})
	}
	wg.Wait()
	for _, r := range refs {
		if r != refs[0] {
			t.Fatalf("the same bytes got refs %v", refs)
		}
	}
	if q, r, n := h.quota("same@example.com"), h.roomRecord(roomC), len(h.listing(roomC)); q.DriveBytes != each || r.DriveBytes != each || n != 1 || r.DriveFiles != 1 {
		t.Fatalf("the same bytes ten times: quota %d, room %d, files %d (counted %d); want %d, %d, 1", q.DriveBytes, r.DriveBytes, n, r.DriveFiles, each, each)
	}
}

// TestDriveCrashHeal: an attach that stored the bytes (and so counted
// them) but died before indexing them is healed by the next attach of the
// same bytes, which indexes them without counting again, even at the limit.
func TestDriveCrashHeal(t *testing.T) {
	const size = 5000
	const limit = size + DriveEntryOverhead
	h := startDrive(t, 1, Limits{DriveBytesPerOperator: limit})
	creator := bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	data := randomBytes(t, size)
	w := h.workers[0]

	// What the crashed attach did: counted the entry and the bytes, then
	// stored the bytes.
	if err := w.countRoomDrive(t.Context(), roomID, 1, limit); err != nil {
		t.Fatal(err)
	}
	if err := w.countQuota(t.Context(), "ops@example.com", limit); err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.Publish(t.Context(), DriveSubject(roomID, strings.TrimPrefix(digestOf(data), DigestPrefix)), data); err != nil {
		t.Fatal(err)
	}

	got := h.must(creator, "attach", attachPayload(desc, "retry.bin", data))
	if got["digest"] != digestOf(data) {
		t.Fatalf("retry answered %v", got)
	}
	if q, r := h.quota("ops@example.com"), h.roomRecord(roomID); q.DriveBytes != limit || r.DriveBytes != limit || r.DriveFiles != 1 {
		t.Fatalf("after the retry quota %d, room %d in %d entries; want %d each in 1", q.DriveBytes, r.DriveBytes, r.DriveFiles, limit)
	}
	if files := h.listing(roomID); len(files) != 1 || files[0].Name != "retry.bin" {
		t.Fatalf("drive lists %+v", files)
	}
	h.must(creator, "fetch", map[string]any{"descriptor": desc, "ref": got["ref"]})
}

func TestDriveLink(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator, member := bustest.Agent(t), bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	data := randomBytes(t, 3000)
	digest := digestOf(data)

	link := map[string]any{"descriptor": desc, "name": "dataset.parquet", "location": "https://example.com/d.parquet",
		"digest": strings.ToUpper(strings.TrimPrefix(digest, DigestPrefix)), "size": 3000}
	h.refuse(member, "attach", link, errs.InputInvalid) // no sha256: prefix
	link["digest"] = digest
	got := h.must(member, "attach", link)
	if got["external"] != "https://example.com/d.parquet" || got["digest"] != digest || got["size"] != float64(3000) {
		t.Fatalf("link answered %v", got)
	}
	if q := h.quota("ops@example.com"); q.DriveBytes != DriveEntryOverhead {
		t.Fatalf("a link counted %d bytes, want its entry's %d", q.DriveBytes, DriveEntryOverhead)
	}
	e := h.refuse(member, "fetch", map[string]any{"descriptor": desc, "ref": got["ref"]}, errs.NotFound)
	if !strings.Contains(e.Message, "https://example.com/d.parquet") {
		t.Fatalf("fetch of a link: %q does not say where the bytes are", e.Message)
	}
	files := h.listing(roomID)
	if len(files) != 1 || files[0].External == nil || files[0].Size != 3000 {
		t.Fatalf("drive lists %+v", files)
	}

	// A link needs a digest, and is not also a file.
	delete(link, "digest")
	h.refuse(member, "attach", link, errs.InputInvalid)
	link["digest"], link["data_b64"] = digest, "AAAA"
	h.refuse(member, "attach", link, errs.InputInvalid)

	// The bytes themselves replace the link; linking them again answers the
	// file.
	stored := h.must(creator, "attach", attachPayload(desc, "dataset.parquet", data))
	if stored["ref"] != got["ref"] || stored["external"] != nil {
		t.Fatalf("attach over a link answered %v", stored)
	}
	h.must(member, "fetch", map[string]any{"descriptor": desc, "ref": got["ref"]})
	delete(link, "data_b64")
	if again := h.must(member, "attach", link); again["external"] != nil {
		t.Fatalf("link over a file answered %v", again)
	}
	if q, r := h.quota("ops@example.com"), h.roomRecord(roomID); q.DriveBytes != 3000+DriveEntryOverhead || r.DriveFiles != 1 {
		t.Fatalf("quota %d in %d entries; want %d in 1", q.DriveBytes, r.DriveFiles, 3000+DriveEntryOverhead)
	}
}

func TestDriveNotes(t *testing.T) {
	h := startDrive(t, 3, Limits{})
	creator, a, b := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	one, two := []byte("first file"), []byte("second file")
	h.must(creator, "attach", attachPayload(desc, "one", one))
	h.must(creator, "attach", attachPayload(desc, "two", two))

	// The author is the signer: a by (and an at) in the payload are not read.
	got := h.must(a, "note", map[string]any{"descriptor": desc, "digest": digestOf(one), "verdict": "flag",
		"reason": "asks for credentials", "by": b.Public(), "at": "2001-01-01T00:00:00.000Z",
		"source": map[string]any{"id": "scanner", "policy": "phishing", "version": "3"}})
	note := got["note"].(map[string]any)
	if got["noted"] != true || got["digest"] != digestOf(one) || got["notes_on_file"] != float64(1) ||
		note["by"] != a.Public() || note["at"] == "2001-01-01T00:00:00.000Z" || note["note"] != NoteKind ||
		note["verdict"] != "flag" || note["reason"] != "asks for credentials" {
		t.Fatalf("note answered %v", got)
	}
	if src := note["source"].(map[string]any); src["id"] != "scanner" || src["policy"] != "phishing" || src["version"] != "3" {
		t.Fatalf("note source %v", src)
	}

	// Noting again replaces the member's own note; another member's is a
	// second note.
	if got := h.must(a, "note", map[string]any{"descriptor": desc, "digest": digestOf(one), "verdict": "pass"}); got["notes_on_file"] != float64(1) {
		t.Fatalf("second note by the same member: %v", got)
	}
	if got := h.must(b, "note", map[string]any{"descriptor": desc, "digest": digestOf(one), "verdict": "hold"}); got["notes_on_file"] != float64(2) {
		t.Fatalf("note by another member: %v", got)
	}
	h.must(b, "note", map[string]any{"descriptor": desc, "digest": digestOf(two), "verdict": "pass"})

	list := func(digest any) []any {
		p := map[string]any{"descriptor": desc}
		if digest != nil {
			p["digest"] = digest
		}
		return h.must(creator, "notes", p)["notes"].([]any)
	}
	onOne := list(digestOf(one))
	if len(onOne) != 2 {
		t.Fatalf("notes on one: %v", onOne)
	}
	verdicts := map[string]string{}
	for _, n := range onOne {
		n := n.(map[string]any)
		verdicts[n["by"].(string)] = n["verdict"].(string)
		if _, ok := n["reason"]; ok && n["by"] == a.Public() {
			t.Fatalf("a replaced note kept the old reason: %v", n)
		}
	}
	if verdicts[a.Public()] != "pass" || verdicts[b.Public()] != "hold" {
		t.Fatalf("verdicts %v", verdicts)
	}
	if all := list(nil); len(all) != 3 {
		t.Fatalf("all notes: %v", all)
	}
	three := []byte("nobody noted this")
	h.must(creator, "attach", attachPayload(desc, "three", three))
	if none := list(digestOf(three)); len(none) != 0 {
		t.Fatalf("notes on an unnoted file: %v", none)
	}

	// Refused: a digest not on the drive, a verdict not in the set, a
	// digest that is not one.
	h.refuse(a, "note", map[string]any{"descriptor": desc, "digest": digestOf([]byte("elsewhere")), "verdict": "pass"}, errs.NotFound)
	h.refuse(a, "note", map[string]any{"descriptor": desc, "digest": digestOf(one), "verdict": "maybe"}, errs.InputInvalid)
	h.refuse(a, "note", map[string]any{"descriptor": desc, "digest": "md5:abc", "verdict": "pass"}, errs.InputInvalid)
	h.refuse(a, "notes", map[string]any{"descriptor": desc, "digest": "nope"}, errs.InputInvalid)

	// Nothing of this reaches the record.
	info, err := h.js.Stream(t.Context(), RecordStream)
	if err != nil {
		t.Fatal(err)
	}
	if st := info.CachedInfo().State; st.Msgs != 0 {
		t.Fatalf("the record holds %d messages after attaches and notes of room %s", st.Msgs, roomID)
	}
}

func TestDriveACL(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator, member, outsider := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	_, desc := h.room(creator, "ops@example.com", GradeACL, member.Public())
	data := []byte("members only")

	got := h.must(member, "attach", attachPayload(desc, "m.txt", data))
	h.must(creator, "fetch", map[string]any{"descriptor": desc, "ref": got["ref"]})
	h.must(member, "note", map[string]any{"descriptor": desc, "digest": got["digest"], "verdict": "pass"})

	// The outsider holds the descriptor but is not admitted.
	h.refuse(outsider, "attach", attachPayload(desc, "x", []byte("x")), errs.Forbidden)
	h.refuse(outsider, "fetch", map[string]any{"descriptor": desc, "ref": got["ref"]}, errs.Forbidden)
	h.refuse(outsider, "note", map[string]any{"descriptor": desc, "digest": got["digest"], "verdict": "flag"}, errs.Forbidden)
	h.refuse(outsider, "notes", map[string]any{"descriptor": desc}, errs.Forbidden)

	// A descriptor whose signature does not verify is refused before
	// anything is read.
	var d map[string]any
	_ = json.Unmarshal(desc, &d)
	d["name"] = "renamed"
	h.refuse(member, "fetch", map[string]any{"descriptor": d, "ref": got["ref"]}, errs.IdentityMismatch)
}

// TestDriveListingFallback: the listing's fallback (a filtered watch, for
// more keys than one batch get answers) lists what the batch get lists.
func TestDriveListingFallback(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator := bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	for i := range 5 {
		h.must(creator, "attach", attachPayload(desc, fmt.Sprint(i), []byte(fmt.Sprint("file ", i))))
	}
	w := h.workers[0]
	collect := func(each func(context.Context, string, func(string, []byte) error) error, filter string) []string {
		var keys []string
		if err := each(t.Context(), filter, func(k string, _ []byte) error { keys = append(keys, k); return nil }); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	batch, watched := collect(w.eachLast, DriveKey(roomID, "*")), collect(w.eachWatched, DriveKey(roomID, "*"))
	if len(batch) != 5 || strings.Join(batch, ",") != strings.Join(watched, ",") {
		t.Fatalf("batch lists %v, watch lists %v", batch, watched)
	}
	// A deleted key is not listed by either; an empty filter lists nothing.
	if err := h.kv.Delete(t.Context(), batch[0]); err != nil {
		t.Fatal(err)
	}
	if b, w := collect(w.eachLast, DriveKey(roomID, "*")), collect(w.eachWatched, DriveKey(roomID, "*")); len(b) != 4 || len(w) != 4 {
		t.Fatalf("after a delete: batch %v, watch %v", b, w)
	}
	if b, w := collect(w.eachLast, DriveKey("nothing", "*")), collect(w.eachWatched, DriveKey("nothing", "*")); len(b)+len(w) != 0 {
		t.Fatalf("an empty room lists %v, %v", b, w)
	}
}
