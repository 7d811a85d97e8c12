package devenv_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
)

// A guest that floods the broker with forbidden publishes costs the log one
// warning, not one error line per publish: the broker's lines as they
// really are go through the aggregation.
func TestViolationFloodIsOneLine(t *testing.T) {
	var buf syncBuffer
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	st, g := c.post("/v1/guest", nil, "")
	if st != 200 {
		t.Fatalf("guest: %d %v", st, g)
	}
	const flood = 300
	errCh := make(chan error, flood*2)
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(g["jwt"].(string), g["seed"].(string)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range flood {
		if err := nc.Publish("mesh.peer.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Every refusal reaches the client (silence is not proof), so every
	// line reached the broker's log.
	deadline := time.After(10 * time.Second)
	for seen := 0; seen < flood; {
		select {
		case err := <-errCh:
			if strings.Contains(err.Error(), "Permissions Violation") {
				seen++
			}
		case <-deadline:
			t.Fatalf("%d of %d violations reached the client", seen, flood)
		}
	}
	var warned int
	for _, l := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		if strings.Contains(l, "Violation") && m["msg"] != "permissions violation" {
			t.Errorf("a violation logged as it came: %s", l)
		}
		if m["msg"] == "permissions violation" && m["subject"] == "mesh.peer.x" && m["kind"] == "publish" {
			warned++
			if u, _ := m["user"].(string); u != g["publicKey"] {
				t.Errorf("the line names user %q, the guest is %v", u, g["publicKey"])
			}
		}
	}
	if warned != 1 {
		t.Errorf("%d violations wrote %d lines, want 1:\n%s", flood, warned, buf.String())
	}
}
