package audit_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// BindChains binds the stream a writer made, as it is (its limits and
// replicas untouched), reads and purges through it, and says ErrNoChains
// before any writer made it, creating nothing.
func TestBindChains(t *testing.T) {
	b := bustest.Start(t)
	nc, err := b.ConnectService("control-plane")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := audit.BindChains(t.Context(), js); !errors.Is(err, audit.ErrNoChains) {
		t.Fatalf("before any writer: %v, want ErrNoChains", err)
	}
	if _, err := js.Stream(t.Context(), audit.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("BindChains created the stream: %v", err)
	}

	w := openChains(t, b, "audit-writer", nil)
	a := bustest.Agent(t).Public()
	if _, _, err := w.Append(t.Context(), entry(a, "1")); err != nil {
		t.Fatal(err)
	}
	c, err := audit.BindChains(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	if h, found, err := c.Head(t.Context(), a); err != nil || !found || h.Seq != 1 {
		t.Fatalf("head through the bound stream: %+v %v %v", h, found, err)
	}
	if err := c.Purge(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if rows, err := w.Rows(t.Context(), a); err != nil || len(rows) != 0 {
		t.Fatalf("after the purge: %d rows, %v", len(rows), err)
	}
}
