package protocol_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// The canonical bytes and signature of a fixed envelope signed with the
// published seed are pinned: any change to canonicalisation, member order or
// the tag shows up here as a signature break.
func TestEnvelopeGolden(t *testing.T) {
	k := seedKey(t)
	e := fixedEnvelope(t, k.Public(), "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A")
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	wire, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "envelope.golden", append(wire, '\n'))
	if n := len(wire); n < 550 || n > 700 {
		t.Errorf("benchmark envelope is %d bytes; keep it near 600", n)
	}
	back, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := back.Marshal()
	if string(again) != string(wire) {
		t.Errorf("decode/marshal is not the identity:\n%s\n%s", again, wire)
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	k := freshKey(t)
	e, err := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "héllo 😀 </b>"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	if len(e.Sig) != 86 {
		t.Errorf("sig is %d characters, want 86 (base64url, no padding)", len(e.Sig))
	}
	wire, _ := e.Marshal()
	got, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != e.ID || got.From != k.Public() || string(got.Payload) != string(e.Payload) || got.Trace.ParentSpanID != nil || got.Trace.OmitParent {
		t.Errorf("round trip changed the envelope: %+v", got)
	}
	if !strings.Contains(string(wire), `"parent_span_id":null`) {
		t.Errorf("a root span must sign parent_span_id as null: %s", wire)
	}
}

func TestIDsAndTime(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = protocol.NewID()
		if !re.MatchString(ids[i]) {
			t.Fatalf("%q is not a UUIDv7", ids[i])
		}
	}
	if !slices.IsSorted(ids) {
		t.Error("ids made in sequence do not sort in creation order")
	}
	if len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Error("duplicate ids")
	}
	if tr := protocol.NewTraceID(); !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(tr) {
		t.Errorf("trace id %q", tr)
	}
	if sp := protocol.NewSpanID(); !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(sp) {
		t.Errorf("span id %q", sp)
	}
	ts := protocol.FormatTime(time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("x", 3600)))
	if ts != "2026-01-02T02:04:05.006Z" {
		t.Errorf("FormatTime = %s", ts)
	}
}

func TestReplyContinuesTrace(t *testing.T) {
	a, b := freshKey(t), freshKey(t)
	req, _ := protocol.New(protocol.TypeRequest, a.Public(), map[string]any{"offering": "x"})
	req.ContextID = "ctx-1"
	rep, err := protocol.NewReply(req, b.Public(), map[string]any{"status": "completed"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Trace.TraceID != req.Trace.TraceID || rep.Trace.ParentSpanID == nil || *rep.Trace.ParentSpanID != req.Trace.SpanID ||
		rep.Trace.SpanID == req.Trace.SpanID || rep.InReplyTo != req.ID || rep.To != a.Public() || rep.ContextID != "ctx-1" {
		t.Errorf("reply does not continue the request: %+v", rep)
	}
}

// signedWire signs a generic envelope object in the tagged (or untagged)
// form, for decoder tests that need envelopes our builder would never make.
func signedWire(t *testing.T, m map[string]any, k interface{ Sign([]byte) []byte }, tagged bool) []byte {
	t.Helper()
	delete(m, "sig")
	body, err := protocol.Canonical(m)
	if err != nil {
		t.Fatal(err)
	}
	msg := body
	if tagged {
		msg = append([]byte(protocol.TagEnvelope+"\n"), body...)
	}
	m["sig"] = base64.RawURLEncoding.EncodeToString(k.Sign(msg))
	out, err := protocol.Canonical(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func baseEnvelope(from string) map[string]any {
	return map[string]any{
		"v": "0.2.0", "id": "019894f0-0000-7000-8000-000000000001", "type": "request",
		"ts": "2026-07-26T12:00:00.000Z", "from": from,
		"trace":   map[string]any{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"},
		"payload": map[string]any{"offering": "chat", "input": map[string]any{"text": "hi"}},
	}
}

// Every malformed input gets the spec's code, and nothing panics.
func TestDecodeRefusals(t *testing.T) {
	k, other := freshKey(t), freshKey(t)
	mut := func(f func(m map[string]any)) []byte {
		m := baseEnvelope(k.Public())
		f(m)
		return signedWire(t, m, k, true)
	}
	good := mut(func(map[string]any) {})
	tampered := []byte(strings.Replace(string(good), `"hi"`, `"ho"`, 1))
	for _, c := range []struct {
		name string
		in   []byte
		code errs.Code
	}{
		{"not json", []byte(`{"v":`), errs.InvalidEnvelope},
		{"array", []byte(`[1]`), errs.InvalidEnvelope},
		{"duplicate member", []byte(`{"v":"0.2","v":"0.2"}`), errs.InvalidEnvelope},
		{"missing v", mut(func(m map[string]any) { delete(m, "v") }), errs.InvalidEnvelope},
		{"numeric id", mut(func(m map[string]any) { m["id"] = 7.0 }), errs.InvalidEnvelope},
		{"id over 128 bytes", mut(func(m map[string]any) { m["id"] = strings.Repeat("i", protocol.MaxIDBytes+1) }), errs.InvalidEnvelope},
		{"in_reply_to over 128 bytes", mut(func(m map[string]any) {
			m["type"], m["in_reply_to"] = "respond", strings.Repeat("r", protocol.MaxIDBytes+1)
		}), errs.InvalidEnvelope},
		{"unknown type", mut(func(m map[string]any) { m["type"] = "shout" }), errs.InvalidEnvelope},
		{"missing trace", mut(func(m map[string]any) { delete(m, "trace") }), errs.InvalidEnvelope},
		{"trace without span", mut(func(m map[string]any) { m["trace"] = map[string]any{"trace_id": "ab"} }), errs.InvalidEnvelope},
		{"numeric parent span", mut(func(m map[string]any) {
			m["trace"] = map[string]any{"trace_id": "ab", "span_id": "cd", "parent_span_id": 1.0}
		}), errs.InvalidEnvelope},
		{"missing payload", mut(func(m map[string]any) { delete(m, "payload") }), errs.InvalidEnvelope},
		{"numeric to", mut(func(m map[string]any) { m["to"] = 1.0 }), errs.InvalidEnvelope},
		{"malformed budget", mut(func(m map[string]any) { m["budget"] = map[string]any{"revision": 0.0} }), errs.InvalidEnvelope},
		{"meta not object", mut(func(m map[string]any) { m["meta"] = "x" }), errs.InvalidEnvelope},
		{"major 1", mut(func(m map[string]any) { m["v"] = "1.0.0" }), errs.InvalidVersion},
		{"not a version", mut(func(m map[string]any) { m["v"] = "latest" }), errs.InvalidVersion},
		{"missing sig", func() []byte {
			m := baseEnvelope(k.Public())
			b, _ := protocol.Canonical(m)
			return b
		}(), errs.IdentityMismatch},
		{"sig not base64url", []byte(strings.Replace(string(good), `"sig":"`, `"sig":"+/`, 1)), errs.IdentityMismatch},
		{"tampered payload", tampered, errs.IdentityMismatch},
		{"signed by another key", func() []byte {
			m := baseEnvelope(k.Public())
			return signedWire(t, m, other, true)
		}(), errs.IdentityMismatch},
		{"from is a seed", mut(func(m map[string]any) { m["from"] = "SUAEGDPNTWXACIF45CA23BUY36RIMWZXW5LEHSEOK2ONS5JWJ7PBC2EWBA" }), errs.IdentityMismatch},
		{"wrong tag", func() []byte {
			m := baseEnvelope(k.Public())
			body, _ := protocol.Canonical(m)
			m["sig"] = base64.RawURLEncoding.EncodeToString(k.Sign(append([]byte(protocol.TagVouch+"\n"), body...)))
			b, _ := protocol.Canonical(m)
			return b
		}(), errs.IdentityMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := protocol.Decode(c.in)
			if got := errs.CodeOf(err); got != c.code {
				t.Errorf("got %v (%v), want %s", got, err, c.code)
			}
		})
	}
	if _, err := protocol.Decode(good); err != nil {
		t.Errorf("the unmodified envelope must decode: %v", err)
	}
	// The bound itself is allowed.
	if _, err := protocol.Decode(mut(func(m map[string]any) {
		m["id"] = strings.Repeat("i", protocol.MaxIDBytes)
		m["type"], m["in_reply_to"] = "respond", strings.Repeat("r", protocol.MaxIDBytes)
	})); err != nil {
		t.Errorf("a %d-byte id: %v", protocol.MaxIDBytes, err)
	}
}

func TestUntaggedSignatureSwitch(t *testing.T) {
	k := freshKey(t)
	wire := signedWire(t, baseEnvelope(k.Public()), k, false)
	if _, err := protocol.Decode(wire); err != nil {
		t.Errorf("the default decoder must accept the untagged form: %v", err)
	}
	strict := &protocol.Decoder{RefuseUntagged: true}
	if _, err := strict.Decode(wire); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Errorf("a deployment that refuses untagged signatures got %v", err)
	}
	tagged := signedWire(t, baseEnvelope(k.Public()), k, true)
	if _, err := strict.Decode(tagged); err != nil {
		t.Errorf("tagged form refused by strict decoder: %v", err)
	}
}

// Unknown members are signed by their author and must survive: verified,
// kept in Extra, and re-encoded byte for byte.
func TestUnknownMembersAreKept(t *testing.T) {
	k := freshKey(t)
	m := baseEnvelope(k.Public())
	m["artifacts"] = []any{map[string]any{"id": "a1", "parts": []any{}}}
	m["x_future"] = map[string]any{"n": 1.0}
	m["task_id"] = nil // spec prose "null" means absent at the API, but it was signed
	wire := signedWire(t, m, k, true)
	e, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	if e.Extra["x_future"] == nil || e.Extra["artifacts"] == nil {
		t.Errorf("unknown members dropped: %v", e.Extra)
	}
	if !e.Trace.OmitParent {
		t.Error("absent parent_span_id not recorded")
	}
	if string(e.Raw()) != string(wire) {
		t.Error("Raw is not the received bytes")
	}
}

func TestSignRefusesMisattribution(t *testing.T) {
	a, b := freshKey(t), freshKey(t)
	e, _ := protocol.New(protocol.TypeEmit, a.Public(), map[string]any{"topic": "t", "kind": "state", "data": 1})
	if err := e.Sign(b); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Errorf("signing another key's envelope: %v", err)
	}
	if _, err := e.Marshal(); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Errorf("marshal of an unsigned envelope: %v", err)
	}
	if err := e.Sign(a); err != nil {
		t.Fatal(err)
	}
	_ = e.SetPayload(map[string]any{"topic": "t"})
	if e.Sig != "" {
		t.Error("changing the payload must clear the signature")
	}
}

func TestVerifyBytesAndEncodings(t *testing.T) {
	k := freshKey(t)
	msg := []byte("pan-pair-v1:ABC-DEF:" + k.Public())
	sig := k.Sign(msg)
	for _, enc := range []protocol.SigEncoding{protocol.Base64URL, protocol.Base64Std} {
		s := enc.Encode(sig)
		if err := protocol.VerifyString(k.Public(), msg, s, enc); err != nil {
			t.Errorf("enc %d: %v", enc, err)
		}
		if err := protocol.VerifyString(k.Public(), append(msg, 'x'), s, enc); err == nil {
			t.Errorf("enc %d: verified a different message", enc)
		}
	}
	if len(protocol.Base64Std.Encode(sig)) != 88 || len(protocol.Base64URL.Encode(sig)) != 86 {
		t.Error("encoded lengths")
	}
	if _, err := protocol.Base64URL.Decode(base64.RawURLEncoding.EncodeToString(sig[:10])); err == nil {
		t.Error("a short signature decoded")
	}
	if !ed25519.Verify(k.PublicKey(), msg, sig) {
		t.Error("keys.Sign is not plain Ed25519")
	}
}

// DecodeBrokerAttributed and Parse yield what Decode yields for a
// signed envelope, do not look at the signature, and still refuse a
// malformed one.
func TestDecodeBrokerAttributed(t *testing.T) {
	k := freshKey(t)
	e, err := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "ok"}})
	if err != nil {
		t.Fatal(err)
	}
	e.Meta = []byte(`{"a":2,"b":1}`)
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	wire, _ := e.Marshal()
	verified, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"signed":   wire,
		"bad sig":  []byte(strings.Replace(string(wire), `"sig":"`, `"sig":"AA`, 1)),
		"unsigned": []byte(strings.Replace(string(wire), `"sig":"`+e.Sig+`",`, ``, 1)),
	} {
		got, err := protocol.DecodeBrokerAttributed(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if u, err := protocol.Parse(data); err != nil || u.From() != verified.From || u.ID() != verified.ID {
			t.Errorf("%s: Parse = %v, %v", name, u, err)
		}
		if got.ID != verified.ID || got.From != verified.From || string(got.Payload) != string(verified.Payload) || string(got.Meta) != string(verified.Meta) || got.Type != verified.Type {
			t.Errorf("%s: attributed decode %+v differs from verified decode %+v", name, got, verified)
		}
	}
	for name, data := range map[string]string{
		"not json":      `{`,
		"no from":       strings.Replace(string(wire), `"from":`, `"frm":`, 1),
		"wrong version": strings.Replace(string(wire), `"v":"`+protocol.Version+`"`, `"v":"9.0"`, 1),
	} {
		if _, err := protocol.DecodeBrokerAttributed([]byte(data)); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := protocol.Parse([]byte(data)); err == nil {
			t.Errorf("%s: Parse accepted it", name)
		}
	}
}

// New and NewReply draw the id, timestamp and trace from one random read
// and one string: each must still be well formed, ids must stay unique and
// ordered, and a reply must be a child span carrying the trace state.
func TestNewEnvelopeFields(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	hex32, hex16 := regexp.MustCompile(`^[0-9a-f]{32}$`), regexp.MustCompile(`^[0-9a-f]{16}$`)
	k := freshKey(t)
	var ids []string
	before := time.Now().Add(-time.Second)
	for range 500 {
		e, err := protocol.New(protocol.TypeEmit, k.Public(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := protocol.ParseTime(e.TS)
		if !uuid.MatchString(e.ID) || err != nil || e.TS != protocol.FormatTime(ts) || ts.Before(before) || ts.After(time.Now().Add(time.Second)) ||
			!hex32.MatchString(e.Trace.TraceID) || !hex16.MatchString(e.Trace.SpanID) || e.Trace.ParentSpanID != nil || e.Trace.OmitParent ||
			e.V != protocol.Version || e.From != k.Public() || string(e.Payload) != "{}" {
			t.Fatalf("malformed envelope: %+v", e)
		}
		ids = append(ids, e.ID)

		req := *e
		req.Trace.TraceState = "congo=t61rcWkgMzE"
		rep, err := protocol.NewReply(&req, "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A",
			map[string]any{"status": "failed", "error": map[string]any{"code": "X"}})
		if err != nil {
			t.Fatal(err)
		}
		if !uuid.MatchString(rep.ID) || rep.ID == e.ID || rep.Trace.TraceID != e.Trace.TraceID || rep.Trace.TraceState != req.Trace.TraceState ||
			!hex16.MatchString(rep.Trace.SpanID) || rep.Trace.SpanID == e.Trace.SpanID || rep.Trace.ParentSpanID == nil ||
			*rep.Trace.ParentSpanID != e.Trace.SpanID || rep.InReplyTo != e.ID || rep.To != k.Public() || rep.Type != protocol.TypeRespond {
			t.Fatalf("reply does not continue %+v: %+v", e, rep)
		}
		if got := fmt.Sprint(rep.Extra["error"]); got != "map[code:X]" {
			t.Fatalf("the respond's error is not mirrored: %v", rep.Extra)
		}
		ids = append(ids, rep.ID)
	}
	if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Error("ids are not unique and in creation order")
	}
}

// A decoded envelope is read from several goroutines (the handler, the
// call's bookkeeping, the activity tap): its payload parse is made once,
// on first use, and every reader sees the same payload (run with -race).
func TestPayloadViewConcurrent(t *testing.T) {
	k := seedKey(t)
	e := fixedEnvelope(t, k.Public(), "")
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	wire, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	d, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := protocol.ParseJSON(d.Payload)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			v, err := d.PayloadView()
			if err != nil || !reflect.DeepEqual(v, want) {
				t.Errorf("PayloadView = %v, %v", v, err)
			}
			c, err := d.PayloadValue()
			if err != nil || !reflect.DeepEqual(c, want) {
				t.Errorf("PayloadValue = %v, %v", c, err)
			}
			c.(map[string]any)["offering"] = "changed"
			if protocol.ResponseStatus(d) != "" || protocol.IsAccepted(d) {
				t.Error("a request read as an answer")
			}
		})
	}
	wg.Wait()
}
