package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func us(f float64) Micros { return Micros(time.Duration(f * float64(time.Microsecond))) }

// reports are the golden cases: a clean timed run of every row, and a
// counted run with failures of both sorts and no signed row to compare with.
var reports = map[string]*Report{
	"clean": {
		Target: "nats://127.0.0.1:4222",
		Load: Load{Callers: 64, Responders: 1, Nodes: 2, Size: 64,
			Duration: Duration(10 * time.Second), Warmup: Duration(time.Second), Timeout: Duration(10 * time.Second)},
		Rows: []Row{
			{Name: "mesh", Requests: 52310, OK: 52310, Elapsed: Seconds(10012 * time.Millisecond), ReqPerSec: 5224.7,
				Latency: Latency{P50: us(11503.2), P90: us(18211), P99: us(27950.4), Max: us(112400)}},
			{Name: "signed", Requests: 80110, OK: 80110, Elapsed: Seconds(10004 * time.Millisecond), ReqPerSec: 8007.8,
				Latency: Latency{P50: us(7811.9), P90: us(12020.5), P99: us(16444), Max: us(40102.7)}},
			{Name: "raw", Requests: 781000, OK: 781000, Elapsed: Seconds(10001 * time.Millisecond), ReqPerSec: 78092.2,
				Latency: Latency{P50: us(640.4), P90: us(1210), P99: us(5480.6), Max: us(9999.6)}},
			{Name: "http", Requests: 60200, OK: 60200, Elapsed: Seconds(10008 * time.Millisecond), ReqPerSec: 6015.2,
				Latency: Latency{P50: us(9350), P90: us(19200), P99: us(31600), Max: us(1204000)}},
		},
	},
	"errors": {
		Target: "nats://127.0.0.1:36001 (in-process)",
		Load: Load{Callers: 8, Responders: 3, Nodes: 1, Size: 70000, Requests: 1000,
			Timeout: Duration(2 * time.Second)},
		Rows: []Row{
			{Name: "mesh", Requests: 1000, OK: 0, Errors: 1000, Elapsed: Seconds(81 * time.Millisecond),
				ErrorsByCode: map[string]int{"CONTEXT_TOO_LARGE": 1000},
				FirstErrors:  map[string]string{"CONTEXT_TOO_LARGE": "CONTEXT_TOO_LARGE: sender text is 70000 UTF-16 code units, over the recipient's limit of 65536"}},
			{Name: "http", Requests: 1000, OK: 996, Errors: 4, Elapsed: Seconds(1250 * time.Millisecond), ReqPerSec: 796.8,
				Latency:      Latency{P50: us(999.7), P90: us(1500), P99: us(2900), Max: us(1999000)},
				ErrorsByCode: map[string]int{"IDENTITY_MISMATCH": 1},
				ErrorsByKind: map[string]int{"timeout": 2, "http_502": 1},
				FirstErrors: map[string]string{"IDENTITY_MISMATCH": "IDENTITY_MISMATCH: signature does not verify",
					"timeout": `Post "http://127.0.0.1:41234/echo/0": context deadline exceeded`, "http_502": "HTTP 502 Bad Gateway"}},
		},
	},
	"failover": {
		Target: "nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224 (in-process cluster of 3)",
		Load: Load{Callers: 64, Responders: 1, Nodes: 2, Size: 64,
			Duration: Duration(20 * time.Second), Warmup: Duration(time.Second), Timeout: Duration(10 * time.Second)},
		Rows: []Row{
			{Name: "mesh", Requests: 41020, OK: 41008, Errors: 12, Elapsed: Seconds(20104 * time.Millisecond), ReqPerSec: 2039.8,
				Latency:      Latency{P50: us(25103.2), P90: us(41000), P99: us(90200.4), Max: us(9812000)},
				ErrorsByCode: map[string]int{"TRANSPORT_TIMEOUT": 12},
				FirstErrors:  map[string]string{"TRANSPORT_TIMEOUT": "TRANSPORT_TIMEOUT: no answer from U… within 10s"},
				Failover: &Failover{Server: "meshd-1", KillAfter: Duration(5 * time.Second), DownFor: Duration(5 * time.Second),
					ReplicatedAfter: Seconds(2310 * time.Millisecond),
					Phases: []Phase{
						{Name: "before", Elapsed: Seconds(5 * time.Second), OK: 11200, ReqPerSec: 2240, WritesAcked: 2400},
						{Name: "during", Elapsed: Seconds(5120 * time.Millisecond), OK: 8704, Errors: 12, ReqPerSec: 1700,
							ErrorsByCode: map[string]int{"TRANSPORT_TIMEOUT": 12}, WritesAcked: 1903},
						{Name: "after", Elapsed: Seconds(9984 * time.Millisecond), OK: 21104, ReqPerSec: 2113.8, WritesAcked: 4620},
					},
					Writes: Writes{Stream: "MESHBENCH_abcdefgh", Acked: 8923, Lost: 0, Failed: 3}}},
		},
	},
}

// The text and JSON reports match testdata/<case>.txt and .json; run with
// -update after a deliberate change and read the diff.
func TestGolden(t *testing.T) {
	for name, r := range reports {
		t.Run(name, func(t *testing.T) {
			r.Finish()
			var text, js bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if err := r.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("testdata", name+".txt"), text.Bytes())
			golden(t, filepath.Join("testdata", name+".json"), js.Bytes())

			// The JSON reads back into the same report: scripts can
			// compare runs with this package.
			var back Report
			if err := json.Unmarshal(js.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			var again bytes.Buffer
			if err := back.WriteJSON(&again); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Bytes(), js.Bytes()) {
				t.Errorf("JSON does not round-trip:\n%s", again.Bytes())
			}
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update to rewrite it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// Ratios compare each answered row with the signed one, and are absent
// without it or when it answered nothing.
func TestRatios(t *testing.T) {
	r := &Report{Rows: []Row{
		{Name: "mesh", OK: 10, ReqPerSec: 600, Latency: Latency{P50: us(360)}},
		{Name: "signed", OK: 10, ReqPerSec: 1000, Latency: Latency{P50: us(200)}},
		{Name: "raw", OK: 0},
	}}
	r.Finish()
	want := []Ratio{{Row: "mesh", Base: "signed", Throughput: 0.6, P50: 1.8}}
	if !reflect.DeepEqual(r.Ratios, want) {
		t.Errorf("ratios %+v, want %+v", r.Ratios, want)
	}
	r.Rows[1].OK = 0
	r.Finish()
	if r.Ratios != nil {
		t.Errorf("ratios against a base that answered nothing: %+v", r.Ratios)
	}
}

func TestShort(t *testing.T) {
	for _, c := range []struct {
		us   float64
		want string
	}{{41.2, "41µs"}, {527, "527µs"}, {999.7, "1.00ms"}, {1234, "1.23ms"}, {12345, "12.3ms"}, {123456, "123ms"}, {1054000, "1.05s"}} {
		if got := Short(us(c.us)); got != c.want {
			t.Errorf("Short(%vµs) = %q, want %q", c.us, got, c.want)
		}
	}
}
