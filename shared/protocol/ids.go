package protocol

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// MaxIDBytes bounds an envelope's id, and the in_reply_to that names one,
// at decode (INVALID_ENVELOPE). This mesh's ids are UUIDv7 (36 bytes);
// other senders may use other forms, so the bound is generous, but an id is
// a key in every receiver's dedup memory and in the memory of answered
// requests, so a sender may not make it as long as the envelope.
const MaxIDBytes = 128

// ids makes UUIDv7 envelope ids: 48 bits of Unix milliseconds, then a 12-bit
// sequence in rand_a so ids made in the same millisecond still sort in
// creation order (the upstream SDK does the same), then 62 random bits.
type idSource struct {
	mu     sync.Mutex
	lastMS int64
	seq    uint16
}

var ids idSource // guarded by its mutex; the only process-wide state, like crypto/rand's

// NewID returns a fresh UUIDv7 in RFC 9562 text form.
func NewID() string {
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	var b [36]byte
	return string(ids.appendNext(b[:0], time.Now(), rnd))
}

// appendNext appends a fresh UUIDv7 to dst. rnd is the caller's randomness:
// eight bytes for the id's random tail, two for where the sequence of a new
// millisecond starts, so no random read happens under the lock.
func (s *idSource) appendNext(dst []byte, now time.Time, rnd [10]byte) []byte {
	ms := now.UnixMilli()
	s.mu.Lock()
	if ms > s.lastMS {
		s.lastMS = ms
		// Start each millisecond at a random point in the lower half so the
		// sequence has room to climb before it must borrow the next ms.
		s.seq = binary.BigEndian.Uint16(rnd[8:]) & 0x7FF
	} else {
		s.seq++
		if s.seq > 0xFFF { // exhausted this ms: borrow the next one
			s.lastMS++
			s.seq = 0
		}
		ms = s.lastMS
	}
	seq := s.seq
	s.mu.Unlock()

	var u [16]byte
	u[0] = byte(ms >> 40)
	u[1] = byte(ms >> 32)
	u[2] = byte(ms >> 24)
	u[3] = byte(ms >> 16)
	u[4] = byte(ms >> 8)
	u[5] = byte(ms)
	u[6] = 0x70 | byte(seq>>8) // version 7
	u[7] = byte(seq)
	copy(u[8:], rnd[:8])
	u[8] = u[8]&0x3F | 0x80 // variant 10
	return appendUUID(dst, u)
}

func appendUUID(dst []byte, u [16]byte) []byte {
	dst = hex.AppendEncode(dst, u[0:4])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[4:6])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[6:8])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, u[8:10])
	dst = append(dst, '-')
	return hex.AppendEncode(dst, u[10:])
}

// NewTraceID returns 32 lowercase hex characters (W3C trace-id).
func NewTraceID() string { return randomHex(16) }

// NewSpanID returns 16 lowercase hex characters (W3C span-id).
func NewSpanID() string { return randomHex(8) }

func randomHex(n int) string {
	var b [16]byte
	_, _ = rand.Read(b[:n])
	var h [32]byte
	hex.Encode(h[:], b[:n])
	return string(h[:2*n])
}

// TimeFormat is the protocol's timestamp form: RFC 3339, UTC, milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z"

// FormatTime renders t in the protocol's timestamp form.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// ParseTime reads any RFC 3339 instant, including numeric offsets and any
// number of fractional digits (receivers must, upstream-notes §1.1).
func ParseTime(s string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, s)
}

// RandomToken is 128 random bits as one subject token (unpadded base32,
// 26 characters): a reply subject under a prefix others may publish to
// must not be guessable from ones seen before, as nuids are.
func RandomToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("protocol: crypto/rand: " + err.Error())
	}
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])
}
