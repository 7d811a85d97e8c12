package rooms

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
)

// linkPayload is a link-form attach of the n-th made-up digest, with text
// members as long as they may be.
func linkPayload(desc json.RawMessage, n int) map[string]any {
	sum := sha256.Sum256([]byte(fmt.Sprint("link ", n)))
	return map[string]any{"descriptor": desc, "name": strings.Repeat("n", maxFileName), "location": "https://example.com/" + strings.Repeat("a", 2000),
		"origin": strings.Repeat("o", maxOrigin), "digest": DigestPrefix + hex.EncodeToString(sum[:]), "size": 1}
}

// The review's link flood (finding 1): link-form attaches counted nothing
// and had no bound, and status listed every entry in one answer, so 300
// long links made status time out (an answer over the transport's 1 MiB)
// and the dossier too large. Now a room's drive holds at most DriveFiles
// entries, links included; each counts DriveEntryOverhead bytes in the room
// and the operator's quota; status pages the entries (drive_after,
// drive_limit) within a byte budget; and the dossier says what to read
// instead.
func TestDriveLinkFlood(t *testing.T) {
	if DefaultLimits.DriveFiles != 1000 || DriveEntryOverhead != 1024 {
		t.Fatalf("defaults: %d entries, %d bytes an entry", DefaultLimits.DriveFiles, DriveEntryOverhead)
	}
	// Enough long links that their listing is over one answer.
	const cap = 250
	h := startDrive(t, 2, Limits{DriveFiles: cap})
	creator, member := bustest.Agent(t), bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	for i := range cap {
		h.must(member, "attach", linkPayload(desc, i))
	}
	e := h.refuse(member, "attach", linkPayload(desc, cap), errs.QuotaExceeded)
	if !strings.Contains(e.Message, fmt.Sprint(cap)) {
		t.Fatalf("refusal %q does not name the limit", e.Message)
	}
	h.refuse(member, "attach", attachPayload(desc, "one more", []byte("a file")), errs.QuotaExceeded)
	// A digest already on the drive is answered, not counted.
	h.must(member, "attach", linkPayload(desc, 3))
	if q, r := h.quota("ops@example.com"), h.roomRecord(roomID); q.DriveBytes != cap*DriveEntryOverhead ||
		r.DriveBytes != cap*DriveEntryOverhead || r.DriveFiles != cap {
		t.Fatalf("counted quota %d, room %d bytes in %d entries; want %d in %d", q.DriveBytes, r.DriveBytes, r.DriveFiles, cap*DriveEntryOverhead, cap)
	}

	// Status pages: by drive_limit, and by bytes.
	pages := func(extra map[string]any) (pages [][]any) {
		seen := map[string]bool{}
		after := ""
		for {
			p := map[string]any{"descriptor": desc}
			for k, v := range extra {
				p[k] = v
			}
			if after != "" {
				p["drive_after"] = after
			}
			st := h.must(creator, "status", p)
			drive := st["drive"].(map[string]any)
			files := drive["artifacts"].([]any)
			if drive["files"] != float64(cap) || drive["max_files"] != float64(cap) {
				t.Fatalf("status drive %v", drive)
			}
			for _, f := range files {
				ref := f.(map[string]any)["ref"].(string)
				if seen[ref] {
					t.Fatalf("%s listed twice", ref)
				}
				seen[ref] = true
			}
			pages = append(pages, files)
			next, _ := drive["next"].(string)
			if next == "" {
				if len(seen) != cap {
					t.Fatalf("the pages list %d entries, want %d", len(seen), cap)
				}
				return pages
			}
			after = next
		}
	}
	if got := pages(map[string]any{"drive_limit": 60}); len(got) != 5 || len(got[0]) != 60 || len(got[4]) != 10 {
		t.Fatalf("pages of 60: %d pages", len(got))
	}
	for _, budget := range []int{pageBytes, 100_000} {
		restore := SetPageBytes(budget)
		byBytes := pages(map[string]any{"drive_limit": 5000}) // clamped to MaxDrivePage
		restore()
		for _, p := range byBytes {
			if b, _ := json.Marshal(p); len(b) > budget || len(p) > MaxDrivePage {
				t.Fatalf("a page of %d entries, %d bytes", len(p), len(b))
			}
		}
		if len(byBytes) < 2 {
			t.Fatalf("pages within %d bytes: %d", budget, len(byBytes))
		}
	}
	h.refuse(creator, "status", map[string]any{"descriptor": desc, "drive_limit": 0}, errs.InputInvalid)

	// The whole drive is more than one answer: the dossier says what to
	// read instead.
	e = h.refuse(creator, "dossier", map[string]any{"descriptor": desc}, errs.PayloadTooLarge)
	if !strings.Contains(e.Message, "mesh.rooms.status (drive_after)") || !strings.Contains(e.Message, "mesh.rooms.replay") {
		t.Fatalf("dossier refusal %q", e.Message)
	}
}

// Notes page like the drive's listing: by limit and after (next).
func TestNotesPaged(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator, a, b := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	_, desc := h.room(creator, "ops@example.com", GradeCapability)
	var digests []string
	for i := range 6 {
		got := h.must(creator, "attach", attachPayload(desc, fmt.Sprint(i), []byte(fmt.Sprint("file ", i))))
		digests = append(digests, got["digest"].(string))
	}
	for _, d := range digests {
		h.must(a, "note", map[string]any{"descriptor": desc, "digest": d, "verdict": "pass"})
		h.must(b, "note", map[string]any{"descriptor": desc, "digest": d, "verdict": "flag"})
	}
	var all []any
	after := ""
	for n := 0; ; n++ {
		p := map[string]any{"descriptor": desc, "limit": 5}
		if after != "" {
			p["after"] = after
		}
		out := h.must(creator, "notes", p)
		page := out["notes"].([]any)
		all = append(all, page...)
		next, _ := out["next"].(string)
		if next == "" {
			if n != 2 || len(page) != 2 {
				t.Fatalf("%d pages, the last of %d", n+1, len(page))
			}
			break
		}
		after = next
	}
	if len(all) != 12 {
		t.Fatalf("%d notes over the pages, want 12", len(all))
	}
	whole := h.must(creator, "notes", map[string]any{"descriptor": desc})["notes"].([]any)
	if a, b := mustMarshal(t, all), mustMarshal(t, whole); string(a) != string(b) {
		t.Fatal("the pages are not the whole listing in order")
	}
	if one := h.must(creator, "notes", map[string]any{"descriptor": desc, "digest": digests[2], "limit": 1}); len(one["notes"].([]any)) != 1 || one["next"] == nil {
		t.Fatalf("notes on one file, one a page: %v", one)
	}
	h.refuse(creator, "notes", map[string]any{"descriptor": desc, "limit": -1}, errs.InputInvalid)
}
