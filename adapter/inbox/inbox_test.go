package inbox_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/inbox"
)

func TestQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	q, err := inbox.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"0198c001-0000-7000-8000-00000000aaa1", "0198c001-0000-7000-8000-00000000bbb2"}
	for i, id := range ids {
		m, added, err := q.Put(inbox.Message{ID: id, From: "U1", Text: "hello"})
		if err != nil || !added || m.Seq != uint64(i+1) || m.State != inbox.Unread {
			t.Fatalf("put %d: %+v %v %v", i, m, added, err)
		}
	}
	// The same envelope again (a redelivery) is not a second message.
	if m, added, err := q.Put(inbox.Message{ID: ids[0], Text: "other"}); err != nil || added || m.Seq != 1 || m.Text != "hello" {
		t.Fatalf("duplicate put: %+v %v %v", m, added, err)
	}
	for _, tc := range []struct {
		ref  string
		want uint64
		err  bool
	}{
		{"1", 1, false}, {"#2", 2, false}, {ids[1], 2, false}, {"0198c001-0000-7000-8000-00000000aa", 1, false},
		{"0198c001", 0, true}, // ambiguous
		{"3", 0, true}, {"abc", 0, true}, {"ffffffff-nope", 0, true},
	} {
		m, err := q.Get(tc.ref)
		if (err != nil) != tc.err || (!tc.err && m.Seq != tc.want) {
			t.Errorf("Get(%q) = #%d, %v", tc.ref, m.Seq, err)
		}
	}
	if _, err := q.Get("9"); !errors.Is(err, inbox.ErrNotFound) {
		t.Errorf("missing number: %v", err)
	}
	refuseTwice := func(m inbox.Message) error {
		if m.State != inbox.Unread {
			return errors.New("already " + m.State)
		}
		return nil
	}
	if m, err := q.Transition("1", inbox.Replied, time.Now(), refuseTwice); err != nil || m.State != inbox.Replied || m.RepliedAt == "" {
		t.Fatalf("reply: %+v %v", m, err)
	}
	if _, err := q.Transition("1", inbox.Replied, time.Now(), refuseTwice); err == nil {
		t.Fatal("replied twice")
	}
	// Durable: a reopened queue has the same messages and states.
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q, err = inbox.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	unread, _ := q.List(false)
	all, _ := q.List(true)
	if len(unread) != 1 || unread[0].Seq != 2 || len(all) != 2 || all[0].State != inbox.Replied {
		t.Fatalf("after reopening: unread %+v all %+v", unread, all)
	}
	// A new message after reopening takes the next number.
	if m, _, _ := q.Put(inbox.Message{ID: "0198c001-0000-7000-8000-00000000ccc3"}); m.Seq != 3 {
		t.Fatalf("next number %d", m.Seq)
	}
	// The file is in use while open.
	if _, err := inbox.Open(path, 50*time.Millisecond); err == nil {
		t.Fatal("opened twice")
	}
}
