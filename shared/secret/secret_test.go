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
