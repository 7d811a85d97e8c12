package protocol_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Which requesters read their answers at their own inbox (protocol 0.3 and
// later) and which on the reply subject (0.2 and anything unreadable).
func TestAnswersAtInbox(t *testing.T) {
	for v, want := range map[string]bool{
		"0.3.0": true, "0.3": true, "0.4.1": true, "1.0.0": true,
		"0.2.0": false, "0.2": false, "0.1.9": false, "": false, "x.y": false, "0": false,
	} {
		if got := protocol.AnswersAtInbox(v); got != want {
			t.Errorf("AnswersAtInbox(%q) = %v, want %v", v, got, want)
		}
	}
}

// A respond's error travels in payload.error and, mirrored, as the envelope
// member error (protocol 0.3); the member survives signing and decoding,
// and ErrorObject reads either place.
func TestErrorMirroredToTheEnvelope(t *testing.T) {
	k := freshKey(t)
	e, err := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "failed",
		"error": map[string]any{"code": "INPUT_INVALID", "message": "no", "retryable": false}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	wire, _ := e.Marshal()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(wire, &top); err != nil {
		t.Fatal(err)
	}
	if string(top["error"]) != `{"code":"INPUT_INVALID","message":"no","retryable":false}` {
		t.Fatalf("envelope member error %s", top["error"])
	}
	got, err := protocol.Decode(wire)
	if err != nil {
		t.Fatalf("the mirrored member must be signed: %v", err)
	}
	if m, _ := protocol.ErrorObject(got).(map[string]any); m["code"] != "INPUT_INVALID" {
		t.Fatalf("ErrorObject %v", protocol.ErrorObject(got))
	}

	// A 0.3 answer with the member only, and a success with neither.
	only, _ := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "failed"})
	only.Extra = map[string]any{"error": map[string]any{"code": "OFFERING_NOT_FOUND", "message": "x", "retryable": false}}
	if m, _ := protocol.ErrorObject(only).(map[string]any); m["code"] != "OFFERING_NOT_FOUND" {
		t.Fatalf("member-only ErrorObject %v", protocol.ErrorObject(only))
	}
	ok, _ := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "completed", "output": 1})
	if protocol.ErrorObject(ok) != nil {
		t.Fatal("a success carries no error")
	}
	if _, has := ok.Extra["error"]; has {
		t.Fatal("a success gets no error member")
	}
	// Requests are not mirrored: their payload is the sender's.
	req, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat", "input": 1, "error": "x"})
	if _, has := req.Extra["error"]; has {
		t.Fatal("a request's payload was mirrored")
	}
}

func TestIsAnswer(t *testing.T) {
	k := freshKey(t)
	respond, _ := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "completed"})
	req, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat"})
	late, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat"})
	late.InReplyTo = protocol.NewID()
	event, _ := protocol.New(protocol.TypeEmit, k.Public(), map[string]any{})
	event.InReplyTo = protocol.NewID()
	for name, c := range map[string]struct {
		e    *protocol.Envelope
		want bool
	}{"respond": {respond, true}, "request": {req, false}, "late answer": {late, true}, "emit": {event, false}} {
		if got := protocol.IsAnswer(c.e); got != c.want {
			t.Errorf("%s: IsAnswer = %v", name, got)
		}
	}
}

// Parse reads an accept's request id without verifying; anything else
// (another respond, a request) is not an accept, and bytes that do not
// parse are refused.
func TestParseAccept(t *testing.T) {
	k := freshKey(t)
	req, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat"})
	acc, _ := protocol.NewAccept(req, k.Public())
	done, _ := protocol.NewReply(req, k.Public(), map[string]any{"status": "completed"})
	for name, c := range map[string]struct {
		e      *protocol.Envelope
		raw    string
		accept bool
	}{"accept": {e: acc, accept: true}, "answer": {e: done}, "request": {e: req}, "garbage": {raw: `{"type":"respond"`}} {
		data := []byte(c.raw)
		if c.e != nil {
			_ = c.e.Sign(k)
			data, _ = c.e.Marshal()
			// A broken signature changes nothing: nothing is verified.
			data = []byte(strings.Replace(string(data), `"sig":"`, `"sig":"AA`, 1))
		}
		u, err := protocol.Parse(data)
		if c.e == nil {
			if err == nil {
				t.Errorf("%s: parsed", name)
			}
			continue
		}
		if err != nil || u.IsAccept() != c.accept || (c.accept && u.InReplyTo() != req.ID) {
			t.Errorf("%s: Parse = %v, %v", name, u, err)
			continue
		}
		if _, err := protocol.DefaultDecoder.Verify(u); errs.CodeOf(err) != errs.IdentityMismatch {
			t.Errorf("%s: the broken signature verified: %v", name, err)
		}
	}
}

// PayloadView is the decoder's parse of the payload while Payload holds
// the bytes it was parsed from, and a parse of whatever Payload holds once
// it is replaced.
func TestPayloadView(t *testing.T) {
	k := freshKey(t)
	e, _ := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "completed", "output": map[string]any{"n": 1.0}})
	_ = e.Sign(k)
	data, _ := e.Marshal()
	for name, decode := range map[string]func([]byte) (*protocol.Envelope, error){
		"verified": protocol.Decode, "broker-attributed": protocol.DecodeBrokerAttributed,
	} {
		got, err := decode(data)
		if err != nil {
			t.Fatal(err)
		}
		view, _ := got.PayloadView()
		fresh, _ := got.PayloadValue()
		if !reflect.DeepEqual(view, fresh) || protocol.ResponseStatus(got) != "completed" {
			t.Fatalf("%s: view %v, value %v", name, view, fresh)
		}
		got.Payload = json.RawMessage(`{"status":"failed"}`)
		if protocol.ResponseStatus(got) != "failed" {
			t.Fatalf("%s: the view outlived its payload", name)
		}
		if err := got.SetPayload(map[string]any{"status": "working"}); err != nil || protocol.ResponseStatus(got) != "working" {
			t.Fatalf("%s: the view outlived SetPayload: %v", name, err)
		}
	}
}
