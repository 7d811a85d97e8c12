package peer03_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// performer is the handler of this project's runtime in these tests:
// chat answers {text: upper(text)} (or INPUT_INVALID for "fail"); work
// starts a task and waits for its cancel.
type performer struct {
	canceled atomic.Int32
}

func (p *performer) handle(ctx context.Context, c *node.Call) error {
	var in struct {
		Text string `json:"text"`
	}
	_ = c.DecodeInput(&in)
	switch c.Offering {
	case "work":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		<-t.Context().Done()
		p.canceled.Add(1)
		return nil
	default:
		if strings.Contains(in.Text, "fail") {
			return errs.New(errs.InputInvalid, "this input fails")
		}
		return c.Reply(map[string]any{"text": strings.ToUpper(in.Text)})
	}
}

// A 0.3 requester (the sdk) calls this project's runtime and adapter, which
// answer at its inbox: the accept and the answer there, nothing on the
// reply subject but a queued ack; an error as the envelope member; a
// person's answer (inbox mode) as a fresh request naming the original; a
// task the requester cancels and records as canceled. A 0.2-style
// requester still gets every answer on its reply subject.
func TestSDKRequesterAndOurPerformers(t *testing.T) {
	w := newWorld(t)
	p := &performer{}
	rt := w.runtime("performer", p.handle)
	s := w.sdkAgent("sdk-requester")

	t.Run("runtime answers at the inbox", func(t *testing.T) {
		c := s.request(rt.ID(), map[string]any{"offering": "chat", "input": map[string]any{"text": "hello"}}, wait)
		if !c.accepted || c.answer == nil || payloadOf(c.answer)["status"] != "completed" {
			t.Fatalf("accepted %v, answer %v", c.accepted, c.answer)
		}
		if out := payloadOf(c.answer)["output"].(map[string]any); out["text"] != "HELLO" || c.answer.InReplyTo != c.req.ID {
			t.Fatalf("answer %s", c.answer.Payload)
		}
		if len(c.onReply) != 0 {
			t.Fatalf("%d envelopes on the reply subject of a 0.3 request", len(c.onReply))
		}
	})

	t.Run("runtime error as the envelope member", func(t *testing.T) {
		c := s.request(rt.ID(), map[string]any{"offering": "chat", "input": map[string]any{"text": "please fail"}}, wait)
		if c.answer == nil || payloadOf(c.answer)["status"] != "failed" {
			t.Fatalf("answer %v", c.answer)
		}
		if e := memberError(c.answer); e["code"] != "INPUT_INVALID" || e["message"] != "this input fails" {
			t.Fatalf("envelope member error %v (payload %s)", e, c.answer.Payload)
		}
	})

	t.Run("runtime task canceled by the sdk", func(t *testing.T) {
		c := s.request(rt.ID(), map[string]any{"offering": "work", "input": map[string]any{}}, wait)
		if c.answer == nil || payloadOf(c.answer)["status"] != "working" {
			t.Fatalf("answer %v", c.answer)
		}
		taskID := c.answer.TaskID
		if taskID == "" {
			taskID, _ = payloadOf(c.answer)["task_id"].(string)
		}
		cc := s.request(rt.ID(), protocol.CancelRequestPayload(protocol.CancelInput{TaskID: taskID, Reason: "user_requested"}), wait)
		if cc.answer == nil || protocol.ErrorObject(cc.answer) != nil {
			t.Fatalf("cancel answer %v", cc.answer)
		}
		// The requester publishes the canceled update itself.
		s.taskUpdate(rt.ID(), taskID, c.req.ID, protocol.CanceledUpdatePayload("user_requested", ""))
		eventually(t, "the runtime's task to be canceled", func() bool { return p.canceled.Load() == 1 })
		eventually(t, "the record to say canceled", func() bool {
			rec := w.taskRecord(s, taskID)["task"].(map[string]any)
			return rec["state"] == "canceled" && rec["requester"] == s.id && rec["responder"] == rt.ID()
		})
	})

	t.Run("0.2-style requester reads the reply subject", func(t *testing.T) {
		req := s.envelope(protocol.TypeRequest, rt.ID(), map[string]any{"offering": "chat", "input": map[string]any{"text": "old"}},
			func(e *protocol.Envelope) { e.V = "0.2.0" })
		got := collectReplies(t, s.nc, protocol.InboxSubject(rt.ID()), req, 2)
		if len(got) != 2 || !protocol.IsAccepted(got[0]) || payloadOf(got[1])["status"] != "completed" {
			t.Fatalf("a 0.2 requester got %d answers on its reply subject", len(got))
		}
	})

	// The adapter in command mode.
	key := w.agentKey("echo")
	up := w.startAdapter("cmd", "up", key)
	up.stop()
	cmd := w.startAdapter("cmd", "start", "--name", "echo", "--cmd", `in=$(cat); case "$in" in *fail*) echo "the tool broke" >&2; exit 3;; esac; echo answered`)

	t.Run("adapter command mode answers at the inbox", func(t *testing.T) {
		c := s.request(cmd.id, map[string]any{"offering": "chat", "input": map[string]any{"text": "hi"}}, wait)
		if !c.accepted || c.answer == nil || payloadOf(c.answer)["status"] != "completed" || len(c.onReply) != 0 {
			t.Fatalf("accepted %v, answer %v, %d on the reply subject", c.accepted, c.answer, len(c.onReply))
		}
		if out, _ := payloadOf(c.answer)["output"].(map[string]any); !strings.Contains(out["text"].(string), "answered") {
			t.Fatalf("output %v", out)
		}
		c = s.request(cmd.id, map[string]any{"offering": "chat", "input": map[string]any{"text": "fail now"}}, wait)
		if c.answer == nil || payloadOf(c.answer)["status"] != "failed" || memberError(c.answer)["code"] == nil ||
			!strings.Contains(memberError(c.answer)["message"].(string), "the tool broke") {
			t.Fatalf("failing command: answer %v", c.answer)
		}
	})

	// The adapter in inbox mode: the person's answer is a fresh request.
	inbox := w.startAdapter("inbox", "up", w.agentKey("person"))
	t.Run("adapter inbox mode answers with a fresh request", func(t *testing.T) {
		c := s.request(inbox.id, map[string]any{"offering": "chat", "input": map[string]any{"text": "what is 2+2?"}}, wait)
		if c.answer != nil || len(c.onReply) != 1 {
			t.Fatalf("want only the queued ack on the reply subject: answer %v, %d on the reply subject", c.answer, len(c.onReply))
		}
		if ack, ok := protocol.QueuedAckOf(c.onReply[0]); !ok || !ack.Queued {
			t.Fatalf("reply subject carried %s", c.onReply[0].Payload)
		}
		m := inbox.waitInbox("what is 2+2?")
		if _, errOut, code := inbox.run("reply", jsonNumber(m["seq"]), "four"); code != 0 {
			t.Fatalf("reply: %d %s", code, errOut)
		}
		in := s.next(wait)
		if in.env.Type != protocol.TypeRequest || in.env.InReplyTo != c.req.ID || in.env.From != inbox.id {
			t.Fatalf("late answer %s in_reply_to %s from %s", in.env.Type, in.env.InReplyTo, in.env.From)
		}
		if input, _ := payloadOf(in.env)["input"].(map[string]any); input["text"] != "four" || payloadOf(in.env)["offering"] != "chat" {
			t.Fatalf("late answer payload %s", in.env.Payload)
		}
	})

	t.Run("adapter inbox mode refuses with a fresh request carrying the error", func(t *testing.T) {
		c := s.request(inbox.id, map[string]any{"offering": "chat", "input": map[string]any{"text": "write me a novel"}}, wait)
		if c.answer != nil || len(c.onReply) != 1 {
			t.Fatalf("want only the queued ack: answer %v, %d on the reply subject", c.answer, len(c.onReply))
		}
		m := inbox.waitInbox("write me a novel")
		if _, errOut, code := inbox.run("reply", jsonNumber(m["seq"]), "--refuse-budget", "$12.50", "not at that price"); code != 0 {
			t.Fatalf("reply --refuse-budget: %d %s", code, errOut)
		}
		in := s.next(wait)
		if in.env.Type != protocol.TypeRequest || in.env.InReplyTo != c.req.ID || in.env.From != inbox.id {
			t.Fatalf("late refusal %s in_reply_to %s from %s", in.env.Type, in.env.InReplyTo, in.env.From)
		}
		// A 0.3 client reads only the envelope member.
		e := memberError(in.env)
		d, _ := e["details"].(map[string]any)
		est, _ := d["estimate"].(map[string]any)
		if e["code"] != "BUDGET_INSUFFICIENT" || est["currency"] != "USD" || jsonNumber(est["amount_micro"]) != "12500000" {
			t.Fatalf("envelope member error %v (payload %s)", e, in.env.Payload)
		}
		if p := payloadOf(in.env); p["status"] != "failed" || p["offering"] != "chat" {
			t.Fatalf("late refusal payload %s", in.env.Payload)
		}
	})
}

// collectReplies publishes req with a fresh reply subject and collects up
// to n answers there.
func collectReplies(t *testing.T, nc *nats.Conn, subject string, req *protocol.Envelope, n int) []*protocol.Envelope {
	t.Helper()
	reply := nc.NewInbox()
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	b, _ := req.Marshal()
	if err := nc.PublishRequest(subject, reply, b); err != nil {
		t.Fatal(err)
	}
	var out []*protocol.Envelope
	for len(out) < n {
		m, err := sub.NextMsg(wait)
		if err != nil {
			break
		}
		e, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// jsonNumber is a JSON number as a command-line argument.
func jsonNumber(v any) string {
	f, _ := v.(float64)
	return strconv.Itoa(int(f))
}

// This project's runtime and adapter call a 0.3 performer (the sdk), which
// answers only at the caller's inbox: answers, an error as the envelope
// member, a person's answer as a fresh request, the three task flows (a
// first update that is terminal, a stream whose only update is the final
// one, a cancel the requester publishes), and an answer captured by the
// mailbox while the caller was offline, drained when it is back.
func TestOurRequestersAndSDKPerformer(t *testing.T) {
	w := newWorld(t)
	s := w.sdkAgent("sdk-performer")
	rt := w.runtime("requester", func(ctx context.Context, c *node.Call) error { return c.Reply("unused") })
	// Bounded, so that a regression fails instead of hanging the suite.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	type outcome struct {
		res *node.Result
		err error
	}
	request := func(offering string, input any, opts node.RequestOptions) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			res, err := rt.Request(ctx, s.id, offering, input, opts)
			ch <- outcome{res, err}
		}()
		return ch
	}
	result := func(ch chan outcome) outcome {
		t.Helper()
		select {
		case o := <-ch:
			return o
		case <-time.After(wait):
			t.Fatal("the runtime's request never returned")
			return outcome{}
		}
	}

	t.Run("runtime reads the answer at its inbox", func(t *testing.T) {
		ch := request("chat", map[string]any{"text": "hi"}, node.RequestOptions{})
		in := s.next(wait)
		if in.env.V != protocol.Version {
			t.Fatalf("the runtime sent protocol %q", in.env.V)
		}
		s.complete(in, map[string]any{"text": "hi back"})
		o := result(ch)
		if o.err != nil || o.res.Status != "completed" || !o.res.Accepted || o.res.Output.(map[string]any)["text"] != "hi back" {
			t.Fatalf("result %+v, %v", o.res, o.err)
		}
	})

	t.Run("runtime reads a 0.2 performer's answer on the reply subject", func(t *testing.T) {
		ch := request("chat", map[string]any{"text": "old style"}, node.RequestOptions{})
		in := s.next(wait)
		for _, p := range []map[string]any{{"status": "accepted"}, {"status": "completed", "output": map[string]any{"text": "from 0.2"}}} {
			e := s.envelope(protocol.TypeRespond, in.env.From, p, func(e *protocol.Envelope) { e.V, e.InReplyTo = "0.2.0", in.env.ID })
			s.publish(in.reply, "", e)
		}
		o := result(ch)
		if o.err != nil || !o.res.Accepted || o.res.Output.(map[string]any)["text"] != "from 0.2" {
			t.Fatalf("result %+v, %v", o.res, o.err)
		}
	})

	t.Run("runtime reads the envelope member error", func(t *testing.T) {
		ch := request("chat", map[string]any{"text": "x"}, node.RequestOptions{})
		s.fail(s.next(wait), "OFFERING_NOT_FOUND", "no such offering here")
		o := result(ch)
		if errs.CodeOf(o.err) != errs.OfferingNotFound || o.res == nil || o.res.Status != "failed" {
			t.Fatalf("result %+v, %v", o.res, o.err)
		}
	})

	t.Run("runtime takes a fresh request as the late answer", func(t *testing.T) {
		ch := request("chat", map[string]any{"text": "ask a person"}, node.RequestOptions{})
		in := s.next(wait)
		s.queue(in)
		if o := result(ch); o.err != nil || !o.res.Queued {
			t.Fatalf("queued: %+v, %v", o.res, o.err)
		}
		s.lateAnswer(in, map[string]any{"text": "a person answers"})
		r := rt.nextReply(t)
		if r.RequestID != in.env.ID || r.From != s.id || r.Status != "completed" || r.Output.(map[string]any)["text"] != "a person answers" {
			t.Fatalf("late answer %+v", r)
		}
	})

	task := func(t *testing.T) (*node.TaskHandle, *incoming, string) {
		t.Helper()
		ch := request("work", map[string]any{}, node.RequestOptions{Follow: true})
		in := s.next(wait)
		taskID := s.deferTask(in)
		o := result(ch)
		if o.err != nil || o.res.Task == nil || o.res.TaskID != taskID {
			t.Fatalf("task answer %+v, %v", o.res, o.err)
		}
		return o.res.Task, in, taskID
	}
	record := func(t *testing.T, h *node.TaskHandle, want string, history ...string) {
		t.Helper()
		var rec map[string]any
		eventually(t, "the task record", func() bool {
			r, err := h.Get(ctx)
			if err != nil {
				return false
			}
			rec = r
			return rec["state"] == want
		})
		var got []string
		for _, e := range rec["history"].([]any) {
			got = append(got, e.(map[string]any)["state"].(string))
		}
		if strings.Join(got, ",") != strings.Join(history, ",") {
			t.Fatalf("history %v, want %v", got, history)
		}
	}

	t.Run("task whose first update is terminal", func(t *testing.T) {
		h, in, taskID := task(t)
		s.taskUpdate(rt.ID(), taskID, in.env.ID, map[string]any{"status": "completed", "output": map[string]any{"n": 1}})
		u, err := h.Wait(ctx)
		if err != nil || u.Status != "completed" || u.Output.(map[string]any)["n"] != float64(1) {
			t.Fatalf("wait %+v, %v", u, err)
		}
		record(t, h, "completed", "submitted", "working", "completed")
	})

	t.Run("stream whose only update is the final one", func(t *testing.T) {
		h, in, taskID := task(t)
		for i, part := range []string{"one ", "two"} {
			s.chunk(rt.ID(), taskID, in.env.ID, i, part, i == 1)
		}
		s.taskUpdate(rt.ID(), taskID, in.env.ID, map[string]any{"status": "completed", "output": map[string]any{"text": "one two"}})
		r := h.Stream()
		var text string
		for {
			c, err := r.Next(ctx)
			if err != nil {
				t.Fatalf("stream after %q: %v", text, err)
			}
			text += c.Data.(string)
			if c.Final {
				break
			}
		}
		if u, err := h.Wait(ctx); err != nil || u.Status != "completed" || text != "one two" {
			t.Fatalf("stream %q, wait %+v %v", text, u, err)
		}
		record(t, h, "completed", "submitted", "working", "completed")
	})

	t.Run("requester cancels and publishes canceled", func(t *testing.T) {
		h, _, taskID := task(t)
		done := make(chan error, 1)
		go func() {
			_, err := h.Cancel(ctx, "user_requested", "changed my mind")
			done <- err
		}()
		in := s.next(wait)
		if protocol.OfferingOf(payloadOf(in.env)) != protocol.OfferingTaskCancel {
			t.Fatalf("want the cancel request, got %s", in.env.Payload)
		}
		s.complete(in, map[string]any{"task_id": taskID})
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(wait):
			t.Fatal("the cancel never returned")
		}
		u, err := h.Wait(ctx)
		if err != nil || u.Status != "canceled" || u.Env.From != rt.ID() {
			t.Fatalf("wait %+v, %v", u, err)
		}
		// Nothing of the task was on the update subject before the
		// requester's cancel (the 0.3 performer said working at the
		// requester's inbox only): the record begins with it.
		record(t, h, "canceled", "submitted", "canceled")
	})

	t.Run("answer captured while the caller is offline", func(t *testing.T) {
		id := protocol.NewID()
		ch := request("chat", map[string]any{"text": "answer me later"}, node.RequestOptions{ID: id, Timeout: time.Second})
		in := s.next(wait)
		if o := result(ch); errs.CodeOf(o.err) != errs.TransportTimeout {
			t.Fatalf("want a timeout, got %+v, %v", o.res, o.err)
		}
		// What earlier calls left in the mailbox (their accepts and
		// answers, taken live) is drained and deleted by this process:
		// the next one, with a journal of its own, would hand it to
		// OnReply. The drain loop does it within a second; the test
		// does not wait for it.
		rt.DrainNow()
		_ = rt.node.Close()
		s.complete(in, map[string]any{"text": "while you were away"})
		back := w.startRuntime("requester", rt.key, rt.jwt, rt.seed, nil)
		r := back.nextReply(t)
		if r.RequestID != id || r.From != s.id || r.Output.(map[string]any)["text"] != "while you were away" {
			t.Fatalf("drained answer %+v", r)
		}
		rt = back
	})

	// The adapter as the requester.
	a := w.startAdapter("asker", "up", w.agentKey("asker"))
	send := func(text string, extra ...string) chan [3]string {
		ch := make(chan [3]string, 1)
		go func() {
			o, e, code := a.run(append([]string{"send", s.id, text}, extra...)...)
			ch <- [3]string{o, e, strconv.Itoa(code)}
		}()
		return ch
	}
	t.Run("adapter send reads the answer at its inbox", func(t *testing.T) {
		ch := send("hello sdk", "--wait", "20")
		s.complete(s.next(wait), map[string]any{"text": "hello adapter"})
		if r := <-ch; r[2] != "0" || strings.TrimSpace(r[0]) != "hello adapter" {
			t.Fatalf("send: %v", r)
		}
	})
	t.Run("adapter send reads the envelope member error", func(t *testing.T) {
		ch := send("fail please", "--wait", "20")
		s.fail(s.next(wait), "INPUT_INVALID", "the sdk refuses")
		if r := <-ch; r[2] == "0" || !strings.Contains(r[1], "the sdk refuses") {
			t.Fatalf("send: %v", r)
		}
	})
	t.Run("adapter keeps a person's fresh-request answer as a reply", func(t *testing.T) {
		ch := send("ask your person")
		in := s.next(wait)
		s.queue(in)
		if r := <-ch; r[2] == "0" || !strings.Contains(r[1], "inbox") {
			t.Fatalf("send of a queued message: %v", r)
		}
		s.lateAnswer(in, map[string]any{"text": "the person says yes"})
		m := a.waitInbox("the person says yes")
		if m["kind"] != "reply" || m["in_reply_to"] != in.env.ID || m["from"] != s.id {
			t.Fatalf("inbox entry %v", m)
		}
	})
}

// A standalone sdk agent (its own node, on an am_ credential) is listed by
// discover, as this project's runtime asks it, with the presence its
// {node, availability} heartbeat gives; the sdk follows mesh.heartbeat.* and
// sees the runtime's and the adapter's nodes; an sdk guest registers on the
// plain subject, is filed sandbox and unlisted, and still answers the
// runtime and the adapter at their inboxes.
func TestDiscoveryPresenceAndGuests(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	rt := w.runtime("directory", nil)
	tag := "peer03-" + strings.ToLower(protocol.RandomToken()[:8])
	solo := w.sdkAgent("standalone", tag)
	discover := func(query map[string]any) map[string]map[string]any {
		t.Helper()
		rep, err := bus.Call(ctx, rt.node.Conn(), rt.key, protocol.SubjDiscover, protocol.TypeDiscover, "", query)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]any{}
		for _, a := range payloadOf(rep)["agents"].([]any) {
			m := a.(map[string]any)
			out[m["id"].(string)] = m
		}
		return out
	}

	t.Run("standalone agent listed", func(t *testing.T) {
		hb := solo.envelope(protocol.TypeEmit, "", map[string]any{"node": solo.id, "availability": "online"}, nil)
		solo.publish(protocol.HeartbeatSubject(solo.id), "", hb)
		eventually(t, "the standalone agent listed online", func() bool {
			a := discover(map[string]any{"tags": []any{tag}})[solo.id]
			return a != nil && a["availability"] == "online"
		})
	})

	t.Run("heartbeats followed", func(t *testing.T) {
		follower := w.sdkAgent("follower")
		sub, err := follower.nc.SubscribeSync("mesh.heartbeat.*")
		if err != nil {
			t.Fatal(err)
		}
		if err := follower.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		ad := w.startAdapter("hb", "up", w.agentKey("beating"))
		seen := map[string]bool{}
		for deadline := time.Now().Add(3 * wait); time.Now().Before(deadline) && !(seen[rt.ID()] && seen[ad.id]); {
			m, err := sub.NextMsg(wait)
			if err != nil {
				break
			}
			e, err := protocol.Decode(m.Data)
			if err != nil || m.Subject != protocol.HeartbeatSubject(e.From) {
				continue
			}
			ids, _ := payloadOf(e)["agents"].([]any)
			for _, id := range ids {
				seen[id.(string)] = true
			}
		}
		if !seen[rt.ID()] || !seen[ad.id] {
			t.Fatalf("heartbeats seen for %v; want the runtime's %s and the adapter's %s", seen, rt.ID(), ad.id)
		}
		if err := follower.nc.LastError(); err != nil {
			t.Fatalf("the subscription was refused: %v", err)
		}
	})

	t.Run("guest on the plain subject", func(t *testing.T) {
		g, reg := w.sdkGuest("guest")
		if reg["sandbox"] != true || reg["visibility"] != "unlisted" {
			t.Fatalf("guest registration %v", reg)
		}
		if _, listed := discover(map[string]any{})[g.id]; listed {
			t.Fatal("a guest is listed by discover")
		}
		ch := make(chan *node.Result, 1)
		go func() {
			res, err := rt.Request(ctx, g.id, "chat", map[string]any{"text": "hello guest"}, node.RequestOptions{})
			if err != nil {
				t.Error(err)
			}
			ch <- res
		}()
		g.complete(g.next(wait), map[string]any{"text": "hello runtime"})
		if res := <-ch; res == nil || res.Output.(map[string]any)["text"] != "hello runtime" {
			t.Fatalf("the runtime's call of a guest: %+v", res)
		}
		a := w.startAdapter("toguest", "up", w.agentKey("caller"))
		done := make(chan [3]string, 1)
		go func() {
			o, e, code := a.run("send", g.id, "hello from the adapter", "--wait", "20")
			done <- [3]string{o, e, strconv.Itoa(code)}
		}()
		g.complete(g.next(wait), map[string]any{"text": "hello adapter"})
		if r := <-done; r[2] != "0" || strings.TrimSpace(r[0]) != "hello adapter" {
			t.Fatalf("the adapter's send to a guest: %v", r)
		}
	})
}
