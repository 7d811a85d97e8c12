package peer03_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// sdk is a protocol 0.3 client written from the wire up, as the upstream
// TypeScript SDK (0.54.1) behaves (upstream-notes §15), and nothing of this
// project's runtime: it speaks NATS over the mesh's WebSocket, builds and
// signs envelopes (the canonical JSON and signature the conformance vectors
// pin), and
//
//   - as a requester publishes with a reply subject it reads only for the
//     queued ack, and waits for the accept and the answer at its own inbox,
//     correlated by in_reply_to; a respond at its inbox that matches no open
//     wait is dropped;
//   - as a performer sends the accept and the answer to the sender's inbox,
//     an error only as the envelope member error, and the late answer of a
//     queued message as a fresh request naming the original;
//   - defers work as a task: working to the requester's inbox only, then the
//     terminal update (or the stream's chunks and then its final update) on
//     mesh.task.<id>.update; on cancel the requester publishes canceled.
type sdk struct {
	t   *testing.T
	key *keys.Agent
	id  string
	nc  *nats.Conn
	v   string // the envelope version it writes

	mu    sync.Mutex
	waits map[string]chan *protocol.Envelope // open waits, by request id

	// requests are the verified requests at its inbox that answer no open
	// wait (work, and late answers after the wait ended).
	requests chan *incoming
	// dropped counts answers at its inbox that matched no open wait.
	dropped int
}

// incoming is a request as the sdk received it.
type incoming struct {
	env   *protocol.Envelope
	reply string // the NATS reply subject (liveness and the queued ack)
}

func newSDK(t *testing.T, key *keys.Agent, nc *nats.Conn) *sdk {
	t.Helper()
	s := &sdk{t: t, key: key, id: key.Public(), nc: nc, v: "0.3.0",
		waits: map[string]chan *protocol.Envelope{}, requests: make(chan *incoming, 64)}
	sub, err := nc.Subscribe(protocol.InboxSubject(s.id), s.onInbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sdk) onInbox(m *nats.Msg) {
	env, err := protocol.Decode(m.Data)
	if err != nil || protocol.CheckFreshness(env.TS, time.Now(), protocol.SourceLive) != nil {
		return
	}
	if env.To != "" && env.To != s.id {
		return
	}
	if env.InReplyTo != "" {
		s.mu.Lock()
		ch := s.waits[env.InReplyTo]
		s.mu.Unlock()
		if ch != nil {
			ch <- env
			return
		}
	}
	if env.Type != protocol.TypeRequest {
		s.mu.Lock()
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.requests <- &incoming{env: env, reply: m.Reply}
}

// envelope is a signed envelope of type typ from the sdk.
func (s *sdk) envelope(typ protocol.Type, to string, payload any, edit func(*protocol.Envelope)) *protocol.Envelope {
	s.t.Helper()
	e, err := protocol.New(typ, s.id, payload)
	if err != nil {
		s.t.Fatal(err)
	}
	e.V, e.To = s.v, to
	delete(e.Extra, "error") // a 0.3 client writes the member itself (fail)
	if edit != nil {
		edit(e)
	}
	if err := e.Sign(s.key); err != nil {
		s.t.Fatal(err)
	}
	return e
}

func (s *sdk) publish(subject, reply string, e *protocol.Envelope) {
	s.t.Helper()
	b, err := e.Marshal()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: b}); err != nil {
		s.t.Fatal(err)
	}
}

// call is one request of the sdk and what came back.
type call struct {
	req      *protocol.Envelope
	accepted bool
	answer   *protocol.Envelope // the first answer at the inbox that is not an accept
	onReply  []*protocol.Envelope
}

// request sends a request and waits as a 0.3 requester does: the accept
// and the answer at its inbox; the reply subject is read only for a queued
// ack (anything else arriving there is kept in onReply for the test, and
// ignored). It returns when the answer or a queued ack arrives, or after
// wait.
func (s *sdk) request(to string, payload map[string]any, wait time.Duration) *call {
	s.t.Helper()
	req := s.envelope(protocol.TypeRequest, to, payload, nil)
	ch := make(chan *protocol.Envelope, 16)
	s.mu.Lock()
	s.waits[req.ID] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.waits, req.ID)
		s.mu.Unlock()
	}()
	reply := s.nc.NewInbox()
	rsub, err := s.nc.SubscribeSync(reply)
	if err != nil {
		s.t.Fatal(err)
	}
	defer func() { _ = rsub.Unsubscribe() }()
	s.publish(protocol.InboxSubject(to), reply, req)
	c := &call{req: req}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case e := <-ch:
			if e.From != to {
				continue
			}
			if protocol.IsAccepted(e) {
				c.accepted = true
				continue
			}
			c.answer = e
			c.drainReply(rsub)
			return c
		case <-time.After(20 * time.Millisecond):
		}
		if m, err := rsub.NextMsg(time.Millisecond); err == nil {
			if e, err := protocol.Decode(m.Data); err == nil {
				c.onReply = append(c.onReply, e)
				if _, queued := protocol.QueuedAckOf(e); queued {
					return c
				}
			}
		}
	}
	c.drainReply(rsub)
	return c
}

// drainReply keeps what else reached the reply subject by now.
func (c *call) drainReply(sub *nats.Subscription) {
	for {
		m, err := sub.NextMsg(200 * time.Millisecond)
		if err != nil {
			return
		}
		if e, err := protocol.Decode(m.Data); err == nil {
			c.onReply = append(c.onReply, e)
		}
	}
}

// next is the next request at the sdk's inbox.
func (s *sdk) next(wait time.Duration) *incoming {
	s.t.Helper()
	select {
	case in := <-s.requests:
		return in
	case <-time.After(wait):
		s.t.Fatalf("sdk %s: no request within %s", s.id, wait)
		return nil
	}
}

// respond publishes a respond in reply to in at the sender's inbox (a 0.3
// performer's only channel for answers).
func (s *sdk) respond(in *incoming, payload map[string]any, edit func(*protocol.Envelope)) *protocol.Envelope {
	s.t.Helper()
	e := s.envelope(protocol.TypeRespond, in.env.From, payload, func(e *protocol.Envelope) {
		e.InReplyTo, e.Trace = in.env.ID, in.env.Trace.Child()
		if edit != nil {
			edit(e)
		}
	})
	s.publish(protocol.InboxSubject(in.env.From), "", e)
	return e
}

func (s *sdk) accept(in *incoming) { s.respond(in, map[string]any{"status": "accepted"}, nil) }

// complete accepts and answers with output, as a 0.3 performer does.
func (s *sdk) complete(in *incoming, output any) {
	s.accept(in)
	s.respond(in, map[string]any{"status": "completed", "output": output}, nil)
}

// fail answers with an error as the envelope member only.
func (s *sdk) fail(in *incoming, code, message string) {
	s.accept(in)
	s.respond(in, map[string]any{"status": "failed"}, func(e *protocol.Envelope) {
		e.Extra = map[string]any{"error": map[string]any{"code": code, "message": message, "retryable": false}}
	})
}

// queue sends the node-level queued ack on the reply subject: the message
// waits for a person.
func (s *sdk) queue(in *incoming) string {
	s.t.Helper()
	inboxID := protocol.NewID()
	e := s.envelope(protocol.TypeRespond, in.env.From, map[string]any{"status": "queued",
		"output": map[string]any{"queued": true, "inbox_id": inboxID, "text": "queued for a person"}},
		func(e *protocol.Envelope) { e.InReplyTo = in.env.ID })
	s.publish(in.reply, "", e)
	return inboxID
}

// lateAnswer is a person's answer to a queued message: a fresh request to
// the original sender naming the original in in_reply_to.
func (s *sdk) lateAnswer(in *incoming, input any) *protocol.Envelope {
	s.t.Helper()
	p, _ := in.env.PayloadValue()
	offering := protocol.OfferingOf(p.(map[string]any))
	e := s.envelope(protocol.TypeRequest, in.env.From, map[string]any{"offering": offering, "input": input},
		func(e *protocol.Envelope) { e.InReplyTo = in.env.ID })
	s.publish(protocol.InboxSubject(in.env.From), s.nc.NewInbox(), e)
	return e
}

// taskUpdate publishes a respond on mesh.task.<id>.update.
func (s *sdk) taskUpdate(to, taskID, inReplyTo string, payload map[string]any) {
	s.t.Helper()
	e := s.envelope(protocol.TypeRespond, to, payload, func(e *protocol.Envelope) { e.TaskID, e.InReplyTo = taskID, inReplyTo })
	s.publish(protocol.TaskUpdateSubject(taskID), "", e)
}

// chunk publishes one signed stream chunk on mesh.task.<id>.stream; the
// final one is {status:"completed", final:true, chunk_count}.
func (s *sdk) chunk(to, taskID, inReplyTo string, index int, data any, final bool) {
	s.t.Helper()
	p := map[string]any{"status": "working", "chunk_index": index, "final": false, "data": data}
	if final {
		p["status"], p["final"], p["chunk_count"] = "completed", true, index+1
	}
	e := s.envelope(protocol.TypeRespond, to, p, func(e *protocol.Envelope) { e.TaskID, e.InReplyTo = taskID, inReplyTo })
	s.publish(protocol.TaskStreamSubject(taskID), "", e)
}

// defer answers a request as a task: the accept and working (with the task
// id) at the requester's inbox only, nothing on the update subject yet.
func (s *sdk) deferTask(in *incoming) string {
	taskID := protocol.NewID()
	s.accept(in)
	s.respond(in, map[string]any{"status": "working"}, func(e *protocol.Envelope) { e.TaskID = taskID })
	return taskID
}

// registerStandalone registers the sdk's agent as its own node (node.id ==
// id, the SDK quick start) on the plain register subject.
func (s *sdk) registerStandalone(name string, tags []string) map[string]any {
	s.t.Helper()
	now := time.Now()
	v, err := protocol.NewVouch(s.key, s.id, now, now.Add(time.Hour))
	if err != nil {
		s.t.Fatal(err)
	}
	man := map[string]any{"id": s.id, "name": name, "endpoint": protocol.InboxSubject(s.id),
		"node": map[string]any{"id": s.id, "attestation": v}, "tags": tags, "visibility": "public",
		"offerings": []any{map[string]any{"id": "chat", "name": "chat"}}}
	return s.busCall(protocol.SubjRegister, protocol.TypeRegister, man)
}

// busCall is a plain NATS request to a bus service (registry, tasks): the
// services answer on the reply subject, 0.2 and 0.3 alike.
func (s *sdk) busCall(subject string, typ protocol.Type, payload any) map[string]any {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	e := s.envelope(typ, "", payload, nil)
	b, _ := e.Marshal()
	m, err := s.nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		s.t.Fatalf("%s: %v", subject, err)
	}
	rep, err := protocol.Decode(m.Data)
	if err != nil {
		s.t.Fatalf("%s: undecodable answer: %v", subject, err)
	}
	if e := protocol.ErrorObject(rep); e != nil {
		s.t.Fatalf("%s: %v", subject, e)
	}
	var out map[string]any
	if err := json.Unmarshal(rep.Payload, &out); err != nil {
		s.t.Fatalf("%s: %v", subject, err)
	}
	return out
}

// payloadOf is an envelope's payload as a map.
func payloadOf(e *protocol.Envelope) map[string]any {
	v, _ := e.PayloadValue()
	m, _ := v.(map[string]any)
	return m
}

// memberError is the envelope member error a 0.3 reader sees (nil when
// there is none).
func memberError(e *protocol.Envelope) map[string]any {
	m, _ := e.Extra["error"].(map[string]any)
	return m
}
