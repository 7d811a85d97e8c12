package commerce

import (
	"fmt"
	"strconv"
	"strings"

	"agentmesh.dev/mesh/shared/jsonv"
)

// MicroPerCredit is how many micro-credits make one credit (XCR).
const MicroPerCredit = 1_000_000

// ParseCredits reads an amount of credits written for people: a whole
// number ("25") or one with up to six decimals ("2.5", "0.000001"), and
// returns it in micro-credits. Zero, a negative amount, more than six
// decimals or more than 2^53−1 micro-credits is refused.
func ParseCredits(s string) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, dotted := strings.Cut(s, ".")
	bad := fmt.Errorf("%q is not an amount of credits: a positive number with at most six decimals, such as 25 or 2.5", s)
	if whole == "" && frac == "" || len(frac) > 6 || dotted && frac == "" || strings.ContainsAny(whole+frac, "+- ") {
		return 0, bad
	}
	if whole == "" {
		whole = "0"
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, bad
	}
	var f int64
	if frac != "" {
		if f, err = strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64); err != nil {
			return 0, bad
		}
	}
	if w > (jsonv.MaxSafeInteger-f)/MicroPerCredit {
		return 0, fmt.Errorf("%s credits is more than the mesh can count", s)
	}
	micro := w*MicroPerCredit + f
	if micro <= 0 {
		return 0, bad
	}
	return micro, nil
}

// FormatCredits writes micro-credits as credits for people: "2.5",
// "-1.1", "0.000001", "25".
func FormatCredits(micro int64) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	out := sign + strconv.FormatInt(micro/MicroPerCredit, 10)
	if f := micro % MicroPerCredit; f != 0 {
		out += "." + strings.TrimRight(fmt.Sprintf("%06d", f), "0")
	}
	return out
}
