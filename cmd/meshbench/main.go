// Command meshbench is the mesh's load tool: it drives agent requests
// through a mesh and reports throughput, latency percentiles and failures by
// error code, beside the same load over raw NATS request-reply, NATS with a
// signed envelope each way, and HTTP JSON with the same signed envelopes,
// so the ratios show what the mesh costs over what a user would run
// instead.
//
//	meshbench --data-dir .mesh --callers 64 --duration 10s
//	meshbench --in-process --rows mesh,signed --requests 20000 --json
//
// Against a running meshd it runs on the mesh's host: it reads meshd.json
// for the broker's address and the data directory's trust chain to mint its
// own node and service credentials. docs/performance.md explains the flags
// and how to read the report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"agentmesh.dev/mesh/cmd/meshbench/internal/load"
	"agentmesh.dev/mesh/cmd/meshbench/internal/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal stops the load and prints the report; a second one
	// ends the process at once.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "meshbench:", err)
		os.Exit(1)
	}
}

// errUsage means the command line was wrong; the message is already printed.
var errUsage = errors.New("usage error")

// rowNames are the rows meshbench knows, in the default order.
var rowNames = []string{"mesh", "signed", "raw", "http"}

type options struct {
	dataDir   string
	inProcess bool
	// cluster starts the in-process mesh on a three-server cluster;
	// killAfter, when positive, kills one of its servers that long into
	// each row's measured run and starts it again downFor later.
	cluster            bool
	killAfter, downFor time.Duration
	shape              shape
	requests           int
	duration           time.Duration
	warmup             time.Duration
	timeout            time.Duration
	rows               []string
	quiet              bool
	json               bool
	out                string
}

// shape is the load every row carries: callers in flight, responders
// answering, nodes (connections) they are spread over, bytes of text a
// request.
type shape struct {
	callers, responders, nodes, size int
}

const usageText = `Usage: meshbench [flags]

Drives request-reply load through a mesh and reports req/s, latency
percentiles and errors by code, beside the same load over raw NATS, NATS
with signed envelopes, and HTTP JSON with signed envelopes.

Examples:
  meshbench --data-dir .mesh --callers 64 --duration 10s
  meshbench --in-process --rows mesh,signed --requests 20000 --out report.json
  meshbench --cluster --kill-after 5s --down-for 5s --duration 20s

--cluster runs the mesh in meshbench on a three-server JetStream cluster
(R3, as meshd --cluster 3); with --kill-after it kills the server leading
the most streams during each row and starts it again, and reports req/s
before, during and after, errors by code, and acknowledged writes lost.

The exit status is 1 when any request failed (with --kill-after: when an
acknowledged write was lost or a request handled twice), 2 for a wrong
command line.
docs/performance.md explains the report.

Flags:
`

// parse reads the command line. --help prints the usage on stdout and
// returns flag.ErrHelp; a wrong line prints one line and the usage on
// stderr and returns errUsage.
func parse(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	var rows string
	fs := flag.NewFlagSet("meshbench", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and usage are printed below, to the right stream
	fs.StringVar(&o.dataDir, "data-dir", "./.mesh", "the running meshd's data directory (meshd.json and keys/); meshbench must run on its host")
	fs.BoolVar(&o.inProcess, "in-process", false, "start a mesh inside meshbench (temporary data directory, random loopback ports) instead of using --data-dir")
	fs.BoolVar(&o.cluster, "cluster", false, "start the mesh inside meshbench on a three-server JetStream cluster (R3 streams) instead of using --data-dir")
	fs.DurationVar(&o.killAfter, "kill-after", 0, "with --cluster: kill one server this long into each row's measured run (the one leading the most streams), and restart it --down-for later")
	fs.DurationVar(&o.downFor, "down-for", 3*time.Second, "with --kill-after: how long the killed server stays down")
	fs.IntVar(&o.shape.callers, "callers", 64, "requests in flight at once, each caller sending the next when the last is answered")
	fs.IntVar(&o.shape.responders, "responders", 1, "answering agents (each its own key and inbox); callers rotate over them")
	fs.IntVar(&o.shape.nodes, "nodes", 2, "nodes (broker connections) the callers and responders are dealt over")
	fs.IntVar(&o.shape.size, "size", 64, "bytes of text in each request")
	fs.IntVar(&o.requests, "requests", 0, "measured requests a row; 0 runs each row for --duration")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long each row is measured, when --requests is 0")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "load run before each row's measurement and not counted")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "per-request timeout; a request without an answer by then is an error")
	fs.StringVar(&rows, "rows", strings.Join(rowNames, ","), "rows to run, in order: mesh, signed (signed raw NATS), raw (raw NATS), http (HTTP JSON, signed)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fs.BoolVar(&o.json, "json", false, "write the report as JSON on stdout instead of text")
	fs.StringVar(&o.out, "out", "", "also write the report as JSON to this file")
	usage := func(w io.Writer) {
		fmt.Fprint(w, usageText)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return o, err
		}
		fmt.Fprintf(stderr, "meshbench: %v\n\n", err)
		usage(stderr)
		return o, errUsage
	}
	bad := func(format string, a ...any) (options, error) {
		fmt.Fprintf(stderr, "meshbench: "+format+" (meshbench --help lists the flags)\n", a...)
		return o, errUsage
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	s := o.shape
	switch {
	case s.callers <= 0, s.responders <= 0, s.nodes <= 0:
		return bad("--callers, --responders and --nodes must be at least 1")
	case s.size < 0 || s.size > maxSize:
		return bad("--size must be from 0 to %d bytes", maxSize)
	case o.requests < 0:
		return bad("--requests must not be negative")
	case o.requests == 0 && o.duration <= 0:
		return bad("--duration must be positive when --requests is 0")
	case o.warmup < 0:
		return bad("--warmup must not be negative")
	case o.timeout <= 0:
		return bad("--timeout must be positive")
	}
	rowsSet := false
	fs.Visit(func(f *flag.Flag) { rowsSet = rowsSet || f.Name == "rows" })
	if o.killAfter != 0 {
		switch {
		case !o.cluster:
			return bad("--kill-after needs --cluster: meshbench kills a server only of a cluster it runs itself")
		case o.killAfter < 0 || o.downFor <= 0:
			return bad("--kill-after and --down-for must be positive")
		case o.requests > 0:
			return bad("--kill-after measures for --duration, not a number of --requests")
		case o.duration <= o.killAfter+o.downFor:
			return bad("--duration (%v) must be longer than --kill-after plus --down-for (%v), so there is an after", o.duration, o.killAfter+o.downFor)
		}
		if !rowsSet {
			rows = "mesh" // the failover is the mesh's; the baselines are for comparing speeds
		}
	}
	for _, name := range strings.Split(rows, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(rowNames, name) {
			return bad("--rows: unknown row %q (rows: %s)", name, strings.Join(rowNames, ", "))
		}
		if slices.Contains(o.rows, name) {
			return bad("--rows: %q twice", name)
		}
		if o.killAfter != 0 && name == "http" {
			return bad("--rows: the http row does not use the bus, so a server's loss says nothing about it; leave it out with --kill-after")
		}
		o.rows = append(o.rows, name)
	}
	return o, nil
}

// maxSize bounds --size: far above what one request may carry (the mesh
// refuses sender text over 65,536 characters, the broker messages over its
// max_payload), yet small enough that callers' copies stay in memory.
const maxSize = 8 << 20

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stdout, stderr)
	if err != nil {
		return err
	}
	progress := stderr
	if o.quiet {
		progress = io.Discard
	}
	t, err := openTarget(ctx, o, progress)
	if err != nil {
		return err
	}
	defer t.close()

	rep := &report.Report{Target: t.name, Load: report.Load{
		Callers: o.shape.callers, Responders: o.shape.responders, Nodes: o.shape.nodes, Size: o.shape.size,
		Requests: o.requests, Warmup: report.Duration(o.warmup), Timeout: report.Duration(o.timeout)}}
	if o.requests == 0 {
		rep.Load.Duration = report.Duration(o.duration)
	}
	cfg := load.Config{Callers: o.shape.callers, Requests: o.requests, Duration: o.duration,
		Warmup: o.warmup, Timeout: o.timeout, Classify: classify}
	var runErr error
	var fo *failover
	if o.killAfter > 0 {
		fo = newFailover(t, o, progress)
	}
	for _, name := range o.rows {
		row, err := measure(ctx, t, name, o.shape, cfg, fo, progress)
		if err != nil && ctx.Err() == nil {
			runErr = err
			break
		}
		if row.Requests > 0 {
			rep.Rows = append(rep.Rows, row)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if runErr != nil && len(rep.Rows) == 0 {
		return runErr // nothing measured, nothing to report
	}
	rep.Finish()

	if o.json {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if o.out != "" {
		if err := writeReportFile(o.out, rep); err != nil {
			return err
		}
	}
	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted; the report covers what was measured before")
	case runErr != nil:
		return runErr
	case o.killAfter > 0:
		if lost := lostInFailovers(rep); lost > 0 {
			return fmt.Errorf("%d acknowledged messages lost or requests handled twice in the failover; the report says which", lost)
		}
	case rep.Failed() > 0:
		return fmt.Errorf("%d requests failed (%s); the report lists them by code", rep.Failed(), failedRows(rep))
	}
	return nil
}

func lostInFailovers(rep *report.Report) int {
	n := 0
	for _, row := range rep.Rows {
		if row.Failover != nil {
			n += row.Failover.Lost()
		}
	}
	return n
}

// measure sets a row up, runs the load through it and tears it down. With
// fo, a server of the cluster is killed and restarted during the measured
// run (failover.go).
func measure(ctx context.Context, t *target, name string, s shape, cfg load.Config, fo *failover, progress io.Writer) (report.Row, error) {
	fmt.Fprintf(progress, "%s: setting up %s on %s\n", name, plural(s.responders, "responder"), plural(s.nodes, "node"))
	b, err := openRow(ctx, t, name, s)
	if err != nil {
		return report.Row{}, fmt.Errorf("%s row: %w", name, err)
	}
	defer b.close()
	if cfg.Warmup > 0 {
		fmt.Fprintf(progress, "%s: warming up for %v\n", name, cfg.Warmup)
	}
	cfg.Progress = func(p load.Progress) {
		fmt.Fprintf(progress, "%s: %5.1fs  %8d done  %7.0f req/s  %d errors\n", name, p.Elapsed.Seconds(), p.Done, p.Rate, p.Errors)
	}
	var res *load.Result
	var failover *report.Failover
	if fo == nil {
		res, err = load.Run(ctx, cfg, b.call)
	} else {
		res, failover, err = fo.measure(ctx, name, cfg, b)
	}
	if res == nil {
		return report.Row{}, err
	}
	row := rowOf(name, res)
	row.Failover = failover
	fmt.Fprintf(progress, "%s: %d requests in %v, %.0f req/s, %d errors\n", name, row.Requests, res.Elapsed.Round(time.Millisecond), row.ReqPerSec, row.Errors)
	return row, nil
}

// rowOf turns a run's result into a report row.
func rowOf(name string, res *load.Result) report.Row {
	row := report.Row{Name: name, OK: res.OK(), Errors: res.Failed(), Elapsed: report.Seconds(res.Elapsed),
		ReqPerSec: math.Round(res.Rate()*10) / 10, Latency: report.Latency{
			P50: report.Micros(res.Percentile(50)), P90: report.Micros(res.Percentile(90)),
			P99: report.Micros(res.Percentile(99)), Max: report.Micros(res.Percentile(100))}}
	row.Requests = row.OK + row.Errors
	for f, n := range res.Errors {
		key, m := f.Kind, &row.ErrorsByKind
		if f.Code != "" {
			key, m = f.Code, &row.ErrorsByCode
		}
		if *m == nil {
			*m = map[string]int{}
		}
		(*m)[key] += n
		if row.FirstErrors == nil {
			row.FirstErrors = map[string]string{}
		}
		row.FirstErrors[key] = res.Examples[f]
	}
	return row
}

func failedRows(rep *report.Report) string {
	var parts []string
	for _, row := range rep.Rows {
		if row.Errors > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", row.Name, row.Errors))
		}
	}
	return strings.Join(parts, ", ")
}

func writeReportFile(path string, rep *report.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return fmt.Errorf("--out: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	return nil
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
