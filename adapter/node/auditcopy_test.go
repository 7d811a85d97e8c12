package node

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/protocol"
)

// The outbox copy of the answer that ends a request, and only that one,
// states the request's offering, input digest and duration in its audit
// headers (docs/audit.md "Where rows come from"): a bare answer, a
// refusal, a task's terminal update; not an accept, a task's working
// answer or progress, nor a stream chunk.
func TestOutboxCopyAuditHeaders(t *testing.T) {
	p, _ := newWorkerPair(t, nil)
	out := p.tm.collect(t, protocol.OutboxSubject(p.b.ID()))
	final := func(m *nats.Msg) bool { return m.Header.Get(protocol.HdrAuditInput) != "" }

	for _, c := range []struct {
		offering string
		input    any
		copies   int    // outbox copies of the call
		status   string // of the one final copy
	}{
		{"echo", map[string]any{"text": "hello"}, 1, "completed"},
		{"nothing-here", "x", 1, "failed"},
		// submitted, working, the working answer, progress, completed
		{"task", nil, 5, "completed"},
		// submitted, working, the working answer, three chunks, the
		// final chunk (completed), the completed update
		{"stream", []any{1, 2}, 8, "completed"},
	} {
		t.Run(c.offering, func(t *testing.T) {
			before := out.len()
			req := requestEnv(t, p.kA, p.b.ID(), c.offering, c.input)
			raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), req)
			eventually(t, "the answer", func() bool { return raw.len() >= 1 })
			eventually(t, "the outbox copies", func() bool { return out.len() == before+c.copies })
			out.mu.Lock()
			msgs := append([]*nats.Msg(nil), out.msgs[before:]...)
			out.mu.Unlock()
			var finals []*nats.Msg
			for _, m := range msgs {
				if final(m) {
					finals = append(finals, m)
				} else if len(m.Header) != 0 {
					t.Errorf("a copy that does not end the request has headers %v", m.Header)
				}
			}
			if len(finals) != 1 {
				t.Fatalf("%d of %d copies state the end of the request", len(finals), len(msgs))
			}
			h := finals[0].Header
			env, err := protocol.Decode(finals[0].Data)
			if err != nil {
				t.Fatal(err)
			}
			if env.InReplyTo != req.ID || protocol.ResponseStatus(env) != c.status {
				t.Fatalf("the final copy answers %s with %s", env.InReplyTo, protocol.ResponseStatus(env))
			}
			if h.Get(protocol.HdrAuditInput) != protocol.InputSHA256(req) || h.Get(protocol.HdrAuditOffering) != c.offering {
				t.Fatalf("headers %v", h)
			}
			if ms, err := strconv.ParseInt(h.Get(protocol.HdrAuditDuration), 10, 64); err != nil || ms < 0 {
				t.Fatalf("duration %q", h.Get(protocol.HdrAuditDuration))
			}
		})
	}
}
