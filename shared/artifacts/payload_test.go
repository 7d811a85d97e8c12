package artifacts

import (
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
)

func TestParsePut(t *testing.T) {
	id := newID()
	for _, tc := range []struct {
		name, payload string
		want          errs.Code
		part          bool
	}{
		{"whole", `{"data_b64":"aGVsbG8=","name":"a.txt","media_type":"text/plain","retain_days":3}`, "", false},
		{"empty file", `{"data_b64":""}`, "", false},
		{"part", `{"object_id":"` + id + `","index":2,"data_b64":"aGVsbG8="}`, "", true},
		{"no data", `{"name":"a"}`, errs.InputInvalid, false},
		{"bad base64", `{"data_b64":"@@@@"}`, errs.InputInvalid, false},
		{"too large", `{"data_b64":"` + strings.Repeat("AAAA", 3) + `"}`, errs.PayloadTooLarge, false},
		{"part too large", `{"object_id":"` + id + `","index":0,"data_b64":"` + strings.Repeat("AAAA", 3) + `"}`, errs.PayloadTooLarge, true},
		{"part without index", `{"object_id":"` + id + `","data_b64":""}`, errs.InputInvalid, true},
		{"negative index", `{"object_id":"` + id + `","index":-1,"data_b64":""}`, errs.InputInvalid, true},
		{"index without object", `{"index":0,"data_b64":""}`, errs.InputInvalid, false},
		{"bad object id", `{"object_id":"x.y","index":0,"data_b64":""}`, errs.InputInvalid, true},
		{"part with a name", `{"object_id":"` + id + `","index":0,"data_b64":"","name":"a"}`, errs.InputInvalid, true},
		{"negative retain", `{"data_b64":"","retain_days":-1}`, errs.InputInvalid, false},
		{"control in name", `{"data_b64":"","name":"a\nb"}`, errs.InputInvalid, false},
		{"not an object", `"x"`, errs.InputInvalid, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePut([]byte(tc.payload), 8)
			if tc.want != "" {
				if got := errs.As(err); got == nil || got.Code != tc.want {
					t.Fatalf("got %v (%+v); want %s", err, p, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.part() != tc.part || (!p.part() && p.MediaType == "") {
				t.Fatalf("parsed as %+v", p)
			}
		})
	}
}

func TestParseBegin(t *testing.T) {
	d := DigestPrefix + strings.Repeat("A1", 32)
	b, err := parseBegin([]byte(`{"size":100,"digest":"`+d+`"}`), 1000)
	if err != nil || b.DigestHex != strings.Repeat("a1", 32) || b.MediaType != DefaultMediaType || b.Size != 100 {
		t.Fatalf("%+v %v", b, err)
	}
	for payload, want := range map[string]errs.Code{
		`{"digest":"` + d + `"}`:             errs.InputInvalid,
		`{"size":0,"digest":"` + d + `"}`:    errs.InputInvalid,
		`{"size":1001,"digest":"` + d + `"}`: errs.PayloadTooLarge,
		`{"size":10}`:                        errs.InputInvalid,
		`{"size":10,"digest":"sha1:ab"}`:     errs.InputInvalid,
		`{"size":"10","digest":"` + d + `"}`: errs.InputInvalid,
	} {
		if _, err := parseBegin([]byte(payload), 1000); errs.As(err) == nil || errs.As(err).Code != want {
			t.Errorf("%s: %v; want %s", payload, err, want)
		}
	}
}

func TestParseRef(t *testing.T) {
	id := newID()
	if got, link, err := parseRef(Ref(id)); err != nil || got != id || link {
		t.Fatalf("artifact ref: %q %t %v", got, link, err)
	}
	if got, link, err := parseRef(LinkRef(id)); err != nil || got != id || !link {
		t.Fatalf("link ref: %q %t %v", got, link, err)
	}
	for _, bad := range []string{"", "mesh:artifacts:", "mesh:artifacts:short", "mesh:artifacts:link:", "mesh:artifacts:" + id + "x",
		"mesh:rooms:r/drive/" + id, "mesh:artifacts:" + id[:23] + "."} {
		if _, _, err := parseRef(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzParsePut: the put decoder never panics; what it accepts is within
// the limit and is one of its two forms.
func FuzzParsePut(f *testing.F) {
	for _, s := range []string{
		`{"data_b64":"aGVsbG8=","name":"a.txt","media_type":"text/plain","retain_days":3}`,
		`{"object_id":"AAAAAAAAAAAAAAAAAAAAAAAA","index":2,"data_b64":"aGVsbG8="}`,
		`{"data_b64":"AAAAAAAAAAAA"}`, `{"data_b64":"AA=\n="}`, `{}`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	const limit = 8
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := parsePut(raw, limit)
		if err != nil {
			if c := errs.As(err).Code; c != errs.InputInvalid && c != errs.PayloadTooLarge {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		if len(p.Data) > limit {
			t.Fatalf("accepted %d bytes over the %d limit", len(p.Data), limit)
		}
		if p.part() {
			if !idPattern.MatchString(p.ObjectID) || p.Index < 0 || p.MediaType != "" || p.Name != "" {
				t.Fatalf("part accepted as %+v", p)
			}
		} else if p.MediaType == "" || p.RetainDays < 0 {
			t.Fatalf("whole file accepted as %+v", p)
		}
	})
}

// FuzzParseBegin: the put.begin decoder never panics; what it accepts has
// a size within bounds and a well-formed digest.
func FuzzParseBegin(f *testing.F) {
	for _, s := range []string{
		`{"size":100,"digest":"sha256:` + strings.Repeat("ab", 32) + `","name":"x","retain_days":2}`,
		`{"size":0}`, `{"size":1e30,"digest":"sha256:"}`, `{}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := parseBegin(raw, 1000)
		if err != nil {
			if c := errs.As(err).Code; c != errs.InputInvalid && c != errs.PayloadTooLarge {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		if b.Size < 1 || b.Size > 1000 || len(b.DigestHex) != 64 || strings.ToLower(b.DigestHex) != b.DigestHex || b.MediaType == "" {
			t.Fatalf("accepted as %+v", b)
		}
	})
}

// FuzzParseRef: refs never panic the parser, and what parses renders back.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{Ref("AAAAAAAAAAAAAAAAAAAAAAAA"), LinkRef("AAAAAAAAAAAAAAAAAAAAAAAA"), "mesh:artifacts:", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		id, link, err := parseRef(ref)
		if err != nil {
			return
		}
		back := Ref(id)
		if link {
			back = LinkRef(id)
		}
		if back != ref {
			t.Fatalf("%q parsed to %q (link %t), which renders %q", ref, id, link, back)
		}
	})
}
