package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
)

// AnchorStore keeps the anchor records, one per date. The control plane
// backs it with its document store (a transaction per Update); MemAnchors
// and StreamAnchors are the two implementations here.
type AnchorStore interface {
	// Create stores a new anchor; ErrAnchorExists when its date has one.
	Create(ctx context.Context, a *Anchor) error
	// Get returns the anchor of date; ErrNoAnchor when there is none.
	Get(ctx context.Context, date string) (*Anchor, error)
	// Update reads the anchor of date, lets fn change it and writes it
	// back only if nobody wrote in between, trying again otherwise (fn
	// may run more than once). fn returning ErrNoChange writes nothing.
	// It returns the anchor as stored afterwards.
	Update(ctx context.Context, date string, fn func(*Anchor) error) (*Anchor, error)
	// List returns up to limit anchors, newest date first.
	List(ctx context.Context, limit int) ([]*Anchor, error)
}

// Errors of an AnchorStore.
var (
	ErrNoAnchor     = errors.New("audit: no anchor for that date")
	ErrAnchorExists = errors.New("audit: that date already has an anchor")
	// ErrNoChange is returned by an Update function that changes nothing.
	ErrNoChange = errors.New("audit: no change")
)

// MemAnchors is an AnchorStore in memory, for tests.
type MemAnchors struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemAnchors is an empty MemAnchors.
func NewMemAnchors() *MemAnchors { return &MemAnchors{m: map[string][]byte{}} }

// Create implements AnchorStore.
func (s *MemAnchors) Create(_ context.Context, a *Anchor) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[a.Date]; ok {
		return ErrAnchorExists
	}
	s.m[a.Date] = b
	return nil
}

// Get implements AnchorStore.
func (s *MemAnchors) Get(_ context.Context, date string) (*Anchor, error) {
	s.mu.Lock()
	b, ok := s.m[date]
	s.mu.Unlock()
	if !ok {
		return nil, ErrNoAnchor
	}
	return decodeAnchor(b)
}

// Update implements AnchorStore.
func (s *MemAnchors) Update(_ context.Context, date string, fn func(*Anchor) error) (*Anchor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[date]
	if !ok {
		return nil, ErrNoAnchor
	}
	a, err := decodeAnchor(b)
	if err != nil {
		return nil, err
	}
	if err := fn(a); errors.Is(err, ErrNoChange) {
		return decodeAnchor(b)
	} else if err != nil {
		return nil, err
	}
	if a.Date != date {
		return nil, errors.New("audit: an update may not change an anchor's date")
	}
	if s.m[date], err = json.Marshal(a); err != nil {
		return nil, err
	}
	return a, nil
}

// List implements AnchorStore.
func (s *MemAnchors) List(_ context.Context, limit int) ([]*Anchor, error) {
	s.mu.Lock()
	dates := make([]string, 0, len(s.m))
	for d := range s.m {
		dates = append(dates, d)
	}
	slices.Sort(dates)
	slices.Reverse(dates)
	if limit > 0 && len(dates) > limit {
		dates = dates[:limit]
	}
	raws := make([][]byte, len(dates))
	for i, d := range dates {
		raws[i] = s.m[d]
	}
	s.mu.Unlock()
	out := make([]*Anchor, len(raws))
	for i, b := range raws {
		a, err := decodeAnchor(b)
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

func decodeAnchor(b []byte) (*Anchor, error) {
	var a Anchor
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("audit: anchor record: %w", err)
	}
	return &a, nil
}

// StreamAnchors keeps the anchor records in the audit stream, one subject
// per date (AnchorPrefix + date), so one machine needs no other store and
// no extra stream: the last message of a subject is the record, each write
// a compare-and-set on the subject's last sequence that rolls up (purges)
// the versions before it.
type StreamAnchors struct {
	c *Chains
}

// Anchors is the anchor store on the audit stream.
func (c *Chains) Anchors() *StreamAnchors { return &StreamAnchors{c: c} }

// get returns the anchor of date and its stream sequence.
func (s *StreamAnchors) get(ctx context.Context, date string) (*Anchor, uint64, error) {
	if _, err := ParseDate(date); err != nil {
		return nil, 0, err
	}
	m, err := s.c.stream.GetLastMsgForSubject(ctx, AnchorPrefix+date)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, ErrNoAnchor
	}
	if err != nil {
		return nil, 0, fmt.Errorf("audit: read the anchor of %s: %w", date, err)
	}
	a, err := decodeAnchor(m.Data)
	return a, m.Sequence, err
}

// put writes a as the anchor of its date if the subject's last sequence
// is still last (0: no anchor yet).
func (s *StreamAnchors) put(ctx context.Context, a *Anchor, last uint64) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: AnchorPrefix + a.Date, Data: b, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	// The id names this very write, so a resend of it is not stored twice.
	// (One server checks the expected sequence first and refuses such a
	// resend as a conflict: Create then finds the anchor there, and Update
	// applies its function again to what was stored, which every function
	// of the anchorer tolerates.)
	sum := sha256.Sum256(b)
	id := fmt.Sprintf("anchor:%s:%d:%s", a.Date, last, hex.EncodeToString(sum[:16]))
	_, _, err = s.c.publishOnce(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last), jetstream.WithMsgID(id))
	return err
}

// Create implements AnchorStore.
func (s *StreamAnchors) Create(ctx context.Context, a *Anchor) error {
	if _, err := ParseDate(a.Date); err != nil {
		return err
	}
	err := s.put(ctx, a, 0)
	if bus.IsConflict(err) {
		return ErrAnchorExists
	}
	if err != nil {
		return fmt.Errorf("audit: store the anchor of %s: %w", a.Date, err)
	}
	return nil
}

// Get implements AnchorStore.
func (s *StreamAnchors) Get(ctx context.Context, date string) (*Anchor, error) {
	a, _, err := s.get(ctx, date)
	return a, err
}

// Update implements AnchorStore.
func (s *StreamAnchors) Update(ctx context.Context, date string, fn func(*Anchor) error) (*Anchor, error) {
	for conflicts := 0; ; {
		a, seq, err := s.get(ctx, date)
		if err != nil {
			return nil, err
		}
		if err := fn(a); errors.Is(err, ErrNoChange) {
			return s.Get(ctx, date)
		} else if err != nil {
			return nil, err
		}
		if a.Date != date {
			return nil, errors.New("audit: an update may not change an anchor's date")
		}
		err = s.put(ctx, a, seq)
		switch {
		case err == nil:
			return a, nil
		case bus.IsConflict(err):
			if conflicts++; conflicts >= maxConflicts {
				return nil, fmt.Errorf("audit: update the anchor of %s: %w", date, ErrContention)
			}
			if err := sleep(ctx, jitter(conflicts)); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("audit: update the anchor of %s: %w", date, err)
		}
	}
}

// List implements AnchorStore.
func (s *StreamAnchors) List(ctx context.Context, limit int) ([]*Anchor, error) {
	subjects, err := s.c.subjects(ctx, AnchorPrefix)
	if err != nil || len(subjects) == 0 {
		return nil, err
	}
	slices.Reverse(subjects) // dates sort as strings: newest first
	if limit > 0 && len(subjects) > limit {
		subjects = subjects[:limit]
	}
	last, err := s.c.lastOf(ctx, subjects, time.Time{})
	if err != nil {
		return nil, err
	}
	out := make([]*Anchor, 0, len(subjects))
	for _, subj := range subjects {
		m, ok := last[subj]
		if !ok {
			continue
		}
		a, err := decodeAnchor(m.Data)
		if err != nil {
			return nil, err
		}
		if AnchorPrefix+a.Date != subj || !strings.HasPrefix(subj, AnchorPrefix) {
			return nil, fmt.Errorf("audit: the record on %s is the anchor of %s", subj, a.Date)
		}
		out = append(out, a)
	}
	return out, nil
}
