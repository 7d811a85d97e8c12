// Command meshbench drives load through a running mesh and reports latency
// percentiles and throughput of the full agent request path (sign,
// pre-flight, the receiver's decode order, the accept, the handler, the
// signed respond).
//
//	meshbench --data-dir .mesh --requests 20000 --concurrency 64
//
// It runs on the mesh's host: it reads meshd.json for the addresses and the
// data directory's trust chain to mint two node credentials, then hosts an
// "echo" agent and a caller on two nodes of its own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "meshbench:", err)
		os.Exit(1)
	}
}

type options struct {
	dataDir     string
	requests    int
	concurrency int
	payload     int
	timeout     time.Duration
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("meshbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dataDir, "data-dir", "./.mesh", "the running meshd's data directory (meshd.json and keys/)")
	fs.IntVar(&o.requests, "requests", 10000, "requests to send")
	fs.IntVar(&o.concurrency, "concurrency", 64, "requests in flight at once")
	fs.IntVar(&o.payload, "payload", 64, "bytes of text in each request")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "per-request timeout")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: meshbench [flags]\n\nDrives agent requests through a running meshd on this host and reports\nlatency percentiles and throughput.\n\nExample:\n  meshbench --data-dir .mesh --requests 20000 --concurrency 64\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.requests <= 0 || o.concurrency <= 0 {
		return errors.New("--requests and --concurrency must be positive")
	}
	var urls struct {
		MeshTCP string `json:"mesh_tcp_url"`
	}
	b, err := os.ReadFile(filepath.Join(o.dataDir, "meshd.json"))
	if err != nil {
		return fmt.Errorf("is meshd running on %s? %w", o.dataDir, err)
	}
	if err := json.Unmarshal(b, &urls); err != nil {
		return fmt.Errorf("meshd.json: %w", err)
	}
	trust, err := creds.Load(filepath.Join(o.dataDir, "keys"))
	if err != nil {
		return err
	}
	echo, err := hostAgent(ctx, trust, urls.MeshTCP, func(ctx context.Context, c *node.Call) error {
		return c.Reply(map[string]any{"text": "ok"})
	})
	if err != nil {
		return fmt.Errorf("echo agent: %w", err)
	}
	caller, err := hostAgent(ctx, trust, urls.MeshTCP, func(ctx context.Context, c *node.Call) error { return c.Reply(nil) })
	if err != nil {
		return fmt.Errorf("caller agent: %w", err)
	}
	fmt.Fprintf(stdout, "meshbench: %d requests, %d in flight, %d-byte text, through %s\n", o.requests, o.concurrency, o.payload, urls.MeshTCP)
	text := string(make([]byte, 0, o.payload))
	for range o.payload {
		text += "x"
	}

	lat := make([]time.Duration, o.requests)
	var next, done, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	go func() {
		for range progress.C {
			d := done.Load()
			fmt.Fprintf(stderr, "  %d/%d done, %.0f req/s\n", d, o.requests, float64(d)/time.Since(start).Seconds())
			if d >= int64(o.requests) {
				return
			}
		}
	}()
	for range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(o.requests) || ctx.Err() != nil {
					return
				}
				rctx, cancel := context.WithTimeout(ctx, o.timeout)
				t0 := time.Now()
				res, err := caller.Request(rctx, echo.ID(), "echo", map[string]any{"text": text}, node.RequestOptions{Timeout: o.timeout})
				cancel()
				lat[i] = time.Since(t0)
				if err == nil && res.Status != "completed" {
					err = fmt.Errorf("status %q", res.Status)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := int(done.Load())
	got := slices.Clone(lat[:n])
	slices.Sort(got)
	pct := func(p int) time.Duration { return got[min(n-1, n*p/100)].Round(time.Microsecond) }
	fmt.Fprintf(stdout, "done: %d requests in %v: %.0f req/s; latency p50 %v, p95 %v, p99 %v, max %v; %d failed\n",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), pct(50), pct(95), pct(99), got[n-1].Round(time.Microsecond), failed.Load())
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d requests failed; first: %v", f, firstErr.Load())
	}
	return ctx.Err()
}

// hostAgent starts a node with a freshly minted node credential and hosts
// one agent answering "echo".
func hostAgent(ctx context.Context, trust *creds.Trust, url string, h node.Handler) (*node.Agent, error) {
	nk, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		return nil, err
	}
	ak, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return nil, err
	}
	ids := []string{ak.Public()}
	jwtStr, err := trust.MintUser(creds.UserSpec{PublicKey: nk.Public(), Name: "meshbench", Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		return nil, err
	}
	n, err := node.Start(ctx, node.Config{NATSURL: url, NodeKey: nk, Credential: node.Credential{JWT: jwtStr, Sign: nk.SignNonce}})
	if err != nil {
		return nil, err
	}
	return n.Host(ctx, node.AgentConfig{Key: ak, Name: "meshbench", AvailabilityClass: "always_on",
		Offerings: []node.Offering{{ID: "echo", Name: "Echo"}}, Handler: h})
}
