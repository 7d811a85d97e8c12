package activity

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzAuditEntries feeds arbitrary statements (the audit headers an agent
// sets on its outbox) and answer members to the rows' builder: whatever
// they say, every entry it makes is one the chains accept, so no append
// fails on what an agent stated, and no statement breaks the tap.
func FuzzAuditEntries(f *testing.F) {
	responder, requester := bustest.Agent(f).Public(), bustest.Agent(f).Public()
	f.Add(audit.InputDigest([]byte("x")), "chat", "1520", "req-1", requester, "task-1", `{"status":"completed"}`, "2026-03-04T10:11:12.345Z")
	f.Add("not-a-digest", "chat\x00", "-4", "req\n2", "UNOTANAGENT", "", `{"status":"failed","error":{"code":"nope lower"}}`, "yesterday")
	f.Add(audit.InputDigest(nil), string(make([]byte, 300)), "99999999999999999999", "r", "x", "t", `{"status":"`+string(make([]byte, 100))+`"}`, "2026-03-04T10:11:12Z")
	f.Fuzz(func(t *testing.T, input, offering, duration, inReplyTo, to, taskID, payload, ts string) {
		env := &protocol.Envelope{V: "0.3", ID: "id", Type: protocol.TypeRespond, TS: ts, From: responder, To: to,
			InReplyTo: inReplyTo, TaskID: taskID, Payload: []byte(payload)}
		hdr := nats.Header{}
		hdr.Set(protocol.HdrAuditInput, input)
		hdr.Set(protocol.HdrAuditOffering, offering)
		hdr.Set(protocol.HdrAuditDuration, duration)
		for _, e := range auditEntries(env, hdr) {
			if err := e.Check(); errors.Is(err, audit.ErrInvalidEntry) || err != nil {
				t.Fatalf("entry %+v: %v", e, err)
			}
			if e.Key == "" || (e.Agent != responder && e.Agent != to) {
				t.Fatalf("entry %+v", e)
			}
		}
	})
}
