package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// forget drops what this process knows of a task's performer, as a
// restart would.
func forget(a *Agent, taskID string) {
	a.mu.Lock()
	delete(a.known, taskID)
	a.mu.Unlock()
}

// forgedFrame is a frame for taskID signed by key, addressed to the
// requester.
func forgedFrame(t *testing.T, key *keys.Agent, to, taskID string, payload map[string]any) []byte {
	t.Helper()
	e, err := protocol.New(protocol.TypeRespond, key.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	e.TaskID, e.To = taskID, to
	if err := e.Sign(key); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A handle made by Task(id) when the performer is not known learns it from
// the task record before it accepts anything: a forged "completed" signed
// by another key is dropped, and Wait returns the performer's own (M2).
func TestTaskHandleLearnsItsPerformerFromTheRecord(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	res, err := p.a.Request(t.Context(), p.b.ID(), "task-wait", nil, RequestOptions{})
	if err != nil || res.Task == nil {
		t.Fatalf("%+v %v", res, err)
	}
	res.Task.Close()
	forget(p.a, res.TaskID)
	eventually(t, "the task record", func() bool {
		_, err := res.Task.Get(t.Context())
		return err == nil
	})

	h, err := p.a.Task(res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.Performer != p.b.ID() {
		t.Fatalf("performer %q", h.Performer)
	}
	mallory := agentKey(t)
	forged := forgedFrame(t, mallory, p.a.ID(), res.TaskID, map[string]any{"status": "completed", "output": map[string]any{"forged": true}})
	chunk := forgedFrame(t, mallory, p.a.ID(), res.TaskID, map[string]any{"status": "completed", "chunk_index": 0, "final": true, "chunk_count": 1, "data": "forged"})
	if err := p.tm.svc.Publish(protocol.TaskUpdateSubject(res.TaskID), forged); err != nil {
		t.Fatal(err)
	}
	if err := p.tm.svc.Publish(protocol.TaskStreamSubject(res.TaskID), chunk); err != nil {
		t.Fatal(err)
	}
	if err := p.tm.svc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(w.release)

	ctx, cancel := context.WithTimeout(t.Context(), asyncWait)
	defer cancel()
	// Wait may answer from the record (Env nil) if the task ended before it
	// asked; either way it is the performer's output.
	u, err := h.Wait(ctx)
	if err != nil || (u.Env != nil && u.Env.From != p.b.ID()) || u.Output.(map[string]any)["done"] != true {
		t.Fatalf("Wait: %+v %v", u, err)
	}
	for {
		u, err := h.NextUpdate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if u.Env.From != p.b.ID() {
			t.Fatalf("an update from %s was accepted", u.Env.From)
		}
		if protocol.Terminal(u.Status) {
			break
		}
	}
	h.mu.Lock()
	chunks := len(h.chunks)
	h.mu.Unlock()
	if chunks != 0 {
		if c, err := h.Stream().Next(ctx); c != nil || err == nil {
			t.Fatalf("a forged chunk was read: %+v %v", c, err)
		}
	}

	// A task with no record is refused rather than followed blind.
	_, err = p.a.Task(protocol.NewID())
	mustCode(t, err, errs.TaskNotFound)
}

// Wait on a late handle reads a task that already ended from its record,
// with the error and message of its terminal update (L2).
func TestLateWaitReturnsTheRecordedError(t *testing.T) {
	tm := newMesh(t)
	p := newPair(t, tm, AgentConfig{Name: "failing", Handler: func(ctx context.Context, c *Call) error {
		task, err := c.StartTask()
		if err != nil {
			return err
		}
		go func() {
			time.Sleep(100 * time.Millisecond)
			e := errs.New(errs.DependencyFailed, "the upstream said no")
			_ = task.publish(map[string]any{"status": protocol.StateFailed, "error": e.Wire(), "message": "gave up"}, protocol.StateFailed)
		}()
		return nil
	}}, nil)
	res, err := p.a.Request(t.Context(), p.b.ID(), "anything", nil, RequestOptions{})
	if err != nil || res.Task == nil {
		t.Fatalf("%+v %v", res, err)
	}
	res.Task.Close()
	eventually(t, "the failed record", func() bool {
		rec, err := res.Task.Get(t.Context())
		return err == nil && rec["state"] == protocol.StateFailed
	})
	h, err := p.a.TaskFrom(p.b.ID(), res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	u, err := h.Wait(t.Context())
	mustCode(t, err, errs.DependencyFailed)
	if u.Status != protocol.StateFailed || u.Message != "gave up" || u.Error == nil || u.Error.Message != "the upstream said no" {
		t.Fatalf("update %+v", u)
	}
}

// Closing the node closes the task handles still open, so a task that never
// ends holds no subscription past it; the remembered performers are
// bounded (L4).
func TestTaskHandlesEndWithTheNode(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	t.Cleanup(func() { close(w.release) })
	res, err := p.a.Request(t.Context(), p.b.ID(), "task-wait", nil, RequestOptions{Follow: true})
	if err != nil || res.Task == nil {
		t.Fatalf("%+v %v", res, err)
	}
	h2, err := p.a.TaskFrom(p.b.ID(), res.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	p.a.mu.Lock()
	open := len(p.a.handles)
	p.a.mu.Unlock()
	if open != 2 {
		t.Fatalf("%d handles open", open)
	}
	if err := p.nA.Close(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*TaskHandle{res.Task, h2} {
		h.pump.mu.Lock()
		subs := len(h.pump.subs)
		h.pump.mu.Unlock()
		if subs != 0 {
			t.Fatalf("a handle keeps %d subscriptions after Close", subs)
		}
		ctx, cancel := context.WithTimeout(t.Context(), asyncWait)
		_, err := h.NextUpdate(ctx)
		for err == nil {
			_, err = h.NextUpdate(ctx) // what had arrived, then the end
		}
		cancel()
		mustCode(t, err, errs.StreamClosed)
		_, err = h.Wait(t.Context())
		mustCode(t, err, errs.StreamClosed)
	}
	p.a.mu.Lock()
	open = len(p.a.handles)
	p.a.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d handles left", open)
	}

	a := p.a
	for i := range maxKnownTasks + 10 {
		a.rememberPerformer(fmt.Sprintf("task-%d", i), p.b.ID())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.known) != maxKnownTasks || a.known["task-0"] != "" || a.known[fmt.Sprintf("task-%d", maxKnownTasks+9)] != p.b.ID() {
		t.Fatalf("%d performers remembered", len(a.known))
	}
}
