package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Rate is the size of a limit: at most Max events per Window. Its text
// form, in flags and environment variables, is "<max>/<window>" with a Go
// duration for the window: "20/1h", "5/15m".
type Rate struct {
	Max    int
	Window time.Duration
}

// Limit is the limit of this rate called name, counting key.
func (r Rate) Limit(name, key string) Limit {
	return Limit{Name: name, Key: key, Max: r.Max, Window: r.Window}
}

// Valid reports whether r can be counted (a positive max and window).
func (r Rate) Valid() bool { return r.Max > 0 && r.Window > 0 }

// Or is r, or def when r is the zero Rate (an unset field).
func (r Rate) Or(def Rate) Rate {
	if r == (Rate{}) {
		return def
	}
	return r
}

// String is the text form, with the window in its shortest spelling
// ("20/1h", not "20/1h0m0s").
func (r Rate) String() string { return strconv.Itoa(r.Max) + "/" + FormatWindow(r.Window) }

// FormatWindow spells a window the short way: "1h", "15m", "1h30m", "90s".
func FormatWindow(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ParseRate reads the text form "<max>/<window>". The max is a whole
// number of at least 1; the window a Go duration of at least one second
// and at most 31 days (a counter document lives two windows).
func ParseRate(s string) (Rate, error) {
	max, window, ok := strings.Cut(strings.TrimSpace(s), "/")
	n, err := strconv.Atoi(strings.TrimSpace(max))
	if !ok || err != nil || n < 1 {
		return Rate{}, fmt.Errorf("want <count>/<window> such as 20/1h, not %q", s)
	}
	d, err := time.ParseDuration(strings.TrimSpace(window))
	if err != nil || d < time.Second || d > 31*24*time.Hour {
		return Rate{}, fmt.Errorf("want <count>/<window> with a window from 1s to 744h, such as 20/1h, not %q", s)
	}
	return Rate{Max: n, Window: d}, nil
}

// Refusal is the 429 of an exceeded limit, as every store-limited route
// answers it: RATE_LIMITED with retry_after_ms (and Retry-After), the
// limit's name in details.limit, and a message that says what was
// limited (what: "guest credentials from your address"), how much is
// allowed and when to come back.
func Refusal(ex *Exceeded, what string) *errs.Error {
	after := max(ex.RetryAfter.Milliseconds(), 1)
	return errs.Newf(errs.RateLimited, "too many %s (at most %d per %s); retry in %d s",
		what, ex.Limit.Max, FormatWindow(ex.Limit.Window), (after+999)/1000).
		WithRetryAfter(after).WithDetail("limit", ex.Limit.Name)
}

// Knob is one operator setting of a limit: a command-line flag, the
// environment variable that sets it both in meshd and in the Cloud
// Functions, its default as text and the help line. Set parses a value into
// the setting it was made for. A service lists its knobs (guest.Limits,
// account.Limits) so the binaries read, document and validate them the
// same way.
type Knob struct {
	Flag    string // without dashes: "limit-guest-per-address"
	Env     string // "MESH_LIMIT_GUEST_PER_ADDRESS"
	Default string
	Help    string
	Set     func(string) error
}

// envName is the variable of a flag: MESH_ and the flag in capitals.
func envName(flag string) string {
	return "MESH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// RateKnob is the knob of a Rate; its default is *r when called.
func RateKnob(flag, help string, r *Rate) Knob {
	return Knob{Flag: flag, Env: envName(flag), Default: r.String(), Help: help, Set: func(s string) error {
		v, err := ParseRate(s)
		if err != nil {
			return err
		}
		*r = v
		return nil
	}}
}

// CountKnob is the knob of a count of at least min; its default is *n
// when called.
func CountKnob(flag, help string, min int, n *int) Knob {
	return Knob{Flag: flag, Env: envName(flag), Default: strconv.Itoa(*n), Help: help, Set: func(s string) error {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < min {
			return fmt.Errorf("want a whole number of at least %d, not %q", min, s)
		}
		*n = v
		return nil
	}}
}

// Count64Knob is CountKnob for an int64.
func Count64Knob(flag, help string, min int64, n *int64) Knob {
	return Knob{Flag: flag, Env: envName(flag), Default: strconv.FormatInt(*n, 10), Help: help, Set: func(s string) error {
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || v < min {
			return fmt.Errorf("want a whole number of at least %d, not %q", min, s)
		}
		*n = v
		return nil
	}}
}

// DurationKnob is the knob of a Go duration ("24h", "90m") of at least
// min; its default is *d when called.
func DurationKnob(flag, help string, min time.Duration, d *time.Duration) Knob {
	return Knob{Flag: flag, Env: envName(flag), Default: d.String(), Help: help, Set: func(s string) error {
		v, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || v < min {
			return fmt.Errorf("want a duration of at least %s, such as 24h or 90m, not %q", min, s)
		}
		*d = v
		return nil
	}}
}

// SizeKnob is the knob of a size in bytes of at least min, written as a
// whole number of bytes or with a unit: "65536", "64KiB", "1MiB", "1GiB".
// Its default is *n when called.
func SizeKnob(flag, help string, min int64, n *int64) Knob {
	return Knob{Flag: flag, Env: envName(flag), Default: FormatSize(*n), Help: help, Set: func(s string) error {
		v, err := ParseSize(s)
		if err != nil || v < min {
			return fmt.Errorf("want a size of at least %s, such as 64KiB or 1GiB, not %q", FormatSize(min), s)
		}
		*n = v
		return nil
	}}
}

// sizeUnits are the units a size may carry, largest first.
var sizeUnits = []struct {
	name string
	n    int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// ParseSize reads a size: a whole number of bytes, or one with a KiB, MiB
// or GiB unit.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mul := int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s, u.name); ok {
			s, mul = strings.TrimSpace(rest), u.n
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mul {
		return 0, fmt.Errorf("not a size: %q", s)
	}
	return v * mul, nil
}

// FormatSize spells n with the largest unit that divides it.
func FormatSize(n int64) string {
	for _, u := range sizeUnits {
		if n > 0 && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// FromEnv sets each knob from its environment variable through getenv,
// leaving the ones not set at their defaults. An error names the variable.
func FromEnv(getenv func(string) string, knobs ...Knob) error {
	for _, k := range knobs {
		if v := getenv(k.Env); v != "" {
			if err := k.Set(v); err != nil {
				return fmt.Errorf("%s: %w", k.Env, err)
			}
		}
	}
	return nil
}
