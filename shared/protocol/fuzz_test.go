package protocol_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzDecodeEnvelope: no input panics; every refusal carries one of the
// three decode codes; anything accepted re-encodes to bytes that decode to
// the same canonical form.
func FuzzDecodeEnvelope(f *testing.F) {
	k := seedKey(f)
	e := fixedEnvelope(f, k.Public(), "")
	_ = e.Sign(k)
	wire, _ := e.Marshal()
	f.Add(wire)
	f.Add(bytes.Replace(wire, []byte(`"v":"0.3.0"`), []byte(`"v":"9.0"`), 1))
	f.Add([]byte(`{"v":"0.2","id":"x","type":"emit","ts":"","from":"U","trace":{},"payload":null}`))
	f.Add([]byte(`{"a":"\ud83d\ude00","a":1}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`))
	golden, _ := os.ReadFile(filepath.Join("testdata", "envelope.golden"))
	f.Add(golden)
	// An id at the bound and one byte over it, signed.
	for _, n := range []int{protocol.MaxIDBytes, protocol.MaxIDBytes + 1} {
		long := fixedEnvelope(f, k.Public(), "")
		long.ID = strings.Repeat("7", n)
		_ = long.Sign(k)
		w, _ := long.Marshal()
		f.Add(w)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Parse then Verify is Decode: the same outcome, and what the
		// unverified form claims is what the verified envelope says.
		env, err := protocol.Decode(data)
		u, perr := protocol.Parse(data)
		if perr == nil {
			accept, from, id, req := u.IsAccept(), u.From(), u.ID(), u.InReplyTo()
			venv, verr := protocol.DefaultDecoder.Verify(u)
			if (verr == nil) != (err == nil) {
				t.Fatalf("Decode says %v, Parse+Verify says %v", err, verr)
			}
			if verr == nil && (accept != protocol.IsAccepted(venv) || from != venv.From || id != venv.ID || req != venv.InReplyTo) {
				t.Fatalf("the unverified claims (accept %v, %q, %q, %q) differ from the verified envelope", accept, from, id, req)
			}
			if verr == nil {
				// The kept parse is what parsing the canonical payload gives.
				view, _ := venv.PayloadView()
				fresh, ferr := venv.PayloadValue()
				if ferr != nil || !reflect.DeepEqual(view, fresh) {
					t.Fatalf("payload view %v, parsed %v (%v)", view, fresh, ferr)
				}
			}
		} else if err == nil {
			t.Fatalf("Parse refused what Decode accepts: %v", perr)
		}
		if err != nil {
			switch errs.CodeOf(err) {
			case errs.InvalidEnvelope, errs.InvalidVersion, errs.IdentityMismatch:
			default:
				t.Fatalf("refusal without a decode code: %v", err)
			}
			return
		}
		if len(env.ID) > protocol.MaxIDBytes || len(env.InReplyTo) > protocol.MaxIDBytes {
			t.Fatalf("accepted an id of %d bytes (in_reply_to %d)", len(env.ID), len(env.InReplyTo))
		}
		c1, err := env.CanonicalUnsigned()
		if err != nil {
			t.Fatalf("accepted envelope does not canonicalise: %v", err)
		}
		out, err := env.Marshal()
		if err != nil {
			t.Fatalf("accepted envelope does not marshal: %v", err)
		}
		again, err := protocol.Decode(out)
		if err != nil {
			t.Fatalf("re-encoded envelope refused: %v", err)
		}
		c2, _ := again.CanonicalUnsigned()
		if !bytes.Equal(c1, c2) {
			t.Fatalf("canonical form changed:\n%s\n%s", c1, c2)
		}
	})
}

// FuzzCanonicalJSON: canonical(parse(canonical(x))) == canonical(x), and the
// canonical form is a fixed point.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1e21,1e-7,-0,0.1,"\u2028\/"]}`, `"\ud83d\ude00"`, `{"\ufb00":1,"\ud83d\ude00":2}`,
		`9007199254740993`, `[null,true,false,{}]`, `{"a":{"b":{"c":"\u0000\u001f"}}}`, `1.7976931348623157e308`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := protocol.ParseJSON(data)
		if err != nil {
			return
		}
		c1, err := protocol.Canonical(v)
		if err != nil {
			t.Fatalf("parsed value does not canonicalise: %v", err)
		}
		v2, err := protocol.ParseJSON(c1)
		if err != nil {
			t.Fatalf("canonical output does not parse: %v\n%s", err, c1)
		}
		c2, err := protocol.Canonical(v2)
		if err != nil || !bytes.Equal(c1, c2) {
			t.Fatalf("not idempotent:\n%s\n%s (%v)", c1, c2, err)
		}
	})
}

// FuzzParseBudget: no panic; a valid block round-trips through its typed
// form to an equally valid block.
func FuzzParseBudget(f *testing.F) {
	for _, s := range []string{
		`{"deadline":"2026-07-27T16:00:00Z","revision":0,"cost_ceiling":{"amount_micro":2000000,"currency":"USD"}}`,
		`{"revision":3,"deadline":"2026-07-27T11:00:00-05:00"}`, `{"revision":0}`, `{"revision":1.5}`,
		`{"revision":0,"cost_ceiling":{"amount_micro":-1,"currency":"USD"}}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := protocol.ParseBudget(data)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("refusal with code %s", errs.CodeOf(err))
			}
			return
		}
		c, err := protocol.Canonical(b)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := protocol.ParseBudget(c)
		if err != nil {
			t.Fatalf("typed budget %s does not re-parse: %v", c, err)
		}
		c2, _ := protocol.Canonical(b2)
		if !bytes.Equal(c, c2) {
			t.Fatalf("round trip changed %s to %s", c, c2)
		}
		d, _ := b.DeadlineTime()
		if line := b.Line(d); line == "" {
			t.Fatal("empty budget line")
		}
	})
}
