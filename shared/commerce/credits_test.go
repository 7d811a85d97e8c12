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
