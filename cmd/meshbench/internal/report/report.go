// Package report is meshbench's report: one row per kind of request-reply
// measured under the same load, the ratios of each to signed raw NATS, and
// the failures by cause, written as text for people and JSON for scripts.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Base is the row the others are compared with: NATS request-reply with a
// signed envelope each way, the signature bound of the mesh's request.
const Base = "signed"

// Report is one meshbench run.
type Report struct {
	// Target is where the load went: the broker's URL, and "(in-process)"
	// for a mesh meshbench started itself.
	Target string `json:"target"`
	Load   Load   `json:"load"`
	Rows   []Row  `json:"rows"`
	// Ratios compare each row with Base, when both ran and answered.
	Ratios []Ratio `json:"ratios,omitempty"`
}

// Load is the shape of the load, the same for every row.
type Load struct {
	Callers    int `json:"callers"`
	Responders int `json:"responders"`
	Nodes      int `json:"nodes"`
	// Size is the bytes of text in each request.
	Size int `json:"size"`
	// Requests, when positive, is the measured requests of each row;
	// otherwise each row ran for Duration.
	Requests int      `json:"requests,omitempty"`
	Duration Duration `json:"duration,omitempty"`
	Warmup   Duration `json:"warmup"`
	Timeout  Duration `json:"timeout"`
}

// Row is one kind of request-reply under the load.
type Row struct {
	// Name is the row's --rows name: mesh, signed, raw or http.
	Name string `json:"name"`
	// Requests counts the measured requests that finished, OK those
	// answered and Errors those that failed.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Errors   int `json:"errors"`
	// Elapsed is the measured run's length; ReqPerSec is OK / Elapsed.
	Elapsed   Seconds `json:"elapsed_s"`
	ReqPerSec float64 `json:"req_per_s"`
	// Latency is over the answered requests.
	Latency Latency `json:"latency_us"`
	// ErrorsByCode counts failures by the protocol error code they ended
	// with; ErrorsByKind those without one (transport and client-side
	// failures: timeout, connection_closed, http_502, …).
	ErrorsByCode map[string]int `json:"errors_by_code,omitempty"`
	ErrorsByKind map[string]int `json:"errors_by_kind,omitempty"`
	// FirstErrors holds one message for each code and kind.
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	// Failover is what happened around a server killed during the row
	// (meshbench --cluster --kill-after).
	Failover *Failover `json:"failover,omitempty"`
}

// Failover is one server's loss and return during a row's measured run.
type Failover struct {
	// Server is the member killed: the one leading the most streams.
	Server    string   `json:"server"`
	KillAfter Duration `json:"kill_after"`
	DownFor   Duration `json:"down_for"`
	// Phases are before the kill, while the server was down, and after it
	// returned, each request counted in the phase it was sent in.
	Phases []Phase `json:"phases"`
	// ReplicatedAfter is how long after the restart every stream had its
	// three replicas current again.
	ReplicatedAfter Seconds `json:"replicated_after_s"`
	// Writes are the acknowledged publishes to an R3 stream made beside
	// the load, each read back once the cluster was whole.
	Writes Writes `json:"writes"`
	// HandledTwice counts requests a responder handled more than once, and
	// AnsweredUnhandled answered ones it did not handle exactly once
	// (the mesh row; both must be 0).
	HandledTwice      int `json:"handled_twice"`
	AnsweredUnhandled int `json:"answered_not_handled_once"`
}

// Phase is a stretch of a failover run.
type Phase struct {
	Name         string         `json:"name"`
	Elapsed      Seconds        `json:"elapsed_s"`
	OK           int            `json:"ok"`
	Errors       int            `json:"errors"`
	ReqPerSec    float64        `json:"req_per_s"`
	ErrorsByCode map[string]int `json:"errors_by_code,omitempty"`
	ErrorsByKind map[string]int `json:"errors_by_kind,omitempty"`
	WritesAcked  int            `json:"writes_acked"`
}

// Writes are the failover's acknowledged writes: Acked acknowledged, Lost
// of those not found (or changed) afterwards, Failed not acknowledged.
type Writes struct {
	Stream string `json:"stream"`
	Acked  int    `json:"acked"`
	Lost   int    `json:"lost"`
	Failed int    `json:"failed"`
}

// Lost is what a failover lost that it must not have: acknowledged
// writes, and requests handled twice or answered without being handled
// exactly once.
func (f *Failover) Lost() int { return f.Writes.Lost + f.HandledTwice + f.AnsweredUnhandled }

// Latency is in microseconds in JSON.
type Latency struct {
	P50 Micros `json:"p50"`
	P90 Micros `json:"p90"`
	P99 Micros `json:"p99"`
	Max Micros `json:"max"`
}

// Ratio is a row against Base: its throughput over Base's, and its p50
// over Base's. Throughput above 1 is faster, P50 above 1 slower.
type Ratio struct {
	Row        string  `json:"row"`
	Base       string  `json:"base"`
	Throughput float64 `json:"throughput"`
	P50        float64 `json:"p50"`
}

// Micros is a duration written as microseconds (one decimal) in JSON.
type Micros time.Duration

func (m Micros) MarshalJSON() ([]byte, error) {
	return json.Marshal(math.Round(float64(time.Duration(m))/float64(time.Microsecond)*10) / 10)
}

func (m *Micros) UnmarshalJSON(b []byte) error {
	var us float64
	if err := json.Unmarshal(b, &us); err != nil {
		return err
	}
	*m = Micros(time.Duration(math.Round(us * float64(time.Microsecond))))
	return nil
}

// Seconds is a duration written as seconds (millisecond precision) in JSON.
type Seconds time.Duration

func (s Seconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(math.Round(time.Duration(s).Seconds()*1000) / 1000)
}

func (s *Seconds) UnmarshalJSON(b []byte) error {
	var sec float64
	if err := json.Unmarshal(b, &sec); err != nil {
		return err
	}
	*s = Seconds(time.Duration(math.Round(sec * float64(time.Second))))
	return nil
}

// Duration is a duration written as Go writes it ("10s", "1m30s") in JSON,
// the form the flags take.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Finish computes the ratios to Base.
func (r *Report) Finish() {
	r.Ratios = nil
	i := slices.IndexFunc(r.Rows, func(row Row) bool { return row.Name == Base })
	if i < 0 || r.Rows[i].OK == 0 {
		return
	}
	base := r.Rows[i]
	for _, row := range r.Rows {
		if row.Name == Base || row.OK == 0 {
			continue
		}
		r.Ratios = append(r.Ratios, Ratio{Row: row.Name, Base: Base,
			Throughput: round2(row.ReqPerSec / base.ReqPerSec),
			P50:        round2(float64(row.Latency.P50) / float64(base.Latency.P50))})
	}
}

func round2(f float64) float64 {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0
	}
	return math.Round(f*100) / 100
}

// Failed is the number of failed requests over all rows.
func (r *Report) Failed() int {
	n := 0
	for _, row := range r.Rows {
		n += row.Errors
	}
	return n
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Titles say in a few words what each row measures.
var Titles = map[string]string{
	"mesh":   "the mesh: request, accepted, answer between agents on nodes (3 signatures; 2 verifications, the accept's only when needed)",
	"signed": "NATS request-reply, a signed envelope each way (2 signatures, 2 verifications)",
	"raw":    "NATS request-reply, the same JSON unsigned",
	"http":   "HTTP POST on loopback, a signed JSON envelope each way (A2A-style)",
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	l := r.Load
	fmt.Fprintf(&b, "meshbench against %s\n", r.Target)
	fmt.Fprintf(&b, "%s, %s on %s, %d-byte requests, ", plural(l.Callers, "caller"), plural(l.Responders, "responder"), plural(l.Nodes, "node"), l.Size)
	if l.Requests > 0 {
		fmt.Fprintf(&b, "%d requests a row", l.Requests)
	} else {
		fmt.Fprintf(&b, "%v a row", time.Duration(l.Duration))
	}
	if l.Warmup > 0 {
		fmt.Fprintf(&b, " after %v of warm-up", time.Duration(l.Warmup))
	}
	fmt.Fprintf(&b, ", %v timeout\n\n", time.Duration(l.Timeout))

	const rowFormat = "%-7s %9v %7v %9v %8v %8v %8v %8v\n"
	fmt.Fprintf(&b, rowFormat, "row", "requests", "errors", "req/s", "p50", "p90", "p99", "max")
	for _, row := range r.Rows {
		lat := []string{"-", "-", "-", "-"} // nothing answered
		if row.OK > 0 {
			lat = []string{Short(row.Latency.P50), Short(row.Latency.P90), Short(row.Latency.P99), Short(row.Latency.Max)}
		}
		fmt.Fprintf(&b, rowFormat, row.Name, row.Requests, row.Errors, fmt.Sprintf("%.0f", row.ReqPerSec), lat[0], lat[1], lat[2], lat[3])
	}

	if len(r.Ratios) > 0 {
		fmt.Fprintf(&b, "\nratios to %s (signed raw NATS, the signature bound):\n", Base)
		for _, q := range r.Ratios {
			fmt.Fprintf(&b, "  %-6s %6.2fx the req/s, %6.2fx the p50\n", q.Row, q.Throughput, q.P50)
		}
	}

	fmt.Fprintln(&b)
	if r.Failed() == 0 {
		fmt.Fprintln(&b, "no errors")
	} else {
		fmt.Fprintln(&b, "errors:")
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, row := range r.Rows {
			for _, m := range []map[string]int{row.ErrorsByCode, row.ErrorsByKind} {
				for _, k := range slices.Sorted(maps.Keys(m)) {
					fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", row.Name, k, m[k], strings.TrimPrefix(row.FirstErrors[k], k+": "))
				}
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	for _, row := range r.Rows {
		if f := row.Failover; f != nil {
			writeFailover(&b, row.Name, f)
		}
	}

	fmt.Fprintln(&b, "\nrows:")
	for _, row := range r.Rows {
		if t, ok := Titles[row.Name]; ok {
			fmt.Fprintf(&b, "  %-6s %s\n", row.Name, t)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeFailover writes a row's failover section.
func writeFailover(b *strings.Builder, row string, f *Failover) {
	fmt.Fprintf(b, "\nfailover (%s row): %s killed after %v, restarted %v later; every stream fully replicated %.1fs after the restart\n",
		row, f.Server, time.Duration(f.KillAfter), time.Duration(f.DownFor), time.Duration(f.ReplicatedAfter).Seconds())
	const phaseFormat = "  %-7s %8s %9v %7v %9v %7v\n"
	fmt.Fprintf(b, phaseFormat, "phase", "elapsed", "answered", "errors", "req/s", "writes")
	for _, p := range f.Phases {
		fmt.Fprintf(b, phaseFormat, p.Name, fmt.Sprintf("%.1fs", time.Duration(p.Elapsed).Seconds()), p.OK, p.Errors,
			fmt.Sprintf("%.0f", p.ReqPerSec), p.WritesAcked)
	}
	for _, p := range f.Phases {
		for _, m := range []map[string]int{p.ErrorsByCode, p.ErrorsByKind} {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				fmt.Fprintf(b, "  errors %s: %s %d\n", p.Name, k, m[k])
			}
		}
	}
	fmt.Fprintf(b, "  acknowledged writes to an R3 stream: %d, lost: %d (not acknowledged: %d)\n", f.Writes.Acked, f.Writes.Lost, f.Writes.Failed)
	fmt.Fprintf(b, "  requests handled twice: %d, answered but not handled exactly once: %d\n", f.HandledTwice, f.AnsweredUnhandled)
	fmt.Fprintf(b, "  lost acknowledged messages: %d\n", f.Lost())
}

// Short writes a latency with three significant digits: 41µs, 527µs,
// 1.23ms, 12.3ms, 1.05s.
func Short(m Micros) string {
	d := time.Duration(m).Round(time.Microsecond)
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d/time.Microsecond)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < 100*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
