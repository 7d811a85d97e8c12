package devenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/devenv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
)

// BenchmarkNodeCredential16 measures POST /v1/node-credential for a full
// 16-agent roster through HTTP on the in-process mesh (parse, 17 signature
// checks, standing in the store, guard, JWT signature, mint recorded in a
// durable transaction), beside the cost of its 17 Ed25519 verifications and
// of building, guarding and signing the JWT alone.
func BenchmarkNodeCredential16(b *testing.B) {
	node, _ := keys.Generate[keys.NodeRole]()
	agents := make([]*keys.Agent, 16)
	ids := make([]string, 16)
	for i := range agents {
		agents[i], _ = keys.Generate[keys.AgentRole]()
		ids[i] = agents[i].Public()
	}
	ts := time.Now().Unix()
	req := nodeRequest(node, agents, ts)
	body, _ := json.Marshal(req)

	ob, err := mail.NewOutbox(b.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	m, err := devenv.Start(context.Background(), devenv.Config{DataDir: b.TempDir(), Mail: ob, RateLimit: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	url := m.URLs().Control + "/v1/node-credential"

	b.Run("http", func(b *testing.B) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "mints/s")
	})
	b.Run("verify17", func(b *testing.B) {
		entries := req["agents"].([]any)
		for b.Loop() {
			if protocol.VerifyNodeCred(ts, node.Public(), ids, req["node_sig"].(string)) != nil {
				b.Fatal("node sig")
			}
			for i, e := range entries {
				if protocol.VerifyNodeAgent(ts, node.Public(), ids[i], e.(map[string]any)["sig"].(string)) != nil {
					b.Fatal("agent sig")
				}
			}
		}
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
