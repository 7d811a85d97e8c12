package commerce_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/commerce"
)

func TestParseAndFormatCredits(t *testing.T) {
	for in, want := range map[string]int64{"25": 25_000_000, "2.5": 2_500_000, "0.000001": 1, ".5": 500_000, " 1.100000 ": 1_100_000} {
		got, err := commerce.ParseCredits(in)
		if err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "+1", "1.", "1.0000001", "abc", "1e6", "0.0", "9007199255"} {
		if got, err := commerce.ParseCredits(bad); err == nil {
			t.Errorf("%q: %d accepted", bad, got)
		}
	}
	for micro, want := range map[int64]string{25_000_000: "25", 2_500_000: "2.5", 1: "0.000001", -1_100_000: "-1.1", 0: "0"} {
		if got := commerce.FormatCredits(micro); got != want {
			t.Errorf("%d: %q, want %q", micro, got, want)
		}
	}
}

// FuzzParseCredits: an accepted amount is positive, in range, and written
// back it reads the same.
func FuzzParseCredits(f *testing.F) {
	for _, s := range []string{"25", "2.5", "0.000001", "-1", "1e6", "9007199254.740991"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := commerce.ParseCredits(s)
		if err != nil {
			return
		}
		if n <= 0 || n > 1<<53-1 {
			t.Fatalf("%q: %d", s, n)
		}
		if back, err := commerce.ParseCredits(commerce.FormatCredits(n)); err != nil || back != n {
			t.Fatalf("%q: %d, written %q, read %d %v", s, n, commerce.FormatCredits(n), back, err)
		}
	})
}
