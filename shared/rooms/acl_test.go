package rooms

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// brokerWait bounds every wait for the broker: an asynchronous refusal, a
// closed connection. Silence within it fails the test.
const brokerWait = 5 * time.Second

// aclMesh is one broker with copies of the rooms worker minting and
// revoking room credentials with the broker's own trust chain.
type aclMesh struct {
	t       *testing.T
	b       *bustest.Bus
	kv      jetstream.KeyValue
	client  *nats.Conn
	workers []*Worker
}

// brokerRevoker revokes through the broker's account JWT, as devenv.Mesh
// does on one machine.
type brokerRevoker struct{ b *bustest.Bus }

func (r brokerRevoker) Revoke(ctx context.Context, userKeys []string, at time.Time) error {
	return r.b.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error { return creds.RevokeCredentials(ac, at, userKeys...) })
}

func (r brokerRevoker) SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error) {
	err = r.b.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		if added, forgotten = creds.SyncRevocations(ac, keep, forget); added+forgotten == 0 {
			return broker.ErrUnchanged
		}
		return nil
	})
	return added, forgotten, err
}

// revokedAt is the broker's revocation of key (zero for none).
func (m *aclMesh) revokedAt(key string) time.Time {
	m.t.Helper()
	var at time.Time
	if err := m.b.UpdateMeshAccount(m.t.Context(), func(ac *jwt.AccountClaims) error {
		at = creds.RevokedAt(ac, key)
		return broker.ErrUnchanged
	}); err != nil {
		m.t.Fatal(err)
	}
	return at
}

// startACL starts copies of the rooms worker; trust says whether they
// get Credentials.
func startACL(t *testing.T, copies int, limits Limits, trust bool) *aclMesh {
	t.Helper()
	b := bustest.Start(t)
	cfg := Config{Limits: limits}
	if trust {
		cfg.Credentials = &TrustCredentials{Trust: b.Trust(), Revoker: brokerRevoker{b}}
	}
	m := &aclMesh{t: t, b: b, client: bustest.Client(t, b)}
	for i := range copies {
		w, err := Start(t.Context(), bustest.Env(t, b, fmt.Sprintf("rooms-%d", i), nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		m.workers = append(m.workers, w)
	}
	js, err := jetstream.New(m.client)
	if err != nil {
		t.Fatal(err)
	}
	if m.kv, err = js.KeyValue(t.Context(), Bucket); err != nil {
		t.Fatal(err)
	}
	return m
}

// room provisions a durable room of privacy created by creator, as
// mesh.rooms.provision leaves it (the acl grade's creator its first
// member), and returns its signed descriptor.
func (m *aclMesh) room(creator *keys.Agent, privacy string) (json.RawMessage, string) {
	m.t.Helper()
	idb := make([]byte, 18)
	_, _ = rand.Read(idb)
	id := base64.RawURLEncoding.EncodeToString(idb)
	d := map[string]any{"rooms": DescriptorVersion, "room_id": id, "name": "acl test", "channels": []any{"main"},
		"record": DurableRecord(id), "privacy": privacy, "creator": creator.Public(),
		"created_at": time.Now().UTC().Format(time.RFC3339)}
	sig, err := protocol.SignRoomDescriptor(d, creator)
	if err != nil {
		m.t.Fatal(err)
	}
	d["sig"] = sig
	raw, err := json.Marshal(d)
	if err != nil {
		m.t.Fatal(err)
	}
	r := Room{ID: id, Privacy: privacy, Channels: []string{"main"}, Creator: creator.Public(), Descriptor: raw,
		CreatedAt: time.Now().UTC(), LastActive: time.Now().UTC()}
	if privacy == GradeACL {
		r.Members = []string{creator.Public()}
	}
	b, err := json.Marshal(r)
	if err != nil {
		m.t.Fatal(err)
	}
	if _, err := m.kv.Create(m.t.Context(), RoomKey(id), b); err != nil {
		m.t.Fatal(err)
	}
	return raw, id
}

// call calls verb as who over nc (nil: the test's service connection, on
// a private reply prefix).
func (m *aclMesh) call(nc *nats.Conn, who *keys.Agent, verb string, payload map[string]any) (map[string]any, error) {
	m.t.Helper()
	if nc == nil {
		nc = m.client
	}
	ctx, cancel := context.WithTimeout(m.t.Context(), 15*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, nc, who, protocol.RoomVerbSubject(verb), protocol.TypeRequest, "", payload)
	if err != nil {
		return nil, err
	}
	v, err := rep.PayloadValue()
	if err != nil {
		return nil, err
	}
	out, _ := v.(map[string]any)
	return out, nil
}

func (m *aclMesh) must(nc *nats.Conn, who *keys.Agent, verb string, payload map[string]any) map[string]any {
	m.t.Helper()
	out, err := m.call(nc, who, verb, payload)
	if err != nil {
		m.t.Fatalf("%s: %v", verb, err)
	}
	return out
}

// refused asserts the call is refused with code, its message containing
// say.
func (m *aclMesh) refused(nc *nats.Conn, who *keys.Agent, verb string, payload map[string]any, code errs.Code, say string) {
	m.t.Helper()
	_, err := m.call(nc, who, verb, payload)
	var e *errs.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, say) {
		m.t.Fatalf("%s = %v, want %s saying %q", verb, err, code, say)
	}
}

// nodeConn is agent's main connection, as the runtime makes it: a node
// credential hosting the agent, on the node key's private reply prefix
// unless shared.
func (m *aclMesh) nodeConn(agent *keys.Agent, shared bool) *nats.Conn {
	m.t.Helper()
	node := bustest.Node(m.t)
	tok, err := m.b.Trust().MintUser(creds.UserSpec{PublicKey: node.Public(), Name: "node", Kind: creds.KindNode,
		Hosted: []string{agent.Public()}, Permissions: creds.NodePermissions([]string{agent.Public()}, creds.Replies{Key: node.Public(), Shared: shared}),
		Expires: time.Now().Add(time.Hour)})
	if err != nil {
		m.t.Fatal(err)
	}
	opts := []nats.Option{nats.UserJWT(func() (string, error) { return tok, nil }, node.SignNonce), nats.NoReconnect()}
	if !shared {
		opts = append(opts, creds.PrivateInbox(node.Public()))
	}
	nc, err := nats.Connect(m.b.ClientURL(), opts...)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(nc.Close)
	return nc
}

// roomConn is a member's second connection, on the room credential the
// credential verb answered, with the inbox prefix it named.
type roomConn struct {
	*nats.Conn
	errs   chan error
	closed chan struct{}
}

func (m *aclMesh) dialRoom(cred map[string]any) (*roomConn, error) {
	seed, _ := cred["seed"].(string)
	key, err := keys.FromSeed[keys.CredentialRole]([]byte(seed))
	if err != nil {
		return nil, fmt.Errorf("the credential's seed: %w", err)
	}
	tok, _ := cred["jwt"].(string)
	prefix, _ := cred["inbox_prefix"].(string)
	c := &roomConn{errs: make(chan error, 16), closed: make(chan struct{})}
	c.Conn, err = nats.Connect(m.b.ClientURL(), nats.UserJWT(func() (string, error) { return tok, nil }, key.SignNonce),
		nats.CustomInboxPrefix(prefix), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }))
	if err != nil {
		return nil, err
	}
	m.t.Cleanup(c.Close)
	return c, nil
}

func (m *aclMesh) roomConn(cred map[string]any) *roomConn {
	m.t.Helper()
	c, err := m.dialRoom(cred)
	if err != nil {
		m.t.Fatalf("connect with the room credential: %v", err)
	}
	return c
}

// violation publishes or subscribes subject on c and waits for the
// broker's permissions violation naming it.
func (c *roomConn) violation(t *testing.T, op, subject string) {
	t.Helper()
	var err error
	verb := "Publish to"
	if op == "publish" {
		err = c.Publish(subject, []byte("x"))
	} else {
		verb = "Subscription to"
		_, err = c.SubscribeSync(subject)
	}
	if err != nil {
		t.Fatalf("%s %s: client-side error, want the broker's refusal: %v", op, subject, err)
	}
	want := fmt.Sprintf("Permissions Violation for %s %q", verb, subject)
	select {
	case err := <-c.errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), want) {
			t.Fatalf("async error %q, want %q", err, want)
		}
	case <-time.After(brokerWait):
		t.Fatalf("no refusal from the broker within %s for: %s", brokerWait, want)
	}
}

// quiet asserts the broker refused nothing on c so far.
func (c *roomConn) quiet(t *testing.T) {
	t.Helper()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.errs:
		t.Fatalf("allowed traffic was refused: %v", err)
	default:
	}
}

// waitClosed waits for the broker to close c and returns how long after
// since it did.
func (c *roomConn) waitClosed(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	select {
	case <-c.closed:
		return time.Since(since)
	case <-time.After(brokerWait):
		t.Fatalf("the room connection is still open %s after the revocation was asked for", brokerWait)
		return 0
	}
}

func receive(t *testing.T, sub *nats.Subscription, want string) {
	t.Helper()
	msg, err := sub.NextMsg(brokerWait)
	if err != nil {
		t.Fatalf("nothing received on %s: %v", sub.Subject, err)
	}
	if string(msg.Data) != want {
		t.Fatalf("received %q on %s, want %q", msg.Data, sub.Subject, want)
	}
}

// TestACLGradeAtTheBroker is the acl grade end to end on three copies of
// the worker: a non-member's credential request is refused; a member's
// room credential carries the room's traffic and nothing else (another
// room and the rooms verbs are refused by the broker); expel closes the
// member's room connection, the old credential no longer connects, and
// renewal is refused; the creator's own room connection is untouched.
func TestACLGradeAtTheBroker(t *testing.T) {
	m := startACL(t, 3, Limits{}, true)
	creator, member, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	creatorNC, memberNC, strangerNC := m.nodeConn(creator, false), m.nodeConn(member, false), m.nodeConn(stranger, false)

	m.refused(strangerNC, stranger, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "not a member")
	m.must(creatorNC, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})

	mc := m.must(memberNC, member, "credential", map[string]any{"descriptor": desc})
	if mc["inbox_prefix"] != protocol.ACLRoomInboxPrefix(id) {
		t.Fatalf("inbox_prefix %v, want %s", mc["inbox_prefix"], protocol.ACLRoomInboxPrefix(id))
	}
	exp, err := time.Parse(time.RFC3339, fmt.Sprint(mc["expires_at"]))
	if err != nil || exp.After(time.Now().Add(DefaultCredentialTTL+time.Second)) || exp.Before(time.Now().Add(DefaultCredentialTTL-time.Minute)) {
		t.Fatalf("expires_at %v (%v), want an hour from now", mc["expires_at"], err)
	}
	cc := m.must(creatorNC, creator, "credential", map[string]any{"descriptor": desc})
	memberRoom, creatorRoom := m.roomConn(mc), m.roomConn(cc)

	// The room's traffic, both ways, and a request answered in the room.
	heard, err := creatorRoom.SubscribeSync(protocol.ACLRoomSubject(id, "*"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := creatorRoom.Subscribe(protocol.ACLRoomSubject(id, "ask"), func(msg *nats.Msg) { _ = msg.Respond([]byte("answer")) }); err != nil {
		t.Fatal(err)
	}
	if err := creatorRoom.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := memberRoom.Publish(protocol.ACLRoomSubject(id, "main"), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	receive(t, heard, "hello")
	if r, err := memberRoom.Request(protocol.ACLRoomSubject(id, "ask"), []byte("q"), brokerWait); err != nil || string(r.Data) != "answer" {
		t.Fatalf("request in the room: %v %v", r, err)
	}
	memberRoom.quiet(t)

	// Another room, and everything outside the room, is refused.
	_, other := m.room(creator, GradeACL)
	memberRoom.violation(t, "publish", protocol.ACLRoomSubject(other, "main"))
	memberRoom.violation(t, "subscribe", protocol.ACLRoomSubject(other, "main"))
	memberRoom.violation(t, "subscribe", protocol.ACLRoomInboxPrefix(other)+".>")
	memberRoom.violation(t, "publish", protocol.RoomVerbSubject("credential"))
	memberRoom.violation(t, "publish", protocol.RoomVerbSubject("admit"))
	memberRoom.violation(t, "publish", protocol.RoomEventSubject(id, "main"))
	memberRoom.violation(t, "subscribe", "mesh.event.>")
	if !memberRoom.IsConnected() {
		t.Fatal("the broker dropped the room connection instead of refusing single acts")
	}

	// Expel: the member's room connection closes, at once.
	start := time.Now()
	out := m.must(creatorNC, creator, "expel", map[string]any{"descriptor": desc, "member": member.Public(), "severity": "safety"})
	answered := time.Since(start)
	closed := memberRoom.waitClosed(t, start)
	t.Logf("expel answered after %s; the member's room connection closed %s after the expel was sent", answered.Round(time.Microsecond), closed.Round(time.Microsecond))
	if closed > time.Second {
		t.Errorf("the room connection closed %s after the expel, more than a second", closed)
	}
	if out["severity"] != SeveritySafety || out["credentials_revoked"] != float64(1) {
		t.Fatalf("expel answered %v", out)
	}
	if _, err := m.dialRoom(mc); err == nil {
		t.Fatal("the expelled member's room credential connected again")
	}
	m.refused(memberNC, member, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "expelled")
	// The creator's room connection is untouched.
	creatorRoom.quiet(t)
	if !creatorRoom.IsConnected() {
		t.Fatal("the creator's room connection closed with the member's")
	}
}

// TestLeave: a member leaves (their room connection closes and renewal is
// refused), leaving again is quiet, the creator is refused and pointed at
// reclaim, and a leave message handled by memberLeft does the same.
func TestLeave(t *testing.T) {
	m := startACL(t, 3, Limits{}, true)
	creator, member, second := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	for _, a := range []*keys.Agent{member, second} {
		m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": a.Public()})
	}
	room := m.roomConn(m.must(nil, member, "credential", map[string]any{"descriptor": desc}))

	start := time.Now()
	out := m.must(nil, member, "leave", map[string]any{"descriptor": desc})
	t.Logf("left; the room connection closed %s after the leave was sent", room.waitClosed(t, start).Round(time.Microsecond))
	if out["left"] != true || out["member"] != member.Public() {
		t.Fatalf("leave answered %v", out)
	}
	if again := m.must(nil, member, "leave", map[string]any{"descriptor": desc}); again["left"] != true {
		t.Fatalf("leaving again answered %v", again)
	}
	m.refused(nil, member, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "not a member")
	m.refused(nil, creator, "leave", map[string]any{"descriptor": desc}, errs.Forbidden, "mesh.rooms.reclaim")

	// The same through memberLeft (the ingest's leave message), on any copy.
	room2 := m.roomConn(m.must(nil, second, "credential", map[string]any{"descriptor": desc}))
	start = time.Now()
	if err := m.workers[2].memberLeft(t.Context(), id, second.Public()); err != nil {
		t.Fatal(err)
	}
	room2.waitClosed(t, start)
	if err := m.workers[0].memberLeft(t.Context(), id, second.Public()); err != nil {
		t.Fatalf("a second leave: %v", err)
	}
	if err := m.workers[1].memberLeft(t.Context(), id, creator.Public()); errs.As(err).Code != errs.Forbidden {
		t.Fatalf("the creator's leave message: %v", err)
	}
	r := m.readRoom(id)
	if len(r.Members) != 1 || r.Members[0] != creator.Public() || len(r.Expelled) != 0 {
		t.Fatalf("members %v expelled %v after both left", r.Members, r.Expelled)
	}
}

func (m *aclMesh) readRoom(id string) Room {
	m.t.Helper()
	r, found, err := bus.GetJSON[Room](m.t.Context(), m.kv, RoomKey(id))
	if err != nil || !found {
		m.t.Fatalf("room %s: %v %v", id, found, err)
	}
	return r
}

// TestAdmitAndExpelAreTheCreators: only the creator admits and expels;
// the verbs are for acl rooms; the roster is capped; a member's index
// entry follows admit and expel; an unknown severity is conduct; and an
// expelled member admitted again gets a credential again.
func TestAdmitAndExpelAreTheCreators(t *testing.T) {
	m := startACL(t, 3, Limits{Roster: 3}, true)
	creator, a, b, c := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	admit := func(who, agent *keys.Agent) map[string]any {
		return map[string]any{"descriptor": desc, "agent_id": agent.Public()}
	}
	m.must(nil, creator, "admit", admit(creator, a))
	m.must(nil, creator, "admit", admit(creator, a)) // twice: the same answer

	m.refused(nil, a, "admit", admit(a, b), errs.Forbidden, "only the creator")
	m.refused(nil, b, "admit", admit(b, b), errs.Forbidden, "only the creator")
	m.refused(nil, a, "expel", map[string]any{"descriptor": desc, "member": creator.Public()}, errs.Forbidden, "only the creator")
	m.refused(nil, creator, "expel", map[string]any{"descriptor": desc, "member": creator.Public()}, errs.InputInvalid, "reclaim")
	m.refused(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": "U*"}, errs.InputInvalid, "agent_id")
	m.refused(nil, creator, "admit", map[string]any{"agent_id": a.Public()}, errs.InputInvalid, "descriptor")

	// The roster: the creator, a and b fill three places.
	m.must(nil, creator, "admit", admit(creator, b))
	m.refused(nil, creator, "admit", admit(creator, c), errs.QuotaExceeded, "3 members")

	if _, err := m.kv.Get(t.Context(), MemberKey(a.Public(), id)); err != nil {
		t.Fatalf("a's index entry: %v", err)
	}
	out := m.must(nil, creator, "expel", map[string]any{"descriptor": desc, "member": a.Public(), "severity": "rude"})
	if out["severity"] != SeverityConduct {
		t.Fatalf("unknown severity answered as %v, want conduct", out["severity"])
	}
	if _, err := m.kv.Get(t.Context(), MemberKey(a.Public(), id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a's index entry after expel: %v", err)
	}
	m.must(nil, creator, "expel", map[string]any{"descriptor": desc, "member": a.Public()}) // twice: quiet
	r := m.readRoom(id)
	if strings.Join(r.Members, ",") != creator.Public()+","+b.Public() || strings.Join(r.Expelled, ",") != a.Public() {
		t.Fatalf("members %v expelled %v", r.Members, r.Expelled)
	}
	m.refused(nil, a, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "expelled")
	// Admitted again: off the expelled list, a credential again.
	m.must(nil, creator, "admit", admit(creator, a))
	m.roomConn(m.must(nil, a, "credential", map[string]any{"descriptor": desc})).quiet(t)

	// Another grade: the verbs are refused, the room untouched.
	cap, _ := m.room(creator, GradeCapability)
	m.refused(nil, creator, "admit", map[string]any{"descriptor": cap, "agent_id": a.Public()}, errs.InputInvalid, "for acl rooms")
	m.refused(nil, creator, "credential", map[string]any{"descriptor": cap}, errs.InputInvalid, "for acl rooms")
	// A room nobody provisioned, and a descriptor that is not the room's.
	ghost := bustest.Agent(t)
	gdesc, gid := m.room(ghost, GradeACL)
	if err := m.kv.Delete(t.Context(), RoomKey(gid)); err != nil {
		t.Fatal(err)
	}
	m.refused(nil, ghost, "admit", map[string]any{"descriptor": gdesc, "agent_id": a.Public()}, errs.NotFound, "not provisioned")
	m.refused(nil, ghost, "leave", map[string]any{"descriptor": gdesc}, errs.NotFound, "not provisioned")
}

// TestCredentialNeedsAPrivateReplyAndTrust: the seed never goes to the
// shared _INBOX., and a worker without Credentials says so.
func TestCredentialNeedsAPrivateReplyAndTrust(t *testing.T) {
	m := startACL(t, 1, Limits{}, true)
	creator := bustest.Agent(t)
	desc, _ := m.room(creator, GradeACL)
	m.refused(m.nodeConn(creator, true), creator, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "private reply")

	bare := startACL(t, 1, Limits{}, false)
	desc, _ = bare.room(creator, GradeACL)
	bare.refused(nil, creator, "credential", map[string]any{"descriptor": desc}, errs.Unavailable, "no room credentials")
	// Admit, expel and leave need no trust chain.
	member := bustest.Agent(t)
	bare.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})
	bare.must(nil, member, "leave", map[string]any{"descriptor": desc})
}

// TestExpelDuringRenewals races credential requests on every copy against
// an expel: every credential the member was handed is closed or refused by
// the broker afterwards, whichever side of the expel it was minted on.
func TestExpelDuringRenewals(t *testing.T) {
	m := startACL(t, 3, Limits{}, true)
	creator, member := bustest.Agent(t), bustest.Agent(t)
	desc, _ := m.room(creator, GradeACL)
	m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})

	var (
		mu     sync.Mutex
		handed []map[string]any
		wg     sync.WaitGroup
		first  = make(chan struct{})
		once   sync.Once
	)
	for range MaxLiveCredentials {
		wg.Go(func() {
			out, err := m.call(nil, member, "credential", map[string]any{"descriptor": desc})
			if err == nil {
				mu.Lock()
				handed = append(handed, out)
				mu.Unlock()
				once.Do(func() { close(first) })
			}
		})
	}
	// The expel goes out once the first credential is handed over, while
	// the others are being minted on the three copies.
	select {
	case <-first:
	case <-time.After(brokerWait):
		t.Fatal("no credential handed out")
	}
	m.must(nil, creator, "expel", map[string]any{"descriptor": desc, "member": member.Public()})
	wg.Wait()
	t.Logf("%d of %d credentials were handed out around the expel", len(handed), MaxLiveCredentials)
	for i, c := range handed {
		rc, err := m.dialRoom(c)
		if err != nil {
			continue // refused at connect: revoked
		}
		select {
		case <-rc.closed:
		case <-time.After(brokerWait):
			t.Fatalf("credential %d handed out around the expel still holds a room connection", i)
		}
	}
	m.refused(nil, member, "credential", map[string]any{"descriptor": desc}, errs.Forbidden, "expelled")
	// Every credential on record is revoked: those handed out, and those
	// minted, recorded and taken back before they were.
	if live, revoked := m.credsOnRecord(desc, member); live != 0 || revoked < len(handed) {
		t.Fatalf("%d unrevoked and %d revoked credentials on record after the expel, want 0 and at least %d", live, revoked, len(handed))
	}
}

// credsOnRecord counts member's credentials on record in the room: live
// and unrevoked, and revoked.
func (m *aclMesh) credsOnRecord(desc json.RawMessage, member *keys.Agent) (live, revoked int) {
	m.t.Helper()
	d, err := ParseDescriptor(desc)
	if err != nil {
		m.t.Fatal(err)
	}
	rec, _, err := bus.GetJSON[CredRecord](m.t.Context(), m.kv, CredKey(d.RoomID, member.Public()))
	if err != nil {
		m.t.Fatal(err)
	}
	for _, c := range rec.Creds {
		if c.Revoked {
			revoked++
		} else {
			live++
		}
	}
	return live, revoked
}

// TestLiveCredentialsAreBounded: a member holds at most MaxLiveCredentials
// at once; expired ones leave the record as new ones are recorded.
func TestLiveCredentialsAreBounded(t *testing.T) {
	m := startACL(t, 1, Limits{}, true)
	creator := bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	for range MaxLiveCredentials {
		m.must(nil, creator, "credential", map[string]any{"descriptor": desc})
	}
	m.refused(nil, creator, "credential", map[string]any{"descriptor": desc}, errs.QuotaExceeded, "live credentials")

	// Expired on record: the next one is recorded in their place.
	w := m.workers[0]
	w.now = func() time.Time { return time.Now().Add(DefaultCredentialTTL + 2*credSkew) }
	m.must(nil, creator, "credential", map[string]any{"descriptor": desc})
	if live, revoked := m.credsOnRecord(desc, creator); live != 1 || revoked != 0 {
		t.Fatalf("%d live and %d revoked credentials on record, want the new one only", live, revoked)
	}
	_ = id
}

// TestReclaimRevokesEveryMembersCredentials: roomClosed (reclaim and idle
// expiry call it before the room's keys go) closes every member's room
// connection.
func TestReclaimRevokesEveryMembersCredentials(t *testing.T) {
	m := startACL(t, 2, Limits{}, true)
	creator, member := bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})
	conns := []*roomConn{
		m.roomConn(m.must(nil, creator, "credential", map[string]any{"descriptor": desc})),
		m.roomConn(m.must(nil, member, "credential", map[string]any{"descriptor": desc})),
		m.roomConn(m.must(nil, member, "credential", map[string]any{"descriptor": desc})),
	}
	r := m.readRoom(id)
	if err := m.workers[1].roomClosed(t.Context(), &r); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		c.waitClosed(t, time.Now())
	}
	cl, cr := m.credsOnRecord(desc, creator)
	ml, mr := m.credsOnRecord(desc, member)
	if cl+ml != 0 || cr+mr != 3 {
		t.Fatalf("on record: %d unrevoked, %d revoked; want 0 and 3", cl+ml, cr+mr)
	}
}

// TestSyncRevocations: a room credential's revocation the broker lost (two
// updates of the account JWT at once) is made again by the sweep's sync,
// and one whose credential has expired is forgotten at the broker and on
// record.
func TestSyncRevocations(t *testing.T) {
	m := startACL(t, 2, Limits{}, true)
	creator, member := bustest.Agent(t), bustest.Agent(t)
	desc, _ := m.room(creator, GradeACL)
	m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})
	cred := m.must(nil, member, "credential", map[string]any{"descriptor": desc})
	seed, _ := cred["seed"].(string)
	key, err := keys.FromSeed[keys.CredentialRole]([]byte(seed))
	if err != nil {
		t.Fatal(err)
	}
	m.must(nil, creator, "expel", map[string]any{"descriptor": desc, "member": member.Public()})
	if m.revokedAt(key.Public()).IsZero() {
		t.Fatal("the expel revoked nothing at the broker")
	}

	// Lost: another process's update of the account JWT, built on the JWT
	// before the expel's, drops the revocation; the credential connects.
	if err := m.b.UpdateMeshAccount(t.Context(), func(ac *jwt.AccountClaims) error {
		delete(ac.Revocations, key.Public())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	back := m.roomConn(cred)
	restored, forgotten, err := m.workers[1].syncRevocations(t.Context())
	if err != nil || restored != 1 || forgotten != 0 {
		t.Fatalf("sync: restored %d, forgot %d: %v", restored, forgotten, err)
	}
	back.waitClosed(t, time.Now())
	if _, err := m.dialRoom(cred); err == nil {
		t.Fatal("the credential connects after the sync")
	}
	if restored, _, err := m.workers[0].syncRevocations(t.Context()); err != nil || restored != 0 {
		t.Fatalf("a second sync restored %d: %v", restored, err)
	}

	// Past its expiry the revocation is no longer needed: forgotten at the
	// broker and on record.
	m.workers[0].now = func() time.Time { return time.Now().Add(DefaultCredentialTTL + 2*credSkew) }
	restored, forgotten, err = m.workers[0].syncRevocations(t.Context())
	if err != nil || restored != 0 || forgotten != 1 {
		t.Fatalf("sync after expiry: restored %d, forgot %d: %v", restored, forgotten, err)
	}
	if at := m.revokedAt(key.Public()); !at.IsZero() {
		t.Fatalf("the broker still revokes the expired credential (up to %s)", at)
	}
	if live, revoked := m.credsOnRecord(desc, member); live+revoked != 0 {
		t.Fatalf("on record after the sync: %d live, %d revoked", live, revoked)
	}
}
