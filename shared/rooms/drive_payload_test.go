package rooms

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
)

func TestParseAttach(t *testing.T) {
	hexd := strings.Repeat("0a", 32)
	for _, tc := range []struct {
		name, payload string
		want          errs.Code // "" for accepted
	}{
		{"inline", `{"descriptor":{},"name":"a.txt","data_b64":"aGVsbG8="}`, ""},
		{"inline with every member", `{"name":"a","version":"3","media_type":"text/plain","origin":"git:1","role":"output","data_b64":""}`, ""},
		{"link", `{"name":"big","location":"s3://b/k","digest":"sha256:` + hexd + `","size":12}`, ""},
		{"link upper-case hex", `{"name":"big","location":"x","digest":"sha256:` + strings.ToUpper(hexd) + `"}`, ""},
		{"by is ignored", `{"name":"a","data_b64":"","by":"someone"}`, ""},
		{"no name", `{"data_b64":"aGVsbG8="}`, errs.InputInvalid},
		{"empty name", `{"name":"","data_b64":"aGVsbG8="}`, errs.InputInvalid},
		{"control character", `{"name":"a\u0000b","data_b64":""}`, errs.InputInvalid},
		{"long name", `{"name":"` + strings.Repeat("n", maxFileName+1) + `","data_b64":""}`, errs.InputInvalid},
		{"neither form", `{"name":"a"}`, errs.InputInvalid},
		{"both forms", `{"name":"a","data_b64":"","location":"x","digest":"sha256:` + hexd + `"}`, errs.InputInvalid},
		{"digest with data", `{"name":"a","data_b64":"","digest":"sha256:` + hexd + `"}`, errs.InputInvalid},
		{"not base64", `{"name":"a","data_b64":"***"}`, errs.InputInvalid},
		{"url-safe base64", `{"name":"a","data_b64":"_-_-"}`, errs.InputInvalid},
		{"link without digest", `{"name":"a","location":"x"}`, errs.InputInvalid},
		{"link bad digest", `{"name":"a","location":"x","digest":"sha256:abc"}`, errs.InputInvalid},
		{"link bare hex", `{"name":"a","location":"x","digest":"` + hexd + `"}`, errs.InputInvalid},
		{"link negative size", `{"name":"a","location":"x","digest":"sha256:` + hexd + `","size":-1}`, errs.InputInvalid},
		{"too large", `{"name":"a","data_b64":"` + strings.Repeat("AAAA", 4) + `"}`, errs.PayloadTooLarge},
		{"not an object", `[1,2]`, errs.InputInvalid},
		{"name not a string", `{"name":7,"data_b64":""}`, errs.InputInvalid},
		// A role is input, interim or output (upstream-notes §7), or none.
		{"role input", `{"name":"a","role":"input","data_b64":""}`, ""},
		{"role interim", `{"name":"a","role":"interim","data_b64":""}`, ""},
		{"role empty", `{"name":"a","role":"","data_b64":""}`, ""},
		{"role not in the set", `{"name":"a","role":"deliverable","data_b64":""}`, errs.InputInvalid},
		{"role in capitals", `{"name":"a","role":"Output","data_b64":""}`, errs.InputInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := parseAttach([]byte(tc.payload), 10)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if a.Version == "" || !strings.HasPrefix(a.Digest, DigestPrefix) || len(a.DigestHex) != 64 {
					t.Fatalf("accepted as %+v", a)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %+v; want %s", a, tc.want)
			}
			if got := errs.As(err).Code; got != tc.want {
				t.Fatalf("%s (%v); want %s", got, err, tc.want)
			}
		})
	}
}

func TestDriveRef(t *testing.T) {
	h := strings.Repeat("ab", 32)
	room, digest, err := parseDriveRef(driveRef("room_1", h))
	if err != nil || room != "room_1" || digest != h {
		t.Fatalf("round trip: %q %q %v", room, digest, err)
	}
	for _, bad := range []string{"", "mesh:rooms:", "mesh:rooms:r/drive/", "mesh:rooms:/drive/" + h, "mesh:rooms:r/drive/" + h[:62],
		"mesh:artifacts:x", "sha256:" + h, "mesh:rooms:r/drive/" + h + "/x"} {
		if _, _, err := parseDriveRef(bad); err == nil {
			t.Errorf("%q accepted as a drive ref", bad)
		}
	}
}

// FuzzParseAttach: the attach decoder never panics, and what it accepts is
// one of the two forms, consistent with itself: an inline file within the
// limit whose digest is its bytes', or a link with a well-formed digest.
func FuzzParseAttach(f *testing.F) {
	for _, s := range []string{
		`{"name":"a.txt","data_b64":"aGVsbG8="}`,
		`{"name":"a","version":"3","media_type":"text/plain","origin":"o","role":"input","data_b64":""}`,
		`{"name":"big","location":"s3://b/k","digest":"sha256:` + strings.Repeat("0a", 32) + `","size":12}`,
		`{"name":"a","data_b64":"AAAAAAAAAAAAAAAA"}`,
		`{"name":"a","data_b64":"AA=="}`,
		`{"name":"\u2028","data_b64":"===="}`,
		`null`, `{}`, `[]`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	const limit = 8
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := parseAttach(raw, limit)
		if err != nil {
			if e := errs.As(err); e.Code != errs.InputInvalid && e.Code != errs.PayloadTooLarge {
				t.Fatalf("refused with %s: %v", e.Code, err)
			}
			return
		}
		if a.Name == "" || a.Version == "" || a.Digest != DigestPrefix+a.DigestHex {
			t.Fatalf("accepted inconsistently: %+v", a)
		}
		switch a.Role {
		case "", RoleInput, RoleInterim, RoleOutput:
		default:
			t.Fatalf("accepted role %q", a.Role)
		}
		if _, err := hex.DecodeString(a.DigestHex); err != nil || len(a.DigestHex) != 64 || strings.ToLower(a.DigestHex) != a.DigestHex {
			t.Fatalf("digest %q", a.DigestHex)
		}
		if a.external() {
			if a.Data != nil || a.Size < 0 {
				t.Fatalf("link with bytes or a negative size: %+v", a)
			}
			return
		}
		sum := sha256.Sum256(a.Data)
		if int64(len(a.Data)) > limit || int64(len(a.Data)) != a.Size || !bytes.Equal(sum[:], mustHex(t, a.DigestHex)) {
			t.Fatalf("inline file inconsistent: %d bytes, size %d, digest %s", len(a.Data), a.Size, a.DigestHex)
		}
	})
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
