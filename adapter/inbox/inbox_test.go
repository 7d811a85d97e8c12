package inbox_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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
	if m, added, err := q.Put(inbox.Message{ID: ids[0], From: "U1", Text: "other"}); err != nil || added || m.Seq != 1 || m.Text != "hello" {
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

// The review's L1: a message is the same as a stored one only when sender
// and envelope id both match. B's message with the id of A's stored one is
// kept as a message of its own (it used to be dropped, and a reply to "it"
// answered A); B's redelivery is still not a second message; the shared id
// no longer names one message, the numbers do.
func TestSameIDFromAnotherSender(t *testing.T) {
	q, err := inbox.Open(filepath.Join(t.TempDir(), "inbox.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const id = "0198c001-0000-7000-8000-00000000aaa1"
	a, added, err := q.Put(inbox.Message{ID: id, From: "UA", Text: "from a"})
	if err != nil || !added {
		t.Fatal(added, err)
	}
	if m, err := q.Get(id); err != nil || m.Seq != a.Seq {
		t.Fatalf("Get(id) with one sender: %+v %v", m, err)
	}
	b, added, err := q.Put(inbox.Message{ID: id, From: "UB", Text: "from b"})
	if err != nil || !added || b.Seq == a.Seq || b.From != "UB" || b.Text != "from b" {
		t.Fatalf("B's message with A's id: %+v added=%v %v", b, added, err)
	}
	if m, added, err := q.Put(inbox.Message{ID: id, From: "UB", Text: "again"}); err != nil || added || m.Seq != b.Seq || m.Text != "from b" {
		t.Fatalf("B's redelivery: %+v added=%v %v", m, added, err)
	}
	for _, ref := range []string{id, id[:12]} {
		if _, err := q.Get(ref); err == nil || !strings.Contains(err.Error(), "more than one sender") {
			t.Errorf("Get(%q) of a shared id: %v", ref, err)
		}
	}
	for _, want := range []inbox.Message{a, b} {
		if m, err := q.Get(fmtSeq(want.Seq)); err != nil || m.From != want.From {
			t.Errorf("Get(#%d): %+v %v", want.Seq, m, err)
		}
	}
	if all, _ := q.List(true); len(all) != 2 {
		t.Errorf("messages: %+v", all)
	}
}

func fmtSeq(n uint64) string { return "#" + strconv.FormatUint(n, 10) }

// A queue file written before messages were keyed by (sender, id) has
// only the id index: it opens, its messages are found by number and id,
// a redelivery of a stored message is still not a second message, and the
// same id from another sender is a new one.
func TestOldQueueFileKeepsWorking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	const id = "0198c001-0000-7000-8000-00000000aaa1"
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		msgs, err := tx.CreateBucket([]byte("messages"))
		if err != nil {
			return err
		}
		ids, err := tx.CreateBucket([]byte("ids"))
		if err != nil {
			return err
		}
		n, _ := msgs.NextSequence()
		var k [8]byte
		binary.BigEndian.PutUint64(k[:], n)
		v, _ := json.Marshal(inbox.Message{Seq: n, ID: id, Kind: inbox.KindRequest, From: "UA", Text: "old", State: inbox.Unread})
		if err := msgs.Put(k[:], v); err != nil {
			return err
		}
		return ids.Put([]byte(id), k[:])
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	q, err := inbox.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, ref := range []string{"1", id, id[:10]} {
		if m, err := q.Get(ref); err != nil || m.Text != "old" {
			t.Errorf("Get(%q) in an old file: %+v %v", ref, m, err)
		}
	}
	if m, added, err := q.Put(inbox.Message{ID: id, From: "UA", Text: "redelivered"}); err != nil || added || m.Seq != 1 {
		t.Errorf("redelivery into an old file: %+v added=%v %v", m, added, err)
	}
	if m, added, err := q.Put(inbox.Message{ID: id, From: "UB", Text: "b"}); err != nil || !added || m.Seq != 2 {
		t.Errorf("another sender's message with the same id: %+v added=%v %v", m, added, err)
	}
	if m, _, _ := q.Put(inbox.Message{ID: "0198c001-0000-7000-8000-00000000ccc3", From: "UA"}); m.Seq != 3 {
		t.Errorf("next number %d", m.Seq)
	}
}

// Transition moves only an unread message: a second caller that also saw
// it unread is refused (review L2).
func TestTransitionOnlyFromUnread(t *testing.T) {
	q, err := inbox.Open(filepath.Join(t.TempDir(), "inbox.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, _, err := q.Put(inbox.Message{ID: "0198c001-0000-7000-8000-00000000aaa1", From: "UA"}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Transition("1", inbox.Replied, time.Now(), nil); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{inbox.Replied, inbox.Acked} {
		if m, err := q.Transition("1", state, time.Now(), nil); !errors.Is(err, inbox.ErrNotUnread) || !strings.Contains(err.Error(), "already replied") {
			t.Errorf("%s after replied: %+v %v", state, m, err)
		}
	}
	if m, _ := q.Get("1"); m.State != inbox.Replied {
		t.Errorf("state %s", m.State)
	}
}

// The review's L6: contacts are who this agent exchanged messages with
// (replied to, sent to, or got a reply from), not every sender that
// reached the inbox: unread, acknowledged and refused senders are not.
func TestContacts(t *testing.T) {
	q, err := inbox.Open(filepath.Join(t.TempDir(), "inbox.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	put := func(id, from, kind string) string {
		t.Helper()
		m, _, err := q.Put(inbox.Message{ID: id, From: from, Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		return fmtSeq(m.Seq)
	}
	replied := put("0198c001-0000-7000-8000-000000000001", "UREPLIED", "")
	acked := put("0198c001-0000-7000-8000-000000000002", "UACKED", "")
	refused := put("0198c001-0000-7000-8000-000000000003", "UREFUSED", "")
	put("0198c001-0000-7000-8000-000000000004", "UUNREAD", "")
	put("0198c001-0000-7000-8000-000000000005", "UANSWERED", inbox.KindReply) // a late reply to our send
	put("0198c001-0000-7000-8000-000000000006", "UFORGER", inbox.KindUnsolicited)
	for ref, state := range map[string]string{replied: inbox.Replied, acked: inbox.Acked, refused: inbox.Refused} {
		if _, err := q.Transition(ref, state, time.Now(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.NoteSent("USENT", time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := q.Contacts()
	if want := []string{"UANSWERED", "UREPLIED", "USENT"}; err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("contacts %v %v, want %v", got, err, want)
	}
	if m, _ := q.Get(refused); m.State != inbox.Refused || m.RepliedAt == "" {
		t.Errorf("refused message: %+v", m)
	}
}

// Issue 10 item 5: the record of the requests this agent sent, which tells
// a reply from an unsolicited answer, survives a restart; entries older
// than RequestMemory are forgotten, oldest first, as new ones are noted.
func TestSentRequestsSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	q, err := inbox.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const (
		old    = "0198c001-0000-7000-8000-000000000001"
		recent = "0198c002-0000-7000-8000-000000000002"
		fresh  = "0198c003-0000-7000-8000-000000000003"
	)
	if err := q.NoteRequest(old, "UOLD", now.Add(-inbox.RequestMemory-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := q.NoteRequest(recent, "UB", now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := q.NoteRequest("", "UB", now); err == nil {
		t.Error("a request without an id was noted")
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if q, err = inbox.Open(path, time.Second); err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if to, ok, err := q.SentTo(recent); err != nil || !ok || to != "UB" {
		t.Fatalf("SentTo(recent) after reopening = %q %v %v", to, ok, err)
	}
	if to, ok, err := q.SentTo("0198c009-0000-7000-8000-000000000009"); err != nil || ok || to != "" {
		t.Fatalf("SentTo(never sent) = %q %v %v", to, ok, err)
	}
	// Noting a new request forgets the one older than RequestMemory (it
	// was kept until now: it was noted as old, and pruning runs on the
	// next note), and keeps the recent one.
	if err := q.NoteRequest(fresh, "UC", now); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{old: false, recent: true, fresh: true} {
		if _, ok, err := q.SentTo(id); err != nil || ok != want {
			t.Errorf("SentTo(%s) = %v %v, want %v", id, ok, err, want)
		}
	}
}

// A queue file from before sent requests were recorded kept every answer
// naming any id as a reply: with nothing to check them against, they
// become unsolicited when it is opened; requests stay as they were.
func TestOldQueueFileRepliesBecomeUnsolicited(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		msgs, err := tx.CreateBucket([]byte("messages"))
		if err != nil {
			return err
		}
		ids, err := tx.CreateBucket([]byte("ids"))
		if err != nil {
			return err
		}
		for _, m := range []inbox.Message{
			{ID: "0198c001-0000-7000-8000-00000000aaa1", Kind: inbox.KindRequest, From: "UA", Text: "a request"},
			{ID: "0198c001-0000-7000-8000-00000000aaa2", Kind: inbox.KindReply, InReplyTo: "0198c001-0000-7000-8000-00000000ffff", From: "UF", Text: "a 'reply'"},
		} {
			n, _ := msgs.NextSequence()
			var k [8]byte
			binary.BigEndian.PutUint64(k[:], n)
			m.Seq, m.State = n, inbox.Unread
			v, _ := json.Marshal(m)
			if err := msgs.Put(k[:], v); err != nil {
				return err
			}
			if err := ids.Put([]byte(m.ID), k[:]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	q, err := inbox.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if m, err := q.Get("1"); err != nil || m.Kind != inbox.KindRequest {
		t.Errorf("the request: %+v %v", m, err)
	}
	if m, err := q.Get("2"); err != nil || m.Kind != inbox.KindUnsolicited || m.Text != "a 'reply'" {
		t.Errorf("the old reply: %+v %v", m, err)
	}
	if got, err := q.Contacts(); err != nil || len(got) != 0 {
		t.Errorf("contacts from an old file's replies: %v %v", got, err)
	}
}
