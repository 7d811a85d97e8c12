// Package inbox is the adapter's local message queue (spec §4.2, inbox
// mode): requests wait here, durably, until the person or program behind
// the adapter replies to them or acknowledges them. It is a bbolt file in
// the state directory, so messages survive a restart of the adapter, and
// every change is one transaction, so a crash never half-records one.
//
// A message has a short local number (1, 2, 3, ...) for people to type,
// and its envelope id; commands accept either. A message is the same
// message as one already stored only when both its sender and its envelope
// id are the same (upstream-notes §1.7): the sender chooses the id, so two
// senders may use one id, and neither may shadow the other's message.
package inbox

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// States of a message.
const (
	Unread  = "unread"
	Replied = "replied"
	// Refused is a request answered with a refusal (reply --refuse-budget).
	Refused = "refused"
	Acked   = "acked"
)

// Kinds of message.
const (
	KindRequest = "request"
	// KindReply is an answer to a request this agent sent, from the agent
	// it was sent to (checked against the record of sent requests).
	KindReply = "reply"
	// KindUnsolicited is an answer naming a request this agent did not
	// send to its sender: anyone may publish to an agent's inbox, so a
	// signed respond proves who wrote it, never that it was asked for.
	KindUnsolicited = "unsolicited"
)

// Message is one request held for the agent, or an answer that arrived
// when no send waited for it.
type Message struct {
	// Seq is the local number; ID the envelope's id.
	Seq uint64 `json:"seq"`
	ID  string `json:"id"`
	// Kind is KindRequest (someone asks this agent), KindReply (a late
	// answer to something this agent sent, kept so it is not lost) or
	// KindUnsolicited (an answer to nothing this agent sent that sender);
	// InReplyTo names the request the answer says it answers.
	Kind      string `json:"kind,omitempty"`
	InReplyTo string `json:"in_reply_to,omitempty"`
	// From is the sender's agent id; Handle its verified handle, when known.
	From   string `json:"from"`
	Handle string `json:"handle,omitempty"`
	// Offering is the requested offering; Text the sender's text exactly
	// as sent (unframed); Framed the same text inside the provenance frame,
	// which is what a program should read.
	Offering string `json:"offering,omitempty"`
	Text     string `json:"text"`
	Framed   string `json:"framed"`
	TraceID  string `json:"trace_id,omitempty"`
	// BudgetLine is the budget provenance line, when the request carried
	// a budget.
	BudgetLine string          `json:"budget_line,omitempty"`
	Budget     json.RawMessage `json:"budget,omitempty"`
	ReceivedAt string          `json:"received_at"`
	State      string          `json:"state"`
	RepliedAt  string          `json:"replied_at,omitempty"`
	// Envelope is the verified request as received, kept so a reply can
	// be addressed after a restart.
	Envelope json.RawMessage `json:"envelope"`
}

// ErrNotFound is a reference that names no message.
var ErrNotFound = errors.New("no such message")

var (
	bucketMsgs = []byte("messages") // seq (8 bytes, big endian) → Message
	// bucketKeys is the duplicate check: sender + "\x00" + envelope id →
	// seq. A queue file written before it existed gets it on Open, built
	// from the stored messages.
	bucketKeys = []byte("keys")
	// bucketIDs finds a message by its envelope id (or a prefix of it):
	// envelope id → seq, or ambiguousID when messages from more than one
	// sender carry that id (then only the number names one of them).
	bucketIDs = []byte("ids")
	// bucketSent is who this agent sent messages to: agent id → the last
	// time (RFC 3339). With the replied messages, it is who this agent has
	// exchanged messages with (Contacts).
	bucketSent = []byte("sent")
	// bucketRequests is every request this agent sent, recorded before it
	// is published: envelope id → sentRequest. An answer is a reply only
	// when its in_reply_to is here with its sender as the recipient. The
	// ids are UUIDv7, so key order is age order and pruning reads from the
	// front. A queue file written before it existed gets it on Open, and
	// the replies it kept become unsolicited: nothing can vouch for them.
	bucketRequests = []byte("requests")
)

// RequestMemory is how long a sent request is remembered: an answer to an
// older one is shown as unsolicited. A person may take weeks to answer a
// held message, so it is long.
const RequestMemory = 90 * 24 * time.Hour

// pruneBatch bounds the old requests one NoteRequest forgets, so a send
// never waits on a long cleanup.
const pruneBatch = 64

// sentRequest is one entry of bucketRequests.
type sentRequest struct {
	To string `json:"to"`
	At string `json:"at"` // RFC 3339
}

// ambiguousID is bucketIDs' value for an id that more than one sender used.
var ambiguousID = []byte("ambiguous")

// dedupKey is a message's identity: who sent it, and the id they chose.
func dedupKey(from, id string) []byte { return []byte(from + "\x00" + id) }

// Queue is an open queue file.
type Queue struct {
	db *bolt.DB
}

// Open opens (creating) the queue file at path, mode 0600. A second
// process opening the same file waits up to timeout for the first to
// close it.
func Open(path string, timeout time.Duration) (*Queue, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("inbox %s is in use by another adapter", path)
		}
		return nil, fmt.Errorf("inbox %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMsgs, bucketIDs, bucketSent} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketRequests) == nil {
			if err := migrateRequests(tx); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketKeys) != nil {
			return nil
		}
		return migrateKeys(tx)
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("inbox %s: %w", path, err)
	}
	return &Queue{db: db}, nil
}

// migrateKeys builds bucketKeys for a queue file written when messages were
// told apart by envelope id alone: every stored message is indexed under
// its (sender, id). Such a file holds at most one message per id, so its
// bucketIDs stays valid as it is. It runs once, in Open's transaction.
func migrateKeys(tx *bolt.Tx) error {
	keys, err := tx.CreateBucket(bucketKeys)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketMsgs).ForEach(func(k, v []byte) error {
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		return keys.Put(dedupKey(m.From, m.ID), append([]byte(nil), k...))
	})
}

// migrateRequests creates bucketRequests for a queue file written before
// sent requests were recorded. The replies that file kept were taken as
// replies on the strength of their in_reply_to alone, which anyone can
// write: with no record to check them against, they are marked
// unsolicited. It runs once, in Open's transaction.
func migrateRequests(tx *bolt.Tx) error {
	if _, err := tx.CreateBucket(bucketRequests); err != nil {
		return err
	}
	msgs := tx.Bucket(bucketMsgs)
	type change struct{ k, v []byte }
	var changes []change
	err := msgs.ForEach(func(k, v []byte) error {
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		if m.Kind != KindReply {
			return nil
		}
		m.Kind = KindUnsolicited
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		changes = append(changes, change{append([]byte(nil), k...), b})
		return nil
	})
	if err != nil {
		return err
	}
	for _, c := range changes { // bbolt forbids writes inside ForEach
		if err := msgs.Put(c.k, c.v); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the file.
func (q *Queue) Close() error { return q.db.Close() }

func seqKey(n uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], n)
	return k[:]
}

// Put stores m as a new unread message and returns it with its number. A
// message from the same sender with the same envelope id as a stored one
// (a redelivery) is not stored twice: the stored one is returned, and
// added is false. The same id from another sender is another message.
func (q *Queue) Put(m Message) (stored Message, added bool, err error) {
	err = q.db.Update(func(tx *bolt.Tx) error {
		keys, ids, msgs := tx.Bucket(bucketKeys), tx.Bucket(bucketIDs), tx.Bucket(bucketMsgs)
		if k := keys.Get(dedupKey(m.From, m.ID)); k != nil {
			return json.Unmarshal(msgs.Get(k), &stored)
		}
		n, err := msgs.NextSequence()
		if err != nil {
			return err
		}
		m.Seq, m.State = n, Unread
		if m.Kind == "" {
			m.Kind = KindRequest
		}
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		if err := msgs.Put(seqKey(n), b); err != nil {
			return err
		}
		stored, added = m, true
		if err := keys.Put(dedupKey(m.From, m.ID), seqKey(n)); err != nil {
			return err
		}
		if ids.Get([]byte(m.ID)) != nil {
			// Another sender's message has this id: the id no longer
			// names one message.
			return ids.Put([]byte(m.ID), ambiguousID)
		}
		return ids.Put([]byte(m.ID), seqKey(n))
	})
	if err != nil {
		return Message{}, false, fmt.Errorf("inbox: store: %w", err)
	}
	return stored, added, nil
}

// List returns the messages in arrival order; with all false, only unread
// ones.
func (q *Queue) List(all bool) ([]Message, error) {
	out := []Message{}
	err := q.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMsgs).ForEach(func(_, v []byte) error {
			var m Message
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			if all || m.State == Unread {
				out = append(out, m)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return out, nil
}

// Get finds a message by reference: its local number, its envelope id, or
// a unique prefix of its envelope id (at least 8 characters).
func (q *Queue) Get(ref string) (Message, error) {
	var m Message
	err := q.db.View(func(tx *bolt.Tx) error {
		k, err := resolve(tx, ref)
		if err != nil {
			return err
		}
		return json.Unmarshal(tx.Bucket(bucketMsgs).Get(k), &m)
	})
	return m, err
}

func resolve(tx *bolt.Tx, ref string) ([]byte, error) {
	ref = strings.TrimPrefix(strings.TrimSpace(ref), "#")
	msgs, ids := tx.Bucket(bucketMsgs), tx.Bucket(bucketIDs)
	if n, err := strconv.ParseUint(ref, 10, 64); err == nil && len(ref) < 12 {
		if k := seqKey(n); msgs.Get(k) != nil {
			return k, nil
		}
		return nil, fmt.Errorf("%w: #%d", ErrNotFound, n)
	}
	if k := ids.Get([]byte(ref)); k != nil {
		if len(k) != 8 {
			return nil, fmt.Errorf("%q names messages from more than one sender; use its number from `inbox`", ref)
		}
		return k, nil
	}
	if len(ref) < 8 {
		return nil, fmt.Errorf("%w: %q (use the number from `inbox`, or at least 8 characters of the id)", ErrNotFound, ref)
	}
	var found []byte
	c := ids.Cursor()
	for k, v := c.Seek([]byte(ref)); k != nil && strings.HasPrefix(string(k), ref); k, v = c.Next() {
		if found != nil {
			return nil, fmt.Errorf("%q names more than one message; give more of the id", ref)
		}
		if len(v) != 8 {
			return nil, fmt.Errorf("%q names messages from more than one sender; use its number from `inbox`", ref)
		}
		found = v
	}
	if found == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	return found, nil
}

// ErrNotUnread is Transition's refusal of a message that was already
// replied to or acknowledged.
var ErrNotUnread = errors.New("the message is no longer unread")

// Transition moves the message named by ref to state (Replied, Refused or Acked),
// in one transaction, if it is still unread and check (when set), given
// the stored message, allows it; it returns the updated message. A message
// already replied to or acknowledged is refused with ErrNotUnread: of two
// callers that both saw it unread, only one moves it.
func (q *Queue) Transition(ref, state string, at time.Time, check func(Message) error) (Message, error) {
	var m Message
	err := q.db.Update(func(tx *bolt.Tx) error {
		k, err := resolve(tx, ref)
		if err != nil {
			return err
		}
		msgs := tx.Bucket(bucketMsgs)
		if err := json.Unmarshal(msgs.Get(k), &m); err != nil {
			return err
		}
		if m.State != Unread {
			return fmt.Errorf("%w: message #%d is already %s", ErrNotUnread, m.Seq, m.State)
		}
		if check != nil {
			if err := check(m); err != nil {
				return err
			}
		}
		m.State = state
		if state == Replied || state == Refused {
			m.RepliedAt = at.UTC().Format(time.RFC3339Nano)
		}
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		return msgs.Put(k, b)
	})
	return m, err
}

// NoteSent records that this agent sent a message to agentID at at.
func (q *Queue) NoteSent(agentID string, at time.Time) error {
	err := q.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSent).Put([]byte(agentID), []byte(at.UTC().Format(time.RFC3339)))
	})
	if err != nil {
		return fmt.Errorf("inbox: note a send: %w", err)
	}
	return nil
}

// NoteRequest records that this agent sent request id to agent to at at.
// It is called before the request is published, so an answer can never
// arrive before its record. Requests older than RequestMemory are
// forgotten a few at a time.
func (q *Queue) NoteRequest(id, to string, at time.Time) error {
	if id == "" || to == "" {
		return errors.New("inbox: note a request: empty id or recipient")
	}
	err := q.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRequests)
		v, err := json.Marshal(sentRequest{To: to, At: at.UTC().Format(time.RFC3339)})
		if err != nil {
			return err
		}
		if err := b.Put([]byte(id), v); err != nil {
			return err
		}
		return pruneRequests(b, at.Add(-RequestMemory))
	})
	if err != nil {
		return fmt.Errorf("inbox: note a request: %w", err)
	}
	return nil
}

// pruneRequests deletes up to pruneBatch requests sent before cutoff,
// oldest first; it stops at the first younger one.
func pruneRequests(b *bolt.Bucket, cutoff time.Time) error {
	c := b.Cursor()
	for range pruneBatch {
		k, v := c.First()
		if k == nil {
			return nil
		}
		var r sentRequest
		if err := json.Unmarshal(v, &r); err == nil {
			if at, err := time.Parse(time.RFC3339, r.At); err == nil && !at.Before(cutoff) {
				return nil
			}
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// SentTo is the agent this agent sent request id to, and whether it sent
// it at all (within RequestMemory).
func (q *Queue) SentTo(id string) (to string, ok bool, err error) {
	err = q.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRequests).Get([]byte(id))
		if v == nil {
			return nil
		}
		var r sentRequest
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		to, ok = r.To, true
		return nil
	})
	if err != nil {
		return "", false, fmt.Errorf("inbox: sent requests: %w", err)
	}
	return to, ok, nil
}

// Contacts are the agents this agent has exchanged messages with, sorted:
// the senders of requests it replied to (not those it only acknowledged or
// refused, nor those still unread: reaching the inbox is not an exchange),
// the agents it sent messages to (NoteSent), and the senders of replies to
// what it sent (kept in the queue as KindReply; an unsolicited answer makes
// nobody a contact). A queue file from before sends were recorded holds no
// sends, and the replies it kept became unsolicited (migrateRequests).
func (q *Queue) Contacts() ([]string, error) {
	seen := map[string]bool{}
	err := q.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMsgs).ForEach(func(_, v []byte) error {
			var m Message
			if err := json.Unmarshal(v, &m); err != nil {
				return err
			}
			if m.From != "" && (m.Kind == KindReply || m.State == Replied) {
				seen[m.From] = true
			}
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketSent).ForEach(func(k, _ []byte) error {
			seen[string(k)] = true
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: contacts: %w", err)
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Strings(out)
	return out, nil
}
