package secret

import (
	"testing"
	"time"
)

func TestCodeCheck(t *testing.T) {
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	c := NewCode("ana@example.org", "123456", now.Add(15*time.Minute), 3)
	if c.CodeHash == "123456" || c.CodeHash != HashCode("ana@example.org", "123456") {
		t.Fatalf("the code must be stored hashed with its context: %+v", c)
	}
	// The same code issued for another context does not match.
	if v := c.Check("bo@example.org", "123456", now); v != CodeWrong || c.AttemptsLeft != 2 {
		t.Fatalf("other context: %v %d", v, c.AttemptsLeft)
	}
	if v := c.Check("ana@example.org", "000000", now); v != CodeWrong || c.AttemptsLeft != 1 {
		t.Fatalf("wrong: %v %d", v, c.AttemptsLeft)
	}
	if v := c.Check("ana@example.org", "123456", now.Add(15*time.Minute-time.Millisecond)); v != CodeMatch {
		t.Fatalf("right, just in time: %v", v)
	}
	if v := c.Check("ana@example.org", "123456", now.Add(15*time.Minute)); v != CodeExpired || c.AttemptsLeft != 1 {
		t.Fatalf("expired: %v %d", v, c.AttemptsLeft)
	}
	if v := c.Check("ana@example.org", "000000", now); v != CodeBurned || c.AttemptsLeft != 0 {
		t.Fatalf("last try: %v %d", v, c.AttemptsLeft)
	}
}

func TestCodeHasher(t *testing.T) {
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	if (CodeHasher{}).Hash("ctx", "123456") != HashCode("ctx", "123456") || NewCodeHasher(nil).Keyed() {
		t.Fatal("without a key the hash is HashCode")
	}
	k1 := NewCodeHasher([]byte("0123456789abcdef0123456789abcdef"))
	k2 := NewCodeHasher([]byte("fedcba9876543210fedcba9876543210"))
	h := k1.Hash("ctx", "123456")
	if !k1.Keyed() || h == HashCode("ctx", "123456") || h == k2.Hash("ctx", "123456") || h == k1.Hash("other", "123456") || len(h) != 64 {
		t.Fatalf("keyed hash %q must depend on the key and the context and differ from the unkeyed one", h)
	}
	c := k1.NewCode("ctx", "123456", now.Add(time.Minute), 3)
	if v := k2.Check(&c, "ctx", "123456", now); v != CodeWrong {
		t.Fatalf("checked with another key: %v", v)
	}
	if v := (CodeHasher{}).Check(&c, "ctx", "123456", now); v != CodeWrong {
		t.Fatalf("checked without the key: %v", v)
	}
	if v := k1.Check(&c, "ctx", "123456", now); v != CodeMatch {
		t.Fatalf("checked with its key: %v", v)
	}
}
