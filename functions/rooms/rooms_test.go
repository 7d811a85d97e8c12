package rooms_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/api"
	roomsfn "agentmesh.dev/mesh/functions/rooms"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

type owner struct{}

func (owner) Owner(context.Context, string) (rooms.Owner, error) {
	return rooms.Owner{Handle: "bot.ana@example.org", Operator: "ana@example.org"}, nil
}

// post runs the job route as Cloud Scheduler does and decodes its answer.
func post(t *testing.T, d *api.Deps) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	d.Function(roomsfn.Routes[0]).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jobs/room-sweep", nil))
	var out map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

// RoomSweep is an hourly job that asks the rooms worker, over the bus with
// the services key, to expire idle rooms; without a bus it is not
// configured.
func TestRoomSweepJob(t *testing.T) {
	rt := roomsfn.Routes[0]
	if rt.Auth != api.Scheduled(time.Hour) || rt.Method != http.MethodPost {
		t.Fatalf("row %+v", rt)
	}
	b := bustest.Start(t)
	w, err := rooms.Start(t.Context(), bustest.Env(t, b, "rooms", nil), rooms.Config{Owners: owner{}, Limits: rooms.Limits{IdleAfter: time.Nanosecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	nc := bustest.Client(t, b)
	ana := bustest.Agent(t)
	d := map[string]any{"rooms": "v1", "room_id": "swept-room", "channels": []any{"main"}, "record": rooms.DurableRecord("swept-room"),
		"privacy": rooms.GradeCapability, "creator": ana.Public(), "created_at": protocol.FormatTime(time.Now())}
	sig, err := protocol.SignRoomDescriptor(d, ana)
	if err != nil {
		t.Fatal(err)
	}
	d["sig"] = sig
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, nc, ana, protocol.RoomVerbSubject("provision"), protocol.TypeRequest, "", map[string]any{"descriptor": d}); err != nil {
		t.Fatal(err)
	}

	deps := &api.Deps{Log: slog.New(slog.DiscardHandler), Bus: &bus.Caller{NC: nc, Key: b.ServicesKey()}}
	if st, out := post(t, deps); st != 200 || out["ok"] != true || out["count"] != float64(1) {
		t.Fatalf("sweep: %d %v", st, out)
	}
	if st, out := post(t, deps); st != 200 || out["count"] != float64(0) {
		t.Fatalf("sweep again: %d %v", st, out)
	}
	// Signed by another key, the worker refuses it: the job fails.
	other := &api.Deps{Log: slog.New(slog.DiscardHandler), Bus: &bus.Caller{NC: nc, Key: ana}}
	if st, _ := post(t, other); st != http.StatusServiceUnavailable {
		t.Fatalf("sweep by an agent key: %d", st)
	}
	if st, _ := post(t, &api.Deps{Log: slog.New(slog.DiscardHandler)}); st != http.StatusNotImplemented {
		t.Fatalf("no bus: %d", st)
	}
}
