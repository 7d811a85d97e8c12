package node

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// sizer answers "big" with an output over the transport's 1 MiB maximum
// payload and "echo" with its input; it reports what its answer returned.
type sizer struct{ replyErrs chan error }

func newSizer() *sizer { return &sizer{replyErrs: make(chan error, 8)} }

func (s *sizer) handle(ctx context.Context, c *Call) error {
	var err error
	switch c.Offering {
	case "big":
		err = c.Reply(map[string]any{"text": strings.Repeat("x", 2<<20)})
	default:
		err = c.Reply(map[string]any{"echo": c.RawInput()})
	}
	s.replyErrs <- err
	return err
}

// An answer too large to publish is replaced by a CONTEXT_TOO_LARGE
// failure: the caller gets a terminal answer after the accept, not a
// timeout (M3, live).
func TestOversizeAnswerIsAFailureNotATimeout(t *testing.T) {
	tm := newMesh(t)
	s := newSizer()
	p := newPair(t, tm, AgentConfig{Name: "big", Handler: s.handle}, nil)
	res, err := p.a.Request(t.Context(), p.kB.Public(), "big", "hi", RequestOptions{Timeout: asyncWait})
	mustCode(t, err, errs.ContextTooLarge)
	if res == nil || !res.Accepted || res.Status != "failed" || res.From != p.kB.Public() || res.Error.Details["limit"] != "transport_max_payload" {
		t.Fatalf("result %+v", res)
	}
	// The handler was told its answer did not go out.
	if err := <-s.replyErrs; codeOf(err) != errs.ContextTooLarge {
		t.Fatalf("Reply returned %v", err)
	}
	// The agent still answers what fits.
	if res, err := p.a.Request(t.Context(), p.kB.Public(), "echo", "hi", RequestOptions{Timeout: asyncWait}); err != nil || res.Status != "completed" {
		t.Fatalf("%+v %v", res, err)
	}
}

// A drained request whose answer could not be published is neither
// journaled nor acknowledged: it stays in the mailbox for redelivery. One
// whose answer is too large gets the CONTEXT_TOO_LARGE failure at the
// sender's inbox and is acknowledged (M3, drained).
func TestDrainedAnswerNotPublishedStaysInTheMailbox(t *testing.T) {
	tm := newMesh(t)
	ka, kb, nkb := agentKey(t), agentKey(t), nodeKey(t)
	late := make(chan *Result, 8)
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "a", Handler: refuseAll, OnReply: func(r *Result) { late <- r }})

	// b registers once (so it has a mailbox) and goes offline.
	nB := tm.startNode(t, nkb, []*keys.Agent{kb}, nil)
	tm.host(t, nB, AgentConfig{Key: kb, Name: "b", Handler: refuseAll})
	if err := nB.Close(); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, offering := range []string{"big", "echo"} {
		_, err := a.Request(t.Context(), kb.Public(), offering, "while you were out", RequestOptions{Timeout: 300 * time.Millisecond})
		mustCode(t, err, errs.TransportTimeout)
		ids[offering] = errs.As(err).Details["request_id"].(string)
	}

	// b comes back on a node that cannot publish the echo's answer (nor
	// the failure that would replace it).
	nB = tm.startNode(t, nkb, []*keys.Agent{kb}, nil)
	failEcho := func(m *nats.Msg) error {
		var lite struct {
			InReplyTo string `json:"in_reply_to"`
		}
		if m.Subject == protocol.InboxSubject(ka.Public()) && json.Unmarshal(m.Data, &lite) == nil && lite.InReplyTo == ids["echo"] {
			return errors.New("test: the connection drops this publish")
		}
		return nil
	}
	nB.testPublishErr.Store(&failEcho)
	s := newSizer()
	tm.host(t, nB, AgentConfig{Key: kb, Name: "b", Handler: s.handle})

	select {
	case r := <-late:
		if r.RequestID != ids["big"] || r.Status != "failed" || codeOf(r.Error) != errs.ContextTooLarge {
			t.Fatalf("late answer %+v", r)
		}
	case <-time.After(asyncWait):
		t.Fatal("the oversize drained request got no answer")
	}
	eventually(t, "both handled", func() bool { return len(s.replyErrs) == 2 })
	eventually(t, "the unanswered request left unacknowledged", func() bool {
		return tm.mailboxStored(t, kb.Public()) == 1
	})
	if nB.journal.Answered(ka.Public(), ids["echo"]) || !nB.journal.Answered(ka.Public(), ids["big"]) {
		t.Fatal("the journal does not match what was answered")
	}
	select {
	case r := <-late:
		t.Fatalf("an answer that should not have gone out: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
}

// A reply subject that is not a NATS inbox is ignored: the agent-signed
// accept and answer are never reflected onto a task, event or inbox
// subject the sender chose. The request is answered, without an accept, at
// the sender's own inbox (L5).
func TestReplyOnlyToInboxSubjects(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	sender := agentKey(t)
	senderInbox := p.tm.collect(t, protocol.InboxSubject(sender.Public()))
	taskID := protocol.NewID()
	reflected := p.tm.collect(t, "mesh.task."+taskID+".>")
	events := p.tm.collect(t, "mesh.event.task.completed")
	other := agentKey(t)
	otherInbox := p.tm.collect(t, protocol.InboxSubject(other.Public()))

	for _, reply := range []string{protocol.TaskUpdateSubject(taskID), "mesh.event.task.completed", protocol.InboxSubject(other.Public()), "_INBOX."} {
		data, err := requestEnv(t, sender, p.b.ID(), "echo", reply).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.tm.svc.PublishRequest(protocol.InboxSubject(p.b.ID()), reply, data); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the answers at the sender's inbox", func() bool { return senderInbox.len() == 4 })
	for _, e := range senderInbox.envelopes(t) {
		if e.From != p.b.ID() || e.To != sender.Public() || protocol.ResponseStatus(e) != "completed" {
			t.Fatalf("answer %+v %s", e, e.Payload)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if reflected.len() != 0 || events.len() != 0 || otherInbox.len() != 0 || senderInbox.len() != 4 || w.calls.Load() != 4 {
		t.Fatalf("reflected %d, events %d, other inbox %d, sender inbox %d, handled %d",
			reflected.len(), events.len(), otherInbox.len(), senderInbox.len(), w.calls.Load())
	}

	// A real inbox still gets the accept, then the answer.
	raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), requestEnv(t, sender, p.b.ID(), "echo", "inbox"))
	eventually(t, "accept and answer", func() bool { return raw.len() == 2 })
	if got := statuses(raw.envelopes(t)); got[0] != "accepted" || got[1] != "completed" {
		t.Fatalf("statuses %v", got)
	}
}
