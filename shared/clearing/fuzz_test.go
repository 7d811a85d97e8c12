package clearing

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzCandidate: whatever an outbox copy and its headers hold, the tap
// either drops it or takes a completed answer from the subject's agent to
// an agent, naming the request it answers and an offering; it never panics.
func FuzzCandidate(f *testing.F) {
	seller, _ := keys.Generate[keys.AgentRole]()
	buyer, _ := keys.Generate[keys.AgentRole]()
	req, _ := protocol.New(protocol.TypeRequest, buyer.Public(), map[string]any{"input": "x"})
	rep, _ := protocol.NewReply(req, seller.Public(), map[string]any{"status": "completed", "output": "y"})
	rep.To = buyer.Public()
	_ = rep.Sign(seller)
	good, _ := rep.Marshal()
	subject := protocol.OutboxSubject(seller.Public())
	f.Add(subject, good, "chat", "abc")
	f.Add(subject, []byte(`{}`), "chat", "abc")
	f.Add("mesh.agent.x.outbox", good, "", "")
	f.Fuzz(func(t *testing.T, subject string, data []byte, offering, input string) {
		hdr := nats.Header{}
		if input != "" {
			hdr.Set(protocol.HdrAuditInput, input)
		}
		if offering != "" {
			hdr.Set(protocol.HdrAuditOffering, offering)
		}
		c, ok := candidateOf(subject, data, hdr, time.Now())
		if !ok {
			return
		}
		if c.offering == "" || c.env.InReplyTo == "" || !keys.IsUserPublicKey(c.env.To) ||
			subject != protocol.OutboxSubject(c.env.From) || protocol.ResponseStatus(c.env) != "completed" {
			t.Fatalf("took %q %+v", subject, c.env)
		}
		if tok := KeyToken(c.env.InReplyTo); !tokenShape.MatchString(tok) || strings.ContainsAny(tok, ".*> ") {
			t.Fatalf("token %q", tok)
		}
	})
}
