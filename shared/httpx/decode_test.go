package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"agentmesh.dev/mesh/shared/errs"
)

type decodeItem struct {
	ID  string `json:"id"`
	Sig string `json:"sig"`
}

type decodeBody struct {
	Name  string          `json:"name"`
	N     int             `json:"n"`
	Items []decodeItem    `json:"items"`
	Opt   *decodeItem     `json:"opt,omitempty"`
	Raw   json.RawMessage `json:"raw"`
	Skip  string          `json:"-"`
}

func TestDecode(t *testing.T) {
	strict, lax := DecodeOptions{Strict: true}, DecodeOptions{}
	const js = "application/json"
	for _, c := range []struct {
		name, ct, in string
		opt          DecodeOptions
		code         errs.Code
		msg          string
	}{
		{"ok", js, `{"name":"a","n":1,"items":[{"id":"x","sig":"y"}],"opt":{"id":"z"},"raw":{"Any":1,"any":2}}`, strict, "", ""},
		{"charset ok", "application/json; charset=utf-8", `{"name":"a"}`, lax, "", ""},
		{"charset any case", "Application/JSON; charset=UTF-8", `{"name":"a"}`, lax, "", ""},

		// Content type: application/json, or 415.
		{"no content type", "", `{"name":"a"}`, strict, errs.ContentTypeNotSupported, "none was sent"},
		{"form", "application/x-www-form-urlencoded", `a=b`, strict, errs.ContentTypeNotSupported, "content-type must be application/json"},
		{"text", "text/plain", `{"name":"a"}`, strict, errs.ContentTypeNotSupported, "text/plain"},
		{"other json", "application/merge-patch+json", `{"name":"a"}`, strict, errs.ContentTypeNotSupported, "content-type"},
		{"latin1", "application/json; charset=latin1", `{"name":"a"}`, strict, errs.ContentTypeNotSupported, "content-type"},
		{"bad media type", "application/json; ;", `{"name":"a"}`, strict, errs.ContentTypeNotSupported, "content-type"},

		// Member names are exact, at every level, strict or not.
		{"case-insensitive name", js, `{"Name":"a"}`, strict, errs.InvalidRequest, `member "Name" is not "name"`},
		{"case-insensitive name lax", js, `{"NAME":"a"}`, lax, errs.InvalidRequest, `member "NAME" is not "name"`},
		{"unicode case folding", js, `{"item\u017f":[]}`, lax, errs.InvalidRequest, "case-sensitive"}, // ſ folds to s
		{"case-insensitive nested", js, `{"items":[{"ID":"x"}]}`, strict, errs.InvalidRequest, `member "items[0].ID" is not "items[0].id"`},
		{"case-insensitive pointer", js, `{"opt":{"Sig":"x"}}`, lax, errs.InvalidRequest, `"opt.Sig" is not "opt.sig"`},
		{"json:- is no member", js, `{"Skip":"x"}`, strict, errs.InvalidRequest, `unknown member "Skip"`},

		// The parser of signed bytes: duplicates and invalid UTF-8 refused.
		{"duplicate member", js, `{"name":"a","name":"b"}`, strict, errs.InvalidRequest, `duplicate member name "name"`},
		{"duplicate member lax", js, `{"x":1,"x":2}`, lax, errs.InvalidRequest, "duplicate member"},
		{"duplicate nested", js, `{"items":[{"id":"a","id":"b"}]}`, strict, errs.InvalidRequest, "duplicate member"},
		{"duplicate by case", js, `{"name":"a","Name":"b"}`, lax, errs.InvalidRequest, "case-sensitive"},
		{"invalid UTF-8", js, "{\"name\":\"a\xffb\"}", strict, errs.InvalidRequest, "invalid UTF-8"},
		{"invalid UTF-8 in a name", js, "{\"na\xc3me\":1}", lax, errs.InvalidRequest, "invalid UTF-8"},
		{"lone surrogate", js, `{"name":"\ud800"}`, strict, errs.InvalidRequest, "lone surrogate"},
		{"too deep", js, `{"raw":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, strict, errs.InvalidRequest, "nesting"},

		// Only the declared members, where the route says so.
		{"unknown member strict", js, `{"name":"a","state":"x"}`, strict, errs.InvalidRequest, `unknown member "state"`},
		{"unknown nested strict", js, `{"items":[{"id":"a","extra":1}]}`, strict, errs.InvalidRequest, `unknown member "items[0].extra"`},
		{"unknown member lax", js, `{"name":"a","state":"x"}`, lax, "", ""},

		{"wrong type", js, `{"n":"x"}`, lax, errs.InvalidRequest, `member "n" must be a number`},
		{"syntax", js, `{"n":`, lax, errs.InvalidRequest, "not valid JSON"},
		{"garbage", js, `nope`, lax, errs.InvalidRequest, "not valid JSON"},
		{"two values", js, `{}{}`, lax, errs.InvalidRequest, "after the JSON value"},
		{"array", js, `[]`, lax, errs.InvalidRequest, "must be a JSON object"},
		{"null", js, `null`, lax, errs.InvalidRequest, "must be a JSON object"},
		{"empty", js, ``, lax, errs.InvalidRequest, "required"},
		{"empty allowed", "", ``, DecodeOptions{AllowEmpty: true}, "", ""},
		{"empty object allowed", js, `{}`, DecodeOptions{AllowEmpty: true, Strict: true}, "", ""},
		{"too big", js, `{"name":"` + strings.Repeat("x", 100) + `"}`, DecodeOptions{MaxBytes: 50}, errs.PayloadTooLarge, "larger than 50"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.in))
			if c.ct != "" {
				r.Header.Set("Content-Type", c.ct)
			}
			var b decodeBody
			err := Decode(httptest.NewRecorder(), r, &b, c.opt)
			if errs.CodeOf(err) != c.code {
				t.Fatalf("got %v, want %q", err, c.code)
			}
			if err != nil && !strings.Contains(errs.As(err).Message, c.msg) {
				t.Errorf("message %q does not say %q", errs.As(err).Message, c.msg)
			}
			if c.code == errs.ContentTypeNotSupported && errs.As(err).HTTPStatus() != http.StatusUnsupportedMediaType {
				t.Errorf("status %d, want 415", errs.As(err).HTTPStatus())
			}
		})
	}
}

// A route declares its member set with its body struct: an optional member
// added as a field (as bootstrap's `proof` will be) is accepted, and still
// nothing else; embedded structs promote their members as encoding/json
// does.
func TestDecodeMemberSetIsTheStruct(t *testing.T) {
	type base struct {
		Token   string `json:"token"`
		AgentID string `json:"agent_id"`
	}
	type withProof struct {
		base
		Proof string `json:"proof,omitempty"`
	}
	var b withProof
	if err := DecodeBytes([]byte(`{"token":"am_x","agent_id":"U1","proof":"p"}`), &b, true); err != nil {
		t.Fatal(err)
	}
	if b.Token != "am_x" || b.AgentID != "U1" || b.Proof != "p" {
		t.Fatalf("decoded %+v", b)
	}
	if err := DecodeBytes([]byte(`{"token":"am_x","agent_id":"U1","shared_inbox":true}`), &b, true); errs.CodeOf(err) != errs.InvalidRequest {
		t.Fatalf("undeclared member: %v", err)
	}
	if err := DecodeBytes([]byte(`{"Token":"am_x"}`), &b, true); err == nil || !strings.Contains(err.Error(), "case-sensitive") {
		t.Fatalf("promoted member by case: %v", err)
	}
	var empty struct{}
	if err := DecodeBytes([]byte(`{"x":1}`), &empty, true); errs.CodeOf(err) != errs.InvalidRequest {
		t.Fatalf("a route with no members: %v", err)
	}
}

// Whatever bytes arrive, DecodeBytes refuses with a protocol error or
// decodes into a value with exactly the declared members.
func FuzzDecodeBytes(f *testing.F) {
	for _, s := range []string{`{"name":"a","n":1,"items":[{"id":"x","sig":"y"}]}`, `{"Name":"a"}`, `{"name":"a","name":"b"}`,
		"{\"name\":\"\xff\"}", `{"items":[{"ID":1}]}`, `{"raw":[[[[]]]]}`, `[]`, `{"n":1e400}`, `{"opt":null}`} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, strict bool) {
		var b decodeBody
		err := DecodeBytes(in, &b, strict)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidRequest {
				t.Fatalf("refusal with code %q: %v", errs.CodeOf(err), err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("accepted invalid JSON %q", in)
		}
	})
}

// TestReadAllIsIOReadAll: whatever the announced length, readAll returns
// what io.ReadAll returns: the same bytes, or the same error.
func TestReadAllIsIOReadAll(t *testing.T) {
	body := strings.Repeat("0123456789", 700)
	boom := errors.New("boom")
	readers := map[string]func() io.Reader{
		"whole":    func() io.Reader { return strings.NewReader(body) },
		"one byte": func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
		"half":     func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
		"error":    func() io.Reader { return io.MultiReader(strings.NewReader(body[:3000]), iotest.ErrReader(boom)) },
		"empty":    func() io.Reader { return strings.NewReader("") },
		"timeout":  func() io.Reader { return iotest.TimeoutReader(strings.NewReader(body)) },
		"too large": func() io.Reader {
			return http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(body)), 5000)
		},
	}
	for name, r := range readers {
		want, wantErr := io.ReadAll(r())
		for _, hint := range []int64{-1, 0, 1, 511, 512, 4999, 5000, int64(len(body)) - 1, int64(len(body)), int64(len(body)) + 1, 1 << 16} {
			got, err := readAll(r(), hint)
			// On an error only the error matters: how much was read before
			// it depends on the sizes of the reads, and Decode drops it.
			if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() || err == nil && !bytes.Equal(got, want) {
				t.Fatalf("%s, hint %d: %d bytes, %v; io.ReadAll %d bytes, %v", name, hint, len(got), err, len(want), wantErr)
			}
		}
	}
}
