package protocol

import (
	"regexp"
	"strings"
	"testing"
)

// The accept fixture's signed envelope (accept-signal.json), copied here:
// the one pinned accept on the wire, signed by the published seed.
const acceptVector = `{"v":"0.2","id":"0198c001-0000-7000-8000-00000000acc1","type":"respond","ts":"2026-07-27T15:00:00.250Z",
 "from":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP","to":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A",
 "in_reply_to":"0198c001-0000-7000-8000-00000000acc0",
 "trace":{"trace_id":"acce0000acce0000acce0000acce0000","span_id":"acce000000000001","parent_span_id":"acce000000000000"},
 "payload":{"status":"accepted"},
 "sig":"pIURFXnEkAlk6eTfV1iKxL5IH6FlAZv0X3bCEb9jE62rhR2tyFnGoILdwELMRgi8_Muymn5gp9NPG_xzGWUqCw"}`

func TestNewAccept(t *testing.T) {
	requester := newTestKey(t)
	responder := newTestKey(t)
	req, err := New(TypeRequest, requester.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	req.To = responder.Public()
	req.ContextID = "ctx-1"
	req.TaskID = "task-should-not-leak"

	acc, err := NewAccept(req, responder.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want string
	}{
		{"type", string(acc.Type), "respond"},
		{"from", acc.From, responder.Public()},
		{"to", acc.To, requester.Public()},
		{"in_reply_to", acc.InReplyTo, req.ID},
		{"task_id", acc.TaskID, ""},
		{"payload", string(acc.Payload), `{"status":"accepted"}`},
		{"trace_id", acc.Trace.TraceID, req.Trace.TraceID},
		{"parent span", deref(acc.Trace.ParentSpanID), req.Trace.SpanID},
		{"context_id", acc.ContextID, "ctx-1"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if acc.Trace.SpanID == req.Trace.SpanID || acc.ID == req.ID {
		t.Error("accept reuses the request's span or id")
	}
	if err := acc.Sign(responder); err != nil {
		t.Fatal(err)
	}
	wire, err := acc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(wire), "task_id") {
		t.Fatalf("task_id on the wire: %s", wire)
	}
	got, err := Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	if !IsAccepted(got) || ResponseStatus(got) != StatusAccepted {
		t.Fatal("decoded accept not recognised")
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestNewAcceptRefusals(t *testing.T) {
	k := newTestKey(t)
	mk := func(typ Type, payload any) *Envelope {
		e, err := New(typ, k.Public(), payload)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	noID := mk(TypeRequest, map[string]any{"offering": "chat"})
	noID.ID = ""
	for _, tc := range []struct {
		name string
		req  *Envelope
		want string
	}{
		{"nil", nil, "no request"},
		{"respond", mk(TypeRespond, map[string]any{"status": "completed"}), "only a request"},
		{"register", mk(TypeRegister, map[string]any{}), "only a request"},
		{"discover", mk(TypeDiscover, map[string]any{}), "only a request"},
		{"describe offering", mk(TypeRequest, map[string]any{"offering": "describe"}), "describe"},
		{"describe skill", mk(TypeRequest, map[string]any{"skill": "describe"}), "describe"},
		{"no id", noID, "no id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAccept(tc.req, k.Public())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestAcceptVector(t *testing.T) {
	e, err := Decode([]byte(acceptVector))
	if err != nil {
		t.Fatal(err)
	}
	if !IsAccepted(e) || e.TaskID != "" {
		t.Fatal("pinned accept not recognised")
	}
	if _, ok := QueuedAckOf(e); ok {
		t.Fatal("an accept read as a queued ack")
	}
}

func TestIsAcceptedAndStatus(t *testing.T) {
	k := newTestKey(t)
	mk := func(typ Type, payload any) *Envelope {
		e, err := New(typ, k.Public(), payload)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	broken := mk(TypeRespond, nil)
	broken.Payload = []byte(`{`)
	for _, tc := range []struct {
		name     string
		e        *Envelope
		status   string
		accepted bool
	}{
		{"accept", mk(TypeRespond, map[string]any{"status": "accepted"}), "accepted", true},
		{"completed", mk(TypeRespond, map[string]any{"status": "completed", "output": map[string]any{"status": "accepted"}}), "completed", false},
		{"working with task", mk(TypeRespond, map[string]any{"status": "working", "task_id": "t"}), "working", false},
		{"request saying accepted", mk(TypeRequest, map[string]any{"status": "accepted"}), "accepted", false},
		{"wrong case", mk(TypeRespond, map[string]any{"status": "Accepted"}), "Accepted", false},
		{"status not a string", mk(TypeRespond, map[string]any{"status": true}), "", false},
		{"string payload", mk(TypeRespond, "accepted"), "", false},
		{"empty payload", mk(TypeRespond, nil), "", false},
		{"unparseable payload", broken, "", false},
		{"nil", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ResponseStatus(tc.e); got != tc.status {
				t.Errorf("ResponseStatus = %q, want %q", got, tc.status)
			}
			if got := IsAccepted(tc.e); got != tc.accepted {
				t.Errorf("IsAccepted = %v", got)
			}
		})
	}
}

var uuidForm = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestQueuedAck(t *testing.T) {
	a, b := NewQueuedAck("held for the owner"), NewQueuedAck("")
	if !a.Queued || !uuidForm.MatchString(a.InboxID) || a.InboxID == b.InboxID || a.Text != "held for the owner" {
		t.Fatalf("%+v %+v", a, b)
	}
	wire := string(mustCanonical(a))
	if want := `{"inbox_id":"` + a.InboxID + `","queued":true,"text":"held for the owner"}`; wire != want {
		t.Fatalf("wire %s", wire)
	}

	for _, tc := range []struct {
		name string
		v    any
		want QueuedAck
		ok   bool
	}{
		{"full", map[string]any{"queued": true, "inbox_id": "i-1", "text": "x"}, QueuedAck{true, "i-1", "x"}, true},
		{"text absent", map[string]any{"queued": true, "inbox_id": "i-1"}, QueuedAck{true, "i-1", ""}, true},
		{"text not parsed", map[string]any{"queued": true, "inbox_id": "i-1", "text": 5.0}, QueuedAck{true, "i-1", ""}, true},
		{"queued as string", map[string]any{"queued": "true", "inbox_id": "i-1"}, QueuedAck{}, false},
		{"queued false", map[string]any{"queued": false, "inbox_id": "i-1"}, QueuedAck{}, false},
		{"queued absent", map[string]any{"inbox_id": "i-1"}, QueuedAck{}, false},
		{"empty inbox_id", map[string]any{"queued": true, "inbox_id": ""}, QueuedAck{}, false},
		{"numeric inbox_id", map[string]any{"queued": true, "inbox_id": 1.0}, QueuedAck{}, false},
		{"status accepted", map[string]any{"status": "accepted"}, QueuedAck{}, false},
		{"not an object", "queued", QueuedAck{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseQueuedAck(tc.v)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("got %+v %v", got, ok)
			}
		})
	}

	k := newTestKey(t)
	for _, tc := range []struct {
		name    string
		typ     Type
		payload any
		ok      bool
	}{
		{"at payload.output", TypeRespond, map[string]any{"status": "completed", "output": a}, true},
		{"as the payload", TypeRespond, a, true},
		{"not on a request", TypeRequest, map[string]any{"output": a}, false},
		{"plain completion", TypeRespond, map[string]any{"status": "completed", "output": "done"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.typ, k.Public(), tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := QueuedAckOf(e)
			if ok != tc.ok || (ok && got != a) {
				t.Fatalf("got %+v %v", got, ok)
			}
			if IsAccepted(e) {
				t.Fatal("queued ack read as an accept")
			}
		})
	}
	if _, ok := QueuedAckOf(nil); ok {
		t.Fatal("nil envelope")
	}
}
