package protocol_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

type inner struct {
	B string `json:"b"`
	A *int   `json:"a,omitempty"`
}

type embedded struct {
	Shared string `json:"shared"`
}

type goValue struct {
	embedded
	Zeta     string            `json:"zeta"`
	Alpha    int64             `json:"alpha"`
	Empty    string            `json:"empty,omitempty"`
	ZeroTime time.Time         `json:"zero_time,omitzero"`
	When     time.Time         `json:"when"`
	Raw      json.RawMessage   `json:"raw"`
	Bytes    []byte            `json:"bytes"`
	Inner    inner             `json:"inner"`
	Ptr      *inner            `json:"ptr"`
	Map      map[string]string `json:"map"`
	Skip     string            `json:"-"`
	unexp    string
	Float    float64 `json:"float"`
	Untagged bool
}

func TestCanonicalGoValues(t *testing.T) {
	v := goValue{
		embedded: embedded{Shared: "s"},
		Zeta:     "z", Alpha: -7, When: time.Date(2026, 7, 26, 12, 0, 0, 0, time.UTC),
		Raw:   json.RawMessage(`{ "y": 1.50, "x": [ true , null ] }`),
		Bytes: []byte("hi"), Inner: inner{B: "</script>\u2028"},
		Map:  map[string]string{"b": "2", "a": "1", "\U0001F600": "astral", "\uFB00": "bmp"},
		Skip: "never", unexp: "never", Float: 1e21, Untagged: true,
	}
	got, err := protocol.Canonical(v)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"Untagged":true,"alpha":-7,"bytes":"aGk=","float":1e+21,"inner":{"b":"</script>` + "\u2028" +
		`"},"map":{"a":"1","b":"2","` + "\U0001F600" + `":"astral","` + "\uFB00" + `":"bmp"},"ptr":null,"raw":{"x":[true,null],"y":1.5},"shared":"s","when":"2026-07-26T12:00:00Z","zeta":"z"}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestCanonicalRefusals(t *testing.T) {
	for name, v := range map[string]any{
		"nan":             math.NaN(),
		"inf":             math.Inf(-1),
		"int beyond 2^53": int64(1 << 53),
		"uint beyond":     uint64(1<<53 + 1),
		"invalid utf-8":   "\xff",
		"bad map key":     map[int]string{1: "x"},
		"channel":         make(chan int),
		"bad raw":         json.RawMessage(`{"a":`),
		"nested nan":      map[string]any{"a": []any{1.0, math.NaN()}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := protocol.Canonical(v); !errors.Is(err, protocol.ErrNotCanonicalizable) {
				t.Errorf("got %v, want ErrNotCanonicalizable", err)
			}
		})
	}
	// The safe-integer bound itself is fine.
	if b, err := protocol.Canonical(int64(protocol.MaxSafeInteger)); err != nil || string(b) != "9007199254740991" {
		t.Errorf("MaxSafeInteger: %s %v", b, err)
	}
}

func TestParseJSONRefusals(t *testing.T) {
	deep := strings.Repeat("[", protocol.MaxJSONDepth+1) + strings.Repeat("]", protocol.MaxJSONDepth+1)
	for name, in := range map[string]string{
		"empty":            ``,
		"duplicate member": `{"a":1,"a":2}`,
		"nested duplicate": `{"x":{"k":1,"k":1}}`,
		"lone high":        `"\ud83d"`,
		"lone low":         `"\ude00"`,
		"high then text":   `"\ud83dx"`,
		"invalid utf-8":    "\"\xff\"",
		"raw control":      "\"a\nb\"",
		"trailing":         `{} {}`,
		"leading zero":     `01`,
		"bare minus":       `-`,
		"bad fraction":     `1.`,
		"bad exponent":     `1e`,
		"overflow":         `1e400`,
		"bad escape":       `"\x"`,
		"short unicode":    `"\u12"`,
		"single quotes":    `'a'`,
		"unterminated":     `{"a":1`,
		"too deep":         deep,
		"NaN literal":      `NaN`,
		"missing colon":    `{"a" 1}`,
		"trailing comma":   `[1,]`,
	} {
		t.Run(name, func(t *testing.T) {
			if v, err := protocol.ParseJSON([]byte(in)); !errors.Is(err, protocol.ErrJSON) {
				t.Errorf("parsed %q as %#v, want ErrJSON (err %v)", in, v, err)
			}
		})
	}
}

func TestParseJSONNumbers(t *testing.T) {
	for in, want := range map[string]string{
		`-0`: `0`, `1e-400`: `0`, `123456789012345`: `123456789012345`,
		`1234567890123456789`: `1234567890123456800`, `0.1e1`: `1`, `-1.5E+2`: `-150`,
	} {
		v, err := protocol.ParseJSON([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got, _ := protocol.Canonical(v); string(got) != want {
			t.Errorf("%s: got %s want %s", in, got, want)
		}
	}
}

func TestCompareUTF16(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{
		{"10", "2", true}, {"A", "a", true}, {"", "a", true},
		{"\U0001F600", "\uFB00", true}, // astral (surrogate D83D) before U+FB00
		{"\uFB00", "\U0001F600", false},
		{"\u00e9", "\u20ac", true}, {"ab", "abc", true}, {"\r", "1", true},
		// Astral characters sharing a high surrogate (D83D) differ in the
		// low one; they used to compare equal, leaving their order to the
		// sort (and to a map's iteration order).
		{"\U0001F600", "\U0001F601", true}, {"\U0001F601", "\U0001F600", false},
		{"a\U0001F600b", "a\U0001F601a", true}, {"\U0001F600", "\U0001F600", false},
	} {
		if got := protocol.CompareUTF16(c.a, c.b) < 0; got != c.less {
			t.Errorf("CompareUTF16(%q, %q) < 0 = %v, want %v", c.a, c.b, got, c.less)
		}
	}
}
