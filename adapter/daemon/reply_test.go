package daemon

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/inbox"
	"agentmesh.dev/mesh/adapter/node"
)

func inboxAdapter(t *testing.T) *adapter {
	t.Helper()
	q, err := inbox.Open(filepath.Join(t.TempDir(), "inbox.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if _, _, err := q.Put(inbox.Message{ID: "0198c001-0000-7000-8000-00000000aaa1", From: "UA", Text: "hi", Envelope: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	return &adapter{queue: q}
}

// The review's L2: replies to one message that arrive together (the
// control socket serves connections concurrently) send one answer; the
// others are told it was already replied. An ack racing them either wins
// (and nothing is sent) or is refused.
func TestConcurrentRepliesSendOnce(t *testing.T) {
	a := inboxAdapter(t)
	var sent atomic.Int32
	answer := func([]byte) error {
		sent.Add(1)
		time.Sleep(20 * time.Millisecond) // a send takes a while
		return nil
	}
	var wg sync.WaitGroup
	var ok, refused atomic.Int32
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := "1"
			if i%2 == 1 {
				ref = "0198c001-0000-7000-8000-00000000aaa1"
			}
			_, err := a.reply(context.Background(), ref, inbox.Replied, answer)
			switch {
			case err == nil:
				ok.Add(1)
			case strings.Contains(err.Error(), "already replied"), strings.Contains(err.Error(), "already acked"):
				refused.Add(1)
			default:
				t.Errorf("reply: %v", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := a.ack("1"); err != nil && !errors.Is(err, inbox.ErrNotUnread) {
			t.Errorf("ack: %v", err)
		}
	}()
	wg.Wait()
	m, _ := a.queue.Get("1")
	switch m.State {
	case inbox.Replied:
		if sent.Load() != 1 || ok.Load() != 1 {
			t.Errorf("sent %d answers; %d replies succeeded, %d were refused", sent.Load(), ok.Load(), refused.Load())
		}
	case inbox.Acked: // the ack came first: nothing may have been sent
		if sent.Load() != 0 || ok.Load() != 0 {
			t.Errorf("acked, yet %d answers were sent", sent.Load())
		}
	default:
		t.Errorf("state %s", m.State)
	}
}

// A reply whose answer the runtime's journal already holds (sent before
// the adapter stopped, the message never marked) does not claim to have
// replied: it says the earlier answer stands and the new text was not
// sent, and marks the message replied.
func TestReplyAfterAnAnswerAlreadySent(t *testing.T) {
	a := inboxAdapter(t)
	_, err := a.reply(context.Background(), "1", inbox.Replied, func([]byte) error { return node.ErrAlreadyAnswered })
	if err == nil || !strings.Contains(err.Error(), "earlier answer stands") || !strings.Contains(err.Error(), "NOT sent") {
		t.Fatalf("reply over a journaled answer: %v", err)
	}
	if m, _ := a.queue.Get("1"); m.State != inbox.Replied {
		t.Errorf("state %s, want replied", m.State)
	}
	if _, err := a.reply(context.Background(), "1", inbox.Replied, func([]byte) error { t.Error("sent again"); return nil }); err == nil || !strings.Contains(err.Error(), "already replied") {
		t.Errorf("reply once marked: %v", err)
	}
}
