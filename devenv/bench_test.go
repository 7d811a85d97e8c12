package devenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// BenchmarkNodeCredential16 measures POST /v1/node-credential for a full
// 16-agent roster an account owns (the node of a customer renewing its
// credential), through HTTP on the in-process mesh: parse, 17 signature
// checks, standing in the store, the guard, the JWT signature, the mint
// recorded in a durable transaction. Beside it, in the same run, is its
// crypto bound: the 17 Ed25519 verifications and the one signature alone,
// one at a time and on every core; each http row reports its ratio to the
// bound measured the same way ("of-bound"), and every row the process's
// CPU time per mint (which holds still when others share the machine).
// commit/sequential is one store commit alone: with the bound, what a
// sequential mint cannot go below.
func BenchmarkNodeCredential16(b *testing.B) {
	ob, err := mail.NewOutbox(b.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	m, err := devenv.Start(context.Background(), devenv.Config{DataDir: b.TempDir(), Mail: ob, RateLimit: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	base := m.URLs().Control

	// An account owns the 16 agents: each is bound by exchanging an am_
	// key, as mesh-adapter does.
	acct, _, err := m.Control().Accounts.CreateAccount(context.Background(), "bench@example.org")
	if err != nil {
		b.Fatal(err)
	}
	node, _ := keys.Generate[keys.NodeRole]()
	agents := make([]*keys.Agent, 16)
	ids := make([]string, 16)
	for i := range agents {
		agents[i], _ = keys.Generate[keys.AgentRole]()
		ids[i] = agents[i].Public()
		g, err := m.Control().Accounts.AdminMintAgentKey(context.Background(), acct.ID, fmt.Sprintf("agent%d", i))
		if err != nil {
			b.Fatal(err)
		}
		body, _ := json.Marshal(bootstrapBody(g.Token, agents[i]))
		if st := post(b, http.DefaultClient, base+"/v1/bootstrap", body); st != 200 {
			b.Fatalf("bootstrap: %d", st)
		}
	}
	ts := time.Now().Unix()
	req := nodeRequest(node, agents, ts)
	body, _ := json.Marshal(req)
	url := base + "/v1/node-credential"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	if st := post(b, client, url, body); st != 200 {
		b.Fatalf("node credential: %d", st)
	}

	// The bound: what the mint cannot avoid, 17 verifications (the node's
	// signature over the roster and each agent's proof) and one signature
	// (the JWT's, over a message of its size).
	jwtStr, err := m.Trust().MintUser(creds.UserSpec{PublicKey: node.Public(), Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(node.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	signer, _ := keys.Generate[keys.AccountRole]()
	signed := []byte(jwtStr[:strings.LastIndexByte(jwtStr, '.')])
	entries := req["agents"].([]any)
	bound := func() {
		if protocol.VerifyNodeCred(ts, node.Public(), ids, req["node_sig"].(string)) != nil {
			b.Fatal("node sig")
		}
		for i, e := range entries {
			if protocol.VerifyNodeAgent(ts, node.Public(), ids[i], e.(map[string]any)["sig"].(string)) != nil {
				b.Fatal("agent sig")
			}
		}
		signer.Sign(signed)
	}
	mint := func() {
		if st := post(b, client, url, body); st != 200 {
			b.Fatalf("status %d", st)
		}
	}
	perSecond := func(b *testing.B) float64 { return float64(b.N) / b.Elapsed().Seconds() }
	// cpuPerMint reports the process's CPU time per mint since cpu0 (the
	// HTTP client's share included): unlike mints/s, it holds still when
	// the machine is busy with something else.
	cpuPerMint := func(b *testing.B, cpu0 time.Duration) {
		b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/mint")
	}
	var boundSeq, boundPar float64
	b.Run("bound/sequential", func(b *testing.B) {
		cpu0 := cpuTime()
		for b.Loop() {
			bound()
		}
		boundSeq = perSecond(b)
		b.ReportMetric(boundSeq, "mints/s")
		cpuPerMint(b, cpu0)
	})
	b.Run("http/sequential", func(b *testing.B) {
		cpu0 := cpuTime()
		for b.Loop() {
			mint()
		}
		b.ReportMetric(perSecond(b), "mints/s")
		cpuPerMint(b, cpu0)
		if boundSeq > 0 {
			b.ReportMetric(perSecond(b)/boundSeq, "of-bound")
		}
	})
	b.Run("bound/parallel", func(b *testing.B) {
		cpu0 := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				bound()
			}
		})
		boundPar = perSecond(b)
		b.ReportMetric(boundPar, "mints/s")
		cpuPerMint(b, cpu0)
	})
	b.Run("http/parallel", func(b *testing.B) {
		b.SetParallelism(16) // 16 clients a core: a mint waits on the store's fsync, which group commit shares
		cpu0 := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				mint()
			}
		})
		b.ReportMetric(perSecond(b), "mints/s")
		cpuPerMint(b, cpu0)
		if boundPar > 0 {
			b.ReportMetric(perSecond(b)/boundPar, "of-bound")
		}
	})
	// The sequential row's floor besides its CPU: one commit of the
	// control-plane store, alone, as a mint's is (bbolt writes the pages,
	// then the meta page, each followed by an fdatasync).
	b.Run("commit/sequential", func(b *testing.B) {
		st := m.Control().Store
		for i := 0; b.Loop(); i++ {
			if err := st.RunTx(context.Background(), func(tx store.Tx) error {
				return tx.Set("bench_commits", "c", map[string]any{"i": i})
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/commit")
	})
	b.Run("jwt", func(b *testing.B) {
		tr := m.Trust()
		for b.Loop() {
			if _, err := tr.MintUser(creds.UserSpec{PublicKey: node.Public(), Kind: creds.KindNode, Hosted: ids,
				Permissions: creds.NodePermissions(ids, creds.PrivateOnly(node.Public())), Expires: time.Now().Add(time.Hour)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// post sends body and returns the status, the answer read and discarded.
func post(b *testing.B, c *http.Client, url string, body []byte) int {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
