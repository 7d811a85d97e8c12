package audit

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus/bustest"
)

// A chain longer than one batch read is read whole, in order.
func TestRowsReadInBatches(t *testing.T) {
	defer func(n int) { readBatch = n }(readBatch)
	readBatch = 7
	b := bustest.Start(t)
	js, err := jetstream.New(bustest.Client(t, b))
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenChains(t.Context(), ChainsConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	agent, other := bustest.Agent(t).Public(), bustest.Agent(t).Public()
	for i := range 23 {
		for _, a := range []string{agent, other} {
			id := fmt.Sprint(i)
			if _, _, err := c.Append(t.Context(), Entry{Agent: a, Role: RoleRequester, Peer: "UPEER", RequestID: id,
				Outcome: "completed", Duration: time.Millisecond, InputSHA256: InputDigest([]byte(id))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := c.Rows(t.Context(), agent)
	if err != nil || len(rows) != 23 || rows[22].Seq != 23 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
}
