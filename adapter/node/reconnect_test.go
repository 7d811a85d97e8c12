package node

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// gate is a dialer the test can cut: close drops the current connection,
// and while shut every new dial fails, so the node stays disconnected
// until open.
type gate struct {
	mu   sync.Mutex
	shut bool
	conn net.Conn
}

func (g *gate) Dial(network, address string) (net.Conn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return nil, errors.New("gate: shut")
	}
	c, err := (&net.Dialer{Timeout: 2 * time.Second}).Dial(network, address)
	g.conn = c
	return c, err
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = true
	if g.conn != nil {
		_ = g.conn.Close()
	}
}

func (g *gate) open() {
	g.mu.Lock()
	g.shut = false
	g.mu.Unlock()
}

// connected reports whether the broker lists a client connection named
// name (asked on the system account).
func (tm *testMesh) connected(t *testing.T, sys *nats.Conn, name string) bool {
	t.Helper()
	m, err := sys.Request("$SYS.REQ.SERVER.PING.CONNZ", []byte(`{"limit":4096}`), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var z struct {
		Data struct {
			Conns []struct {
				Name string `json:"name"`
			} `json:"connections"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &z); err != nil {
		t.Fatal(err)
	}
	for _, c := range z.Data.Conns {
		if c.Name == name {
			return true
		}
	}
	return false
}

// The caller's node loses its connection while a call waits, and the
// performer answers during the gap: the answer goes to the caller's inbox
// (a protocol 0.3 request), where nothing listens but the mailbox stream
// captures it; the drain after the reconnect hands it to the call that is
// still waiting, which resolves with it.
func TestAnswerDuringTheCallersReconnect(t *testing.T) {
	tm := newMesh(t)
	sys, err := tm.m.ConnectSystem("reconnect-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	started, release := make(chan string, 1), make(chan struct{})
	kA, kB := agentKey(t), agentKey(t)
	g := &gate{}
	const name = "caller-behind-a-gate"
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{kA}, func(c *Config) {
		c.Name = name
		c.NATSOptions = []nats.Option{nats.SetCustomDialer(g)}
	})
	nB := tm.startNode(t, nodeKey(t), []*keys.Agent{kB}, nil)
	a := tm.host(t, nA, AgentConfig{Key: kA, Name: "caller", Handler: refuseAll})
	tm.host(t, nB, AgentConfig{Key: kB, Name: "slow", Handler: func(ctx context.Context, c *Call) error {
		started <- c.Env.ID
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return c.Reply(map[string]any{"text": "answered in the gap"})
	}})

	type outcome struct {
		res *Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := a.Request(t.Context(), kB.Public(), "chat", nil, RequestOptions{Timeout: 30 * time.Second})
		done <- outcome{res, err}
	}()
	var reqID string
	select {
	case reqID = <-started:
	case <-time.After(asyncWait):
		t.Fatal("the performer never got the request")
	}
	// The accept went out before the handler ran; once it is stored, cut
	// the caller off and wait until the broker has dropped it.
	eventually(t, "the accept in the caller's mailbox", func() bool { return tm.mailboxStored(t, kA.Public()) >= 1 })
	g.close()
	eventually(t, "the caller's node to be disconnected", func() bool { return !tm.connected(t, sys, name) })
	before := tm.mailboxStored(t, kA.Public())
	close(release)
	eventually(t, "the answer stored for the disconnected caller", func() bool { return tm.mailboxStored(t, kA.Public()) > before })
	select {
	case o := <-done:
		t.Fatalf("the call ended while its node was disconnected: %+v %v", o.res, o.err)
	default:
	}
	g.open()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.res.RequestID != reqID || o.res.Status != protocol.StateCompleted || !strings.Contains(o.res.Output.(map[string]any)["text"].(string), "in the gap") {
			t.Fatalf("result %+v", o.res)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting call never got the answer drained after the reconnect")
	}
	// The drain deleted what it handled.
	eventually(t, "the caller's mailbox to be drained", func() bool { return tm.mailboxStored(t, kA.Public()) == 0 })
}
