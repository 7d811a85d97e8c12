package rooms

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// roomCreds is a stand-in for mesh.rooms.credential: it mints a short
// credential scoped to the room's acl subjects (as the acl grade's does),
// or refuses once the member is out.
type roomCreds struct {
	f       *fakeMesh
	ttl     time.Duration
	refuse  atomic.Bool
	mu      sync.Mutex
	minted  []string // user keys
	granted int
}

func (rc *roomCreds) serve(r *bus.Request) (any, error) {
	if rc.refuse.Load() {
		return nil, errs.New(errs.Forbidden, "you were expelled from this room")
	}
	d, err := ParseRoom(mustJSON(r.Object()["descriptor"]))
	if err != nil {
		return nil, err
	}
	k, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return nil, err
	}
	scope := []string{protocol.ACLRoomSubject(d.RoomID, ">"), protocol.ACLRoomInboxPrefix(d.RoomID) + ".>"}
	tok, err := rc.f.b.Trust().MintUser(creds.UserSpec{PublicKey: k.Public(), Name: "room " + d.RoomID, Kind: creds.KindService,
		Permissions: creds.Permissions{PubAllow: scope, SubAllow: scope}, Expires: time.Now().Add(rc.ttl)})
	if err != nil {
		return nil, err
	}
	rc.mu.Lock()
	rc.minted = append(rc.minted, k.Public())
	rc.granted++
	rc.mu.Unlock()
	return map[string]any{"jwt": tok, "seed": string(k.Seed())}, nil
}

func (rc *roomCreds) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.granted
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// The acl grade's second connection: traffic on mesh.aclroom.<room>.> with
// the room credential, renewed at two thirds of its life, and stopped for
// good when the broker drops it and the renewal is refused (expel).
func TestACLConnection(t *testing.T) {
	f := newFakeMesh(t)
	rc := &roomCreds{f: f, ttl: 3 * time.Second}
	f.answer("credential", rc.serve)
	stopped := make(chan error, 1)
	ana := bustest.Agent(t)
	c := f.client(t, ana, func(cfg *Config) {
		cfg.URL = f.b.ClientURL()
		cfg.OnACLStop = func(room string, why error) { stopped <- why }
	})
	tr := f.watch(t, "mesh.aclroom.>")
	h, err := c.Create(t.Context(), NewRoom{Name: "closed", Privacy: GradeACL})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing of an acl room rides the open event space.
	envs := tr.await(t, 1)
	if p := payloadOf(t, envs[0]); p["type"] != "genesis" || envs[0].ContextID != h.RoomID {
		t.Fatalf("genesis on the acl subject: %v", p)
	}
	r, _ := h.Room()
	a, err := c.ACL(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	var heard atomic.Int64
	if err := a.Subscribe(protocol.ACLRoomSubject(h.RoomID, "*"), func(*nats.Msg) { heard.Add(1) }); err != nil {
		t.Fatal(err)
	}
	// Renewed before it runs out: a new credential, the subscription moved.
	first := a.Conn()
	eventually3(t, "the renewal", func() bool { return rc.count() >= 2 && a.Conn() != first })
	if first.IsConnected() {
		t.Fatal("the replaced connection is still open")
	}
	if _, err := c.Say(t.Context(), h.RoomID, "", "after the renewal", ""); err != nil {
		t.Fatal(err)
	}
	eventually3(t, "the message on the renewed connection", func() bool { return heard.Load() >= 1 })

	// Expelled: the broker drops the credential, and the renewal is refused.
	rc.refuse.Store(true)
	rc.mu.Lock()
	minted := append([]string(nil), rc.minted...)
	rc.mu.Unlock()
	rv := &creds.Revoker{Trust: f.b.Trust(), Sys: f.b.System()}
	if err := rv.Revoke(t.Context(), minted, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case why := <-stopped:
		if errs.CodeOf(why) != errs.Forbidden || !strings.Contains(why.Error(), "access to the room has ended") {
			t.Fatalf("stopped because %v", why)
		}
	case <-time.After(3 * wait):
		t.Fatal("the acl connection did not stop after its credential was revoked and refused")
	}
	if _, err := c.Say(t.Context(), h.RoomID, "", "still here?", ""); errs.CodeOf(err) != errs.Forbidden {
		t.Fatalf("say after expel: %v", err)
	}
	if a.Conn() != nil {
		t.Fatal("a connection survived the refusal")
	}
}

// A first refusal is the say's error; nothing is published.
func TestACLRefusedAtOnce(t *testing.T) {
	f := newFakeMesh(t)
	rc := &roomCreds{f: f, ttl: time.Hour}
	rc.refuse.Store(true)
	f.answer("credential", rc.serve)
	bob := bustest.Agent(t)
	r := newRoom(t, bustest.Agent(t), NewRoom{Privacy: GradeACL})
	c := f.client(t, bob, func(cfg *Config) { cfg.URL = f.b.ClientURL() })
	if _, err := c.Store().Add(r, RoleMember, "", ""); err != nil {
		t.Fatal(err)
	}
	_, err := c.Say(t.Context(), r.RoomID, "", "hi", "")
	if errs.CodeOf(err) != errs.Forbidden {
		t.Fatalf("say without a credential: %v", err)
	}
	if _, err := c.ACL(context.Background(), newRoom(t, bob, NewRoom{})); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("an acl connection for a capability room: %v", err)
	}
	c.Close()
	if _, err := c.ACL(context.Background(), r); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("a closed client connected: %v", err)
	}
}

func eventually3(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExpel(t *testing.T) {
	f := newFakeMesh(t)
	rc := &roomCreds{f: f, ttl: time.Hour}
	f.answer("credential", rc.serve)
	ana, bob := bustest.Agent(t), bustest.Agent(t).Public()
	c := f.client(t, ana, func(cfg *Config) { cfg.URL = f.b.ClientURL() })
	h, err := c.Create(t.Context(), NewRoom{Name: "closed", Privacy: GradeACL})
	if err != nil {
		t.Fatal(err)
	}
	tr := f.watch(t, protocol.ACLRoomSubject(h.RoomID, "*"))
	x, err := c.Expel(t.Context(), h.RoomID, bob, "", "off topic")
	if err != nil || x.Severity != "conduct" || x.Member != bob {
		t.Fatalf("expel: %+v %v", x, err)
	}
	if p := f.called("expel")[0].Payload; p["member"] != bob || p["severity"] != "conduct" {
		t.Fatalf("expel asked %v", p)
	}
	envs := tr.await(t, 1)
	if p := payloadOf(t, envs[0]); p["type"] != "expel" || p["member"] != bob || p["note"] != "off topic" || envs[0].From != ana.Public() {
		t.Fatalf("expel message %v", p)
	}
	if _, err := c.Expel(t.Context(), h.RoomID, bob, "ban", ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("unknown severity: %v", err)
	}
	open, err := c.Create(t.Context(), NewRoom{Name: "open"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Expel(t.Context(), open.RoomID, bob, "", ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("expel from a capability room: %v", err)
	}
	if n := len(f.called("expel")); n != 1 {
		t.Fatalf("%d expel calls", n)
	}
}
