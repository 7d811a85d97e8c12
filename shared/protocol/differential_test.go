package protocol

// Differential tests of the single-pass decoder (decode.go, jcsraw.go)
// against the map-based one it replaced (reference_test.go): on the
// conformance fixtures, the golden envelope, generated envelopes signed and
// written loosely (any member order, white space, escapes, number forms),
// and mutations of all of them, both must accept and refuse the same bytes
// with the same error, check the signature over the same bytes and decode
// the same fields.

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// diffSeed is the published test seed the fixtures sign with.
const diffSeed = "SUAEGDPNTWXACIF45CA23BUY36RIMWZXW5LEHSEOK2ONS5JWJ7PBC2EWBA"

func diffKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.FromSeed[keys.AgentRole]([]byte(diffSeed))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sameErr fails unless a and b are both nil or carry the same text (which
// includes the code).
func sameErr(t testing.TB, what string, data []byte, want, got error) {
	t.Helper()
	if (want == nil) != (got == nil) || (want != nil && (want.Error() != got.Error() || errs.CodeOf(want) != errs.CodeOf(got))) {
		t.Fatalf("%s differs on %q:\n reference %v\n walker    %v", what, short(data), want, got)
	}
}

// fieldsOf is what a decoded envelope says, comparable.
type fields struct {
	V, ID, TS, From, To, TaskID, InReplyTo, ContextID, Sig string
	Type                                                   Type
	TraceID, SpanID, TraceState                            string
	Parent                                                 *string
	OmitParent                                             bool
	Budget                                                 *Budget
	Extra                                                  map[string]any
	Raw                                                    []byte
}

func fieldsOf(e *Envelope) fields {
	return fields{V: e.V, ID: e.ID, TS: e.TS, From: e.From, To: e.To, TaskID: e.TaskID, InReplyTo: e.InReplyTo,
		ContextID: e.ContextID, Sig: e.Sig, Type: e.Type, TraceID: e.Trace.TraceID, SpanID: e.Trace.SpanID,
		TraceState: e.Trace.TraceState, Parent: e.Trace.ParentSpanID, OmitParent: e.Trace.OmitParent,
		Budget: e.Budget, Extra: e.Extra, Raw: e.raw}
}

func sameFields(t testing.TB, data []byte, want, got *Envelope) {
	t.Helper()
	if !reflect.DeepEqual(fieldsOf(want), fieldsOf(got)) {
		t.Fatalf("decoded fields differ on %q:\n reference %+v\n walker    %+v", short(data), fieldsOf(want), fieldsOf(got))
	}
}

// checkDecode holds every entry point of the walker to the reference on
// data.
func checkDecode(t testing.TB, data []byte) {
	t.Helper()
	// The JSON layer alone.
	v, perr := ParseJSON(data)
	var want []byte
	if perr == nil {
		var err error
		if want, err = Canonical(v); err != nil {
			t.Fatalf("parsed value does not canonicalise: %v", err)
		}
	}
	got, cerr := AppendCanonicalJSON([]byte("x"), data)
	sameErr(t, "JSON", data, perr, cerr)
	if perr == nil && string(got) != "x"+string(want) {
		t.Fatalf("canonical bytes differ on %q:\n reference %s\n walker    %s", short(data), want, got[1:])
	}

	// Steps 1 and 2.
	ru, rerr := refParse(data)
	u, err := Parse(data)
	sameErr(t, "Parse", data, rerr, err)
	if err == nil {
		sameFields(t, data, ru.e, u.e)
		if ru.IsAccept() != u.IsAccept() || ru.e.From != u.From() || ru.e.ID != u.ID() || ru.e.InReplyTo != u.InReplyTo() ||
			ru.e.TS != u.TS() || ru.e.To != u.To() || IsAnswer(ru.e) != u.IsAnswer() {
			t.Fatalf("unverified claims differ on %q", short(data))
		}
		// Step 3, with both readings of untagged signatures. Each side
		// gets a fresh parse: Verify is called once per Unverified.
		for _, d := range []*Decoder{{}, {RefuseUntagged: true}} {
			ru, _ := refParse(data)
			u, _ := Parse(data)
			re, msg, rerr := d.refVerify(ru)
			e, err := d.Verify(u)
			sameErr(t, "Verify", data, rerr, err)
			if msg != nil && !bytes.Equal(msg, u.msg) {
				t.Fatalf("signed bytes differ on %q:\n reference %s\n walker    %s", short(data), msg, u.msg)
			}
			if err == nil {
				sameFields(t, data, re, e)
				if !bytes.Equal(re.Payload, e.Payload) || !bytes.Equal(re.Meta, e.Meta) || (re.Meta == nil) != (e.Meta == nil) {
					t.Fatalf("payload or meta differ on %q:\n reference %s %s\n walker    %s %s", short(data), re.Payload, re.Meta, e.Payload, e.Meta)
				}
				view, verr := e.PayloadView()
				wantView, _ := ParseJSON(re.Payload)
				if verr != nil || !reflect.DeepEqual(view, wantView) {
					t.Fatalf("payload view differs on %q: %v (%v)", short(data), view, verr)
				}
				if again, _ := e.PayloadView(); !reflect.DeepEqual(again, view) {
					t.Fatalf("second payload view differs on %q", short(data))
				}
				if ro, wo := refErrorObject(re), ErrorObject(e); !reflect.DeepEqual(ro, wo) {
					t.Fatalf("error object differs on %q: %v, %v", short(data), ro, wo)
				}
				checkPayloadReaders(t, data, e)
			}
		}
	}

	// The broker-attributed reading.
	rb, rerr := refDecodeBrokerAttributed(data)
	b, err := DecodeBrokerAttributed(data)
	sameErr(t, "DecodeBrokerAttributed", data, rerr, err)
	if err == nil {
		sameFields(t, data, rb, b)
		if !bytes.Equal(rb.Payload, b.Payload) || !bytes.Equal(rb.Meta, b.Meta) || (rb.Meta == nil) != (b.Meta == nil) {
			t.Fatalf("broker payload or meta differ on %q:\n reference %s %s\n walker    %s %s", short(data), rb.Payload, rb.Meta, b.Payload, b.Meta)
		}
		checkPayloadReaders(t, data, b)
	}
}

// short keeps a failure message readable.
func short(b []byte) []byte {
	if len(b) > 400 {
		return append(b[:400:400], "..."...)
	}
	return b
}

// checkPayloadReaders holds the readers that use a decoded envelope's
// canonical payload (or its kept parse) to what parsing the payload says,
// and checks that a PayloadValue is the caller's own to modify.
func checkPayloadReaders(t testing.TB, data []byte, e *Envelope) {
	t.Helper()
	v, err := ParseJSON(e.Payload)
	if err != nil {
		t.Fatalf("decoded payload %s does not parse: %v", e.Payload, err)
	}
	m, isObj := v.(map[string]any)
	status, _ := m["status"].(string)
	if got := ResponseStatus(e); got != status {
		t.Fatalf("ResponseStatus %q, the payload says %q, on %q", got, status, short(data))
	}
	wantAck, wantOK := QueuedAck{}, false
	if e.Type == TypeRespond {
		if wantAck, wantOK = ParseQueuedAck(m["output"]); !wantOK {
			wantAck, wantOK = ParseQueuedAck(v)
		}
	}
	if ack, ok := QueuedAckOf(e); ok != wantOK || ack != wantAck {
		t.Fatalf("QueuedAckOf %v %v, the payload says %v %v, on %q", ack, ok, wantAck, wantOK, short(data))
	}
	if got, want := isDescribe(e), isObj && OfferingOf(m) == OfferingDescribe; got != want {
		t.Fatalf("isDescribe %v, the payload says %v, on %q", got, want, short(data))
	}
	// HandlerInput: payload.input of a request, the payload otherwise, the
	// caller's own.
	var wantIn any = v
	var wantErr error
	if e.Type == TypeRequest {
		if isObj {
			wantIn = m["input"]
		} else {
			wantIn, wantErr = nil, errs.New(errs.InvalidEnvelope, "a request payload must be an object {offering, input, config?}")
		}
	}
	in, err := HandlerInput(e)
	sameErr(t, "HandlerInput", data, wantErr, err)
	if !reflect.DeepEqual(in, wantIn) {
		t.Fatalf("HandlerInput %v, the payload says %v, on %q", in, wantIn, short(data))
	}
	scribble(in)
	// A PayloadValue is a fresh tree: changing it changes neither the
	// kept parse nor the next PayloadValue.
	pv, err := e.PayloadValue()
	if err != nil || !reflect.DeepEqual(pv, v) {
		t.Fatalf("PayloadValue %v (%v), the payload says %v", pv, err, v)
	}
	scribble(pv)
	if view, _ := e.PayloadView(); !reflect.DeepEqual(view, v) {
		t.Fatalf("changing a PayloadValue changed the kept parse: %v", view)
	}
	if again, _ := e.PayloadValue(); !reflect.DeepEqual(again, v) {
		t.Fatalf("changing a PayloadValue changed the next one: %v", again)
	}
}

// scribble changes every object and array of v in place.
func scribble(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			scribble(e)
			x[k] = "scribbled"
		}
		x["scribbled"] = true
	case []any:
		for i, e := range x {
			scribble(e)
			x[i] = "scribbled"
		}
	}
}

// refErrorObject is ErrorObject as it was.
func refErrorObject(e *Envelope) any {
	if v, ok := refMirroredError(e.Payload); ok {
		return v
	}
	if v, ok := e.Extra["error"]; ok && v != nil {
		return v
	}
	return nil
}

// diffConformanceDir is where the conformance fixtures live (beside the
// repository, as the conformance runner's test finds them).
func diffConformanceDir() string {
	if d := os.Getenv("MESH_CONFORMANCE_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "conformance")
}

// corpus is every envelope-shaped input the fixtures and the golden file
// hold: each JSON object in them, canonical and written loosely, and each
// string that is JSON text.
func corpus(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	golden, err := os.ReadFile(filepath.Join("testdata", "envelope.golden"))
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, golden, bytes.TrimSpace(golden))
	files, _ := filepath.Glob(filepath.Join(diffConformanceDir(), "*.json"))
	if len(files) == 0 {
		t.Logf("no conformance fixtures at %s (set MESH_CONFORMANCE_DIR): golden and generated inputs only", diffConformanceDir())
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
		v, err := ParseJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case map[string]any:
				c, _ := Canonical(x)
				out = append(out, c, looseJSON(r, x))
				for _, e := range x {
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			case string:
				if strings.HasPrefix(strings.TrimSpace(x), "{") {
					out = append(out, []byte(x))
				}
			}
		}
		walk(v)
	}
	return out
}

func TestDecodeMatchesReferenceOnFixtures(t *testing.T) {
	inputs := corpus(t)
	verified := 0
	for _, in := range inputs {
		checkDecode(t, in)
		if _, err := Decode(in); err == nil {
			verified++
		}
	}
	t.Logf("%d inputs, %d verified envelopes", len(inputs), verified)
	if verified == 0 {
		t.Fatal("no input verified: the comparison never reached the signature")
	}
}

func TestDecodeMatchesReferenceOnGenerated(t *testing.T) {
	k := diffKey(t)
	r := rand.New(rand.NewPCG(7, 11))
	n := 3000
	if testing.Short() {
		n = 300
	}
	verified := 0
	for range n {
		in := genWire(r, k)
		checkDecode(t, in)
		if _, err := Decode(in); err == nil {
			verified++
		}
		for range 3 {
			checkDecode(t, mutate(r, in))
		}
	}
	t.Logf("%d generated envelopes verified", verified)
	if verified < n/4 {
		t.Fatalf("only %d of %d generated envelopes verified: the generator is off", verified, n)
	}
}

func TestDecodeMatchesReferenceOnMutatedFixtures(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, in := range corpus(t) {
		for range 20 {
			checkDecode(t, mutate(r, in))
		}
	}
}

// FuzzDecodeDifferential holds the walker to the reference on any input.
func FuzzDecodeDifferential(f *testing.F) {
	for _, in := range corpus(f) {
		f.Add(in)
	}
	k := diffKey(f)
	r := rand.New(rand.NewPCG(13, 17))
	for range 50 {
		f.Add(genWire(r, k))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecode(t, data) })
}

// FuzzCanonicalErrorMember holds the scanner of a respond's error member to
// encoding/json's reading of it.
func FuzzCanonicalErrorMember(f *testing.F) {
	for _, s := range []string{`{"error":{"code":"X"}}`, `{"ERROR":1,"error":null}`, `{"Error":[1],"eRRor":"x"}`,
		`{"status":"failed","error":null}`, `[1]`, `"error"`, `{"a":{"error":1}}`, `{"\u0065rror":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := AppendCanonicalJSON(nil, data)
		if err != nil {
			return
		}
		rv, rok := refMirroredError(c)
		v, ok := canonError(c)
		if rok != ok || !reflect.DeepEqual(rv, v) {
			t.Fatalf("error member of %s: reference %v %v, scanner %v %v", c, rv, rok, v, ok)
		}
	})
}

func TestCanonicalErrorMember(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 34))
	names := []string{"error", "Error", "ERROR", "eRrOr", "errors", "err", "status"}
	for range 2000 {
		m := map[string]any{}
		for range r.IntN(4) {
			var v any = genValue(r, 2)
			if r.IntN(4) == 0 {
				v = nil
			}
			m[names[r.IntN(len(names))]] = v
		}
		c, _ := Canonical(m)
		rv, rok := refMirroredError(c)
		v, ok := canonError(c)
		if rok != ok || !reflect.DeepEqual(rv, v) {
			t.Fatalf("error member of %s: reference %v %v, scanner %v %v", c, rv, rok, v, ok)
		}
	}
}

// --- generation ---

// genWire is a random envelope, usually signed (tagged or not) by k over
// its canonical form, written loosely.
func genWire(r *rand.Rand, k *keys.Agent) []byte {
	m := genEnvelope(r, k.Public())
	delete(m, "sig")
	switch r.IntN(10) {
	case 0: // unsigned
	case 1: // a signature that is not base64url or not 64 bytes
		m["sig"] = pick(r, "", "!!", strings.Repeat("A", 86), strings.Repeat("A", 85), 7.0, nil,
			base64.RawURLEncoding.EncodeToString(make([]byte, 64))+"\n", base64.StdEncoding.EncodeToString(make([]byte, 64)))
	default:
		msg, err := refAppendEnvelopeMapBytes(m)
		if err == nil {
			if r.IntN(5) == 0 {
				msg = msg[len(TagEnvelope)+1:] // the untagged form
			}
			sig := base64.RawURLEncoding.EncodeToString(k.Sign(msg))
			if r.IntN(20) == 0 {
				sig = sig[:40] + "\n" + sig[40:] // the decoder ignores line feeds
			}
			m["sig"] = sig
		}
	}
	return looseJSON(r, m)
}

func refAppendEnvelopeMapBytes(m map[string]any) ([]byte, error) {
	msg := append([]byte(TagEnvelope), '\n')
	msg, _, err := refAppendEnvelopeMap(msg, m)
	return msg, err
}

func pick(r *rand.Rand, vs ...any) any { return vs[r.IntN(len(vs))] }

// sometimes replaces a well-formed member value with a malformed one.
func sometimes(r *rand.Rand, good any) any {
	if r.IntN(25) != 0 {
		return good
	}
	return pick(r, nil, "", 1.5, true, []any{}, map[string]any{}, "x")
}

func genEnvelope(r *rand.Rand, from string) map[string]any {
	if r.IntN(2) == 0 {
		return genCleanEnvelope(r, from)
	}
	m := map[string]any{
		"v":    sometimes(r, pick(r, Version, Version, "0.2", "0.3", "1.0.0", "x.1", "+0.1", "00.3")),
		"id":   sometimes(r, pick(r, "019894f0-0000-7000-8000-0000000000aa", strings.Repeat("7", MaxIDBytes), strings.Repeat("8", MaxIDBytes+1), genString(r))),
		"type": sometimes(r, pick(r, "request", "respond", "respond", "emit", "register", "discover", "subscribe", "reply")),
		"ts":   sometimes(r, "2026-07-26T12:00:00.000Z"),
		"from": sometimes(r, pick(r, from, from, from, "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A", "U123")),
	}
	for _, name := range []string{"to", "task_id", "in_reply_to", "context_id"} {
		if r.IntN(2) == 0 {
			m[name] = sometimes(r, pick(r, "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A", genString(r), "", nil, strings.Repeat("9", MaxIDBytes+1)))
		}
	}
	trace := map[string]any{
		"trace_id": sometimes(r, "4bf92f3577b34da6a3ce929d0e0e4736"),
		"span_id":  sometimes(r, pick(r, "b7d9b7d9b7d9b7d9", genString(r))),
	}
	switch r.IntN(4) {
	case 0:
		trace["parent_span_id"] = nil
	case 1:
		trace["parent_span_id"] = sometimes(r, pick(r, "00f067aa0ba902b7", genString(r)))
	case 2: // absent
	case 3:
		trace["parent_span_id"] = pick(r, 1.0, []any{}, false)
	}
	if r.IntN(4) == 0 {
		trace["tracestate"] = sometimes(r, pick(r, "congo=t61rcWkgMzE", genString(r), nil))
	}
	if r.IntN(6) == 0 {
		trace[genString(r)] = genValue(r, 2)
	}
	m["trace"] = sometimes(r, trace)
	if r.IntN(30) != 0 {
		m["payload"] = genPayload(r)
	}
	if r.IntN(3) == 0 {
		m["budget"] = genBudget(r)
	}
	if r.IntN(4) == 0 {
		m["meta"] = sometimes(r, pick(r, nil, map[string]any{"hops": 1.0}, map[string]any{}, genValue(r, 3)))
	}
	for range r.IntN(3) {
		if r.IntN(3) == 0 {
			m[pick(r, "error", "artifacts", "zz", "\U0001F600", "\uFB00", "a\u0000b", "sig2").(string)] = genValue(r, 3)
		}
	}
	return m
}

// genCleanEnvelope is an envelope every member of which is well formed,
// so that, signed, it verifies.
func genCleanEnvelope(r *rand.Rand, from string) map[string]any {
	m := map[string]any{
		"v": pick(r, Version, "0.2", "0.3"), "id": pick(r, "019894f0-0000-7000-8000-0000000000aa", genString(r)+"x"),
		"type": pick(r, "request", "respond", "emit", "register", "discover", "subscribe"),
		"ts":   "2026-07-26T12:00:00.000Z", "from": from,
		"trace":   map[string]any{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": genString(r) + "s"},
		"payload": genPayload(r),
	}
	tr := m["trace"].(map[string]any)
	switch r.IntN(3) {
	case 0:
		tr["parent_span_id"] = nil
	case 1:
		tr["parent_span_id"] = genString(r)
	}
	if r.IntN(3) == 0 {
		tr["tracestate"] = genString(r)
	}
	for _, name := range []string{"to", "task_id", "in_reply_to", "context_id"} {
		switch r.IntN(3) {
		case 0:
			m[name] = genString(r)
		case 1:
			m[name] = nil
		}
	}
	if r.IntN(2) == 0 {
		b := map[string]any{"revision": float64(r.IntN(5))}
		if r.IntN(2) == 0 {
			b["deadline"] = pick(r, "2026-07-26T13:00:00Z", "2026-07-27T11:00:00-05:00")
		}
		if _, ok := b["deadline"]; !ok || r.IntN(2) == 0 {
			b["cost_ceiling"] = map[string]any{"amount_micro": float64(r.IntN(1e7)), "currency": pick(r, "USD", "EUR")}
		}
		m["budget"] = pick(r, b, b, nil)
	}
	if r.IntN(3) == 0 {
		m["meta"] = pick(r, nil, map[string]any{"hops": float64(r.IntN(5))}, map[string]any{genKey(r): genValue(r, 2)})
	}
	if r.IntN(3) == 0 {
		m[pick(r, "error", "artifacts", "zz", "\U0001F600", "\uFB00", "a\u0000b").(string)] = genValue(r, 3)
	}
	return m
}

func genPayload(r *rand.Rand) any {
	switch r.IntN(6) {
	case 0:
		return genValue(r, 4)
	case 1:
		return map[string]any{"status": "accepted"}
	case 2:
		return map[string]any{"status": pick(r, "completed", "failed", "accepted", 1.0), "output": genValue(r, 3),
			pick(r, "error", "Error", "ERROR").(string): pick(r, nil, map[string]any{"code": "X", "message": genString(r)}, genValue(r, 2))}
	case 3:
		ack := map[string]any{"queued": pick(r, true, true, "true", false, nil), "inbox_id": pick(r, "0198-x", "", 1.0, nil), "text": pick(r, "held", 2.0, nil)}
		if r.IntN(3) == 0 {
			delete(ack, pick(r, "queued", "inbox_id", "text").(string))
		}
		if r.IntN(2) == 0 {
			return map[string]any{"status": "completed", "output": pick(r, ack, ack, "x", nil)}
		}
		return ack
	default:
		p := map[string]any{"offering": pick(r, "echo", "describe", "", 5.0, nil), "input": genValue(r, 3)}
		if r.IntN(3) == 0 {
			p["skill"] = pick(r, "describe", "echo", 1.0)
		}
		if r.IntN(5) == 0 {
			delete(p, "offering")
		}
		if r.IntN(4) == 0 {
			p["status"] = pick(r, "completed", "working", "weird\u0000", "exhausted", "c\"x")
		}
		return p
	}
}

func genBudget(r *rand.Rand) any {
	b := map[string]any{}
	if r.IntN(10) != 0 {
		b["revision"] = pick(r, 0.0, 3.0, 1.5, -1.0, float64(MaxSafeInteger), float64(MaxSafeInteger)+2, "1", nil)
	}
	if r.IntN(3) != 0 {
		b["deadline"] = pick(r, "2026-07-26T13:00:00Z", "2026-07-27T11:00:00-05:00", "2026-07-26", "", nil, 5.0, "2026-07-26T13:00:00.123456789+01:00")
	}
	if r.IntN(2) == 0 {
		c := map[string]any{}
		if r.IntN(8) != 0 {
			c["amount_micro"] = pick(r, 2000000.0, 0.0, -1.0, 0.5, 1e300, "5")
		}
		if r.IntN(8) != 0 {
			c["currency"] = pick(r, "USD", "XCR", "usd", "US", "U\u0000D", 1.0, nil)
		}
		b["cost_ceiling"] = sometimes(r, c)
	}
	if r.IntN(20) == 0 {
		return pick(r, nil, "x", []any{b}, 1.0)
	}
	return b
}

// genString favours the characters canonical JSON treats specially.
func genString(r *rand.Rand) string {
	var sb strings.Builder
	for range r.IntN(8) {
		switch r.IntN(8) {
		case 0:
			sb.WriteByte(byte(r.IntN(0x20)))
		case 1:
			sb.WriteString(pick(r, `"`, `\`, "/", "\u007f", "\u2028", "\u2029", "<", "&").(string))
		case 2:
			sb.WriteRune(rune(0x10000 + r.IntN(0x10FFFF-0x10000)))
		case 3:
			sb.WriteRune(rune(0xE000 + r.IntN(0x2000)))
		case 4:
			sb.WriteRune(rune(0x80 + r.IntN(0xD800-0x80)))
		default:
			sb.WriteByte(byte('a' + r.IntN(26)))
		}
	}
	return sb.String()
}

func genNumber(r *rand.Rand) float64 {
	switch r.IntN(8) {
	case 0:
		return float64(r.IntN(1000))
	case 1:
		return -float64(r.Int64N(1 << 53))
	case 2:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(60)-30))
	case 3:
		return pick(r, 1e21, 1e-7, 1e-6, 123456789012345678.0, 0.1, math.MaxFloat64, math.SmallestNonzeroFloat64, 5e-324, 1e15, 999999999999999.0, 1e16).(float64)
	case 4:
		return math.Float64frombits(r.Uint64()&^(0x7FF<<52) | uint64(r.IntN(0x7FF))<<52)
	default:
		return float64(r.Int64N(1<<53)) / float64(int64(1)<<r.IntN(60))
	}
}

func genValue(r *rand.Rand, depth int) any {
	n := 6
	if depth <= 0 {
		n = 4
	}
	switch r.IntN(n) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return genNumber(r)
	case 3:
		return genString(r)
	case 4:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = genValue(r, depth-1)
		}
		return a
	default:
		m := map[string]any{}
		for range r.IntN(6) {
			m[genKey(r)] = genValue(r, depth-1)
		}
		if r.IntN(10) == 0 { // a large object: duplicates are then found through a set
			for i := range smallObject + r.IntN(8) {
				m[fmt.Sprint("k", i)] = float64(i)
			}
		}
		return m
	}
}

// genKey draws names whose UTF-16 and UTF-8 orders differ.
func genKey(r *rand.Rand) string {
	return pick(r, "a", "b", "A", "status", "error", "\uFB00", "\U0001F600", "\U0001F601", "a\U0001F601", "\uFFFF", "\U00010000", "a\U0001F600", "a\uE000", "", "é", "e\u0301", "\u0000", "k1", genString(r)).(string)
}

// --- loose writing ---

// looseJSON writes v as valid JSON that is as far from canonical as the
// grammar allows: members in random order, random white space, random
// escapes, numbers in other forms.
func looseJSON(r *rand.Rand, v any) []byte {
	var b []byte
	b = looseValue(r, b, v)
	return append(b, ws(r)...)
}

func ws(r *rand.Rand) string {
	if r.IntN(3) != 0 {
		return ""
	}
	return pick(r, " ", "\n", "\t", "\r\n  ").(string)
}

func looseValue(r *rand.Rand, b []byte, v any) []byte {
	b = append(b, ws(r)...)
	switch x := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, x)
	case float64:
		return looseNumber(r, b, x)
	case string:
		return looseString(r, b, x)
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ws(r)...)
				b = append(b, ',')
			}
			b = looseValue(r, b, e)
		}
		b = append(b, ws(r)...)
		return append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, ws(r)...)
			b = looseString(r, b, k)
			b = append(b, ws(r)...)
			b = append(b, ':')
			b = looseValue(r, b, x[k])
		}
		b = append(b, ws(r)...)
		return append(b, '}')
	}
	panic(fmt.Sprintf("looseValue: %T", v))
}

func looseNumber(r *rand.Rand, b []byte, f float64) []byte {
	switch r.IntN(5) {
	case 0:
		return strconv.AppendFloat(b, f, 'e', -1, 64)
	case 1:
		return strconv.AppendFloat(b, f, 'E', 20, 64)
	case 2:
		if f == math.Trunc(f) && math.Abs(f) < 1e20 {
			b = strconv.AppendFloat(b, f, 'f', -1, 64)
			return append(b, ".000"...)
		}
	case 3:
		if f == 0 {
			return append(b, "-0"...)
		}
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

func looseString(r *rand.Rand, b []byte, s string) []byte {
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', byte(c))
		case c < 0x20:
			if r.IntN(2) == 0 {
				b = fmt.Appendf(b, `\u%04X`, c)
			} else {
				b = fmt.Appendf(b, `\u%04x`, c)
			}
		case r.IntN(6) == 0 && c >= 0x10000:
			hi, lo := 0xD800+((c-0x10000)>>10), 0xDC00+((c-0x10000)&0x3FF)
			b = fmt.Appendf(b, `\u%04x\u%04X`, hi, lo)
		case r.IntN(8) == 0 && c < 0x10000:
			b = fmt.Appendf(b, `\u%04x`, c)
		case c == '/' && r.IntN(2) == 0:
			b = append(b, '\\', '/')
		default:
			b = utf8.AppendRune(b, c)
		}
	}
	return append(b, '"')
}

// mutate damages in the ways a hostile or broken sender would: a flipped
// or dropped byte, a duplicated member, a cut, an inserted escape or a
// non-UTF-8 byte.
func mutate(r *rand.Rand, in []byte) []byte {
	out := bytes.Clone(in)
	if len(out) == 0 {
		return []byte("{")
	}
	i := r.IntN(len(out))
	switch r.IntN(9) {
	case 0:
		out[i] ^= byte(1 << r.IntN(8))
	case 1:
		out = append(out[:i], out[i+1:]...)
	case 2:
		out = out[:i]
	case 3:
		out = append(out[:i], append([]byte(pick(r, `\u`, `\ud800`, `\udc00`, "\xff", "\xc3", `"`, ",", `:`, "{", "]", "\x00").(string)), out[i:]...)...)
	case 4: // duplicate the first member
		if j := bytes.IndexByte(out, ','); j > 1 && out[0] == '{' {
			out = append([]byte("{"+string(out[1:j])+","), out[1:]...)
		}
	case 5: // a member at the front, maybe a duplicate
		name := pick(r, "v", "sig", "payload", "zz", "trace", "meta", "budget", "id").(string)
		val := pick(r, `null`, `1`, `"x"`, `{}`, `[]`, `{"revision":0,"deadline":"2026-07-26T13:00:00Z"}`).(string)
		if len(out) > 0 && out[0] == '{' {
			out = append([]byte(`{"`+name+`":`+val+`,`), out[1:]...)
		}
	case 6: // nest deeply
		depth := MaxJSONDepth - 2 + r.IntN(4)
		out = []byte(`{"v":"0.3.0","payload":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`)
	case 7: // swap a byte for another at random
		out[i] = byte(r.IntN(256))
	default: // change one character of a string member value
		if j := bytes.Index(out, []byte(`":"`)); j >= 0 && j+3 < len(out) {
			out[j+3] = byte(pick(r, 'A', 'z', '0', ' ').(int32))
		}
	}
	return out
}

// The walker alone, on the JSON grammar's corner cases.
func TestAppendCanonicalJSONMatchesParseThenCanonical(t *testing.T) {
	for _, s := range []string{
		`{"b":1,"a":[1e21,1e-7,-0,0.1,"\u2028\/"]}`, `"\ud83d\ude00"`, `{"\ufb00":1,"\ud83d\ude00":2}`,
		`9007199254740993`, `[null,true,false,{}]`, `{"a":{"b":{"c":"\u0000\u001f"}}}`, `1.7976931348623157e308`,
		`1e400`, `-1e400`, `1e-400`, `-0.0`, `0e10`, `00`, `-`, `1.`, `.5`, `1e`, `+1`, `[1,]`, `{"a":1,}`, `{"a" 1}`,
		`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `"\ud800"`, `"\udc00\ud800"`, `"\ud800\u0041"`, "\"\xff\"", "\"a\x01\"",
		`"\x"`, `"\u12"`, `"\u12G4"`, `[` + strings.Repeat("[", 63) + strings.Repeat("]", 64), `[` + strings.Repeat("[", 64) + strings.Repeat("]", 65),
		` {"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]} `, `{"é":1,"e":2,"\uFFFF":3,"\U0001F600":4}`, `tru`, `nul`, `{} x`, ``,
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15,"k16":16,"k3":3}`,
		`123456789012345`, `1234567890123456`, `-123456789012345`, `100000000000000000000000`, `0.000001`, `0.0000001`,
	} {
		checkDecode(t, []byte(s))
	}
	r := rand.New(rand.NewPCG(5, 8))
	for range 3000 {
		v := genValue(r, 5)
		in := looseJSON(r, v)
		checkDecode(t, in)
		checkDecode(t, mutate(r, in))
	}
}

// FuzzAppendCanonicalJSON: the walker accepts, refuses and writes exactly
// what ParseJSON and Canonical do.
func FuzzAppendCanonicalJSON(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 30 {
		f.Add(looseJSON(r, genValue(r, 4)))
	}
	f.Add([]byte(`{"a":1,"a":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, perr := ParseJSON(data)
		got, err := AppendCanonicalJSON(nil, data)
		sameErr(t, "JSON", data, perr, err)
		if perr == nil {
			want, _ := Canonical(v)
			if !bytes.Equal(want, got) {
				t.Fatalf("canonical bytes differ on %q:\n reference %s\n walker    %s", short(data), want, got)
			}
		}
	})
}

// BenchmarkDecodeNonCrypto is what decoding an envelope costs outside
// Ed25519: parse, structure and the canonical bytes the signature covers,
// for the walker and for the map-based reference, on the benchmarks'
// envelope.
func BenchmarkDecodeNonCrypto(b *testing.B) {
	k := diffKey(b)
	parent := "00f067aa0ba902b7"
	e := &Envelope{V: Version, ID: "019894f0-0000-7000-8000-0000000000aa", Type: TypeRequest, TS: "2026-07-26T12:00:00.000Z",
		From: k.Public(), Trace: Trace{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "b7d9b7d9b7d9b7d9", ParentSpanID: &parent},
		Budget: &Budget{Deadline: "2026-07-26T13:00:00Z", CostCeiling: &Money{AmountMicro: 2_000_000, Currency: "USD"}}}
	if err := e.SetPayload(map[string]any{"offering": "caselaw-summary",
		"input": map[string]any{"text": "Summarise the controlling case law on anticipatory repudiation."}}); err != nil {
		b.Fatal(err)
	}
	if err := e.Sign(k); err != nil {
		b.Fatal(err)
	}
	wire, err := e.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("walker", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(wire); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			u, err := refParse(wire)
			if err != nil {
				b.Fatal(err)
			}
			msg := append([]byte(TagEnvelope), '\n')
			msg, spans, _ := refAppendEnvelopeMap(msg, u.m)
			u.e.Payload = append([]byte(nil), msg[spans.payload[0]:spans.payload[1]]...)
		}
	})
}

// TestFrameMatchesReference holds Fence and FrameText to the versions they
// replaced, on text full of what fencing rewrites.
func TestFrameMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	parts := []string{"a", "hello", "-", "--", "---", "=", "===", "\r", "\n", "\r\n", "\t", "\x00", "\x7f", "\u0085",
		"\u2028", "\u2029", "\xff", "\xc2", "é", "\U0001F600", " ", "--- BEGIN SENDER MESSAGE ---"}
	for range 20000 {
		var sb strings.Builder
		for range r.IntN(10) {
			sb.WriteString(parts[r.IntN(len(parts))])
		}
		text := sb.String()
		if got, want := Fence(text), refFence(text); got != want {
			t.Fatalf("Fence(%q) = %q, was %q", text, got, want)
		}
		p := Provenance{From: "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP",
			ReceivedAt: time.Unix(r.Int64N(1<<34), r.Int64N(1e9)).In(time.FixedZone("x", 3600)),
			TraceID:    pick(r, "", "4bf92f3577b34da6a3ce929d0e0e4736", "abc").(string),
			Handle:     pick(r, "", "alice.example").(string), Operator: pick(r, "", "Acme").(string)}
		if got, want := FrameText(text, p), refFrameText(text, p); got != want {
			t.Fatalf("FrameText(%q, %+v) =\n%s\nwas\n%s", text, p, got, want)
		}
	}
}
