package engagement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
)

// On a real broker: the mirror makes mesh_commerce when no worker has,
// and every write is a compare-and-set: a stale revision is ErrConflict,
// for a put and for a delete, and a deleted key is written afresh from
// revision 0.
func TestBusTermsCompareAndSet(t *testing.T) {
	b := bustest.Start(t)
	js, err := jetstream.New(bustest.Client(t, b))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	terms := &engagement.BusTerms{JS: js}
	const key = "eng.S.C.summarize"
	if v, rev, err := terms.Get(ctx, key); err != nil || v != nil || rev != 0 {
		t.Fatalf("absent: %q %d %v", v, rev, err)
	}
	if _, err := js.KeyValue(ctx, commerce.Bucket); err != nil {
		t.Fatalf("the bucket was not made: %v", err)
	}
	if err := terms.Put(ctx, key, []byte(`{"v":1}`), 0); err != nil {
		t.Fatal(err)
	}
	if err := terms.Put(ctx, key, []byte(`{"v":2}`), 0); !errors.Is(err, engagement.ErrConflict) {
		t.Fatalf("create over a value: %v", err)
	}
	_, rev, _ := terms.Get(ctx, key)
	if err := terms.Put(ctx, key, []byte(`{"v":2}`), rev+7); !errors.Is(err, engagement.ErrConflict) {
		t.Fatalf("a stale revision: %v", err)
	}
	if err := terms.Put(ctx, key, []byte(`{"v":2}`), rev); err != nil {
		t.Fatal(err)
	}
	if err := terms.Delete(ctx, key, rev); !errors.Is(err, engagement.ErrConflict) {
		t.Fatalf("delete at a stale revision: %v", err)
	}
	_, rev, _ = terms.Get(ctx, key)
	if err := terms.Delete(ctx, key, rev); err != nil {
		t.Fatal(err)
	}
	if v, rev, err := terms.Get(ctx, key); err != nil || v != nil || rev != 0 {
		t.Fatalf("after the delete: %q %d %v", v, rev, err)
	}
	if err := terms.Put(ctx, key, []byte(`{"v":3}`), 0); err != nil {
		t.Fatalf("written afresh after a delete: %v", err)
	}
}
