package creds

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/keys"
)

func TestMintUserGuardsKinds(t *testing.T) {
	tr := mustTrust(t)
	cred := mustUserKey(t).Public()
	ag := agentKeys(t, 3)
	a, b := ag[0], ag[1]
	hour := time.Now().Add(time.Hour)

	tests := []struct {
		name     string
		spec     UserSpec
		wantErr  string
		wantRule Rule
	}{
		{"node", UserSpec{PublicKey: cred, Kind: KindNode, Hosted: ag[:2], Permissions: NodePermissions(ag[:2], PrivateOnly(cred)), Expires: hour}, "", ""},
		{"node without expiry", UserSpec{PublicKey: cred, Kind: KindNode, Hosted: ag[:2], Permissions: NodePermissions(ag[:2], PrivateOnly(cred))}, "", ""},
		{"bootstrap", UserSpec{PublicKey: cred, Kind: KindBootstrap, Hosted: []string{a}, Permissions: BootstrapPermissions(a, PrivateOnly(cred)), Expires: hour}, "", ""},
		{"app", UserSpec{PublicKey: a, Kind: KindApp, Hosted: []string{a}, Permissions: AppPermissions(a, true), Expires: hour}, "", ""},
		{"guest", UserSpec{PublicKey: a, Kind: KindGuest, Hosted: []string{a}, Permissions: GuestPermissions(a), Expires: hour}, "", ""},
		{"job", UserSpec{PublicKey: cred, Kind: KindJob, Hosted: []string{a}, Permissions: JobPermissions(cred, a, "t1"), Expires: time.Now().Add(10 * time.Minute)}, "", ""},
		{"service", UserSpec{PublicKey: cred, Kind: KindService, Permissions: ServicePermissions()}, "", ""},
		{"room", UserSpec{PublicKey: cred, Kind: KindRoom, Permissions: RoomPermissions("r1"), Expires: hour}, "", ""},
		{"room without expiry", UserSpec{PublicKey: cred, Kind: KindRoom, Permissions: RoomPermissions("r1")}, "must expire", ""},
		{"room for a day", UserSpec{PublicKey: cred, Kind: KindRoom, Permissions: RoomPermissions("r1"), Expires: time.Now().Add(24 * time.Hour)},
			"lives at most", ""},
		{"room hosting an agent", UserSpec{PublicKey: cred, Kind: KindRoom, Hosted: []string{a}, Permissions: RoomPermissions("r1"), Expires: hour},
			"guard", RuleRoster},
		{"room with a node's set", UserSpec{PublicKey: cred, Kind: KindRoom, Permissions: NodePermissions([]string{a}, PrivateOnly(cred)), Expires: hour},
			"guard", RuleRoomScope},

		{"node roster beyond its set", UserSpec{PublicKey: cred, Kind: KindNode, Hosted: []string{a}, Permissions: NodePermissions(ag[:2], PrivateOnly(cred))},
			"guard", RuleInboxSubscribe},
		{"node with no roster", UserSpec{PublicKey: cred, Kind: KindNode, Permissions: NodePermissions(nil, PrivateOnly(cred))}, "guard", RuleRoster},
		{"node reading another key's replies", UserSpec{PublicKey: cred, Kind: KindNode, Hosted: ag[:2], Permissions: NodePermissions(ag[:2], PrivateOnly(b))},
			"guard", RuleReplySubscribe},
		{"bootstrap reading the agent's replies", UserSpec{PublicKey: cred, Kind: KindBootstrap, Hosted: []string{a}, Permissions: BootstrapPermissions(a, PrivateOnly(a)), Expires: hour},
			"guard", RuleReplySubscribe},
		{"guest issued to another key", UserSpec{PublicKey: cred, Kind: KindGuest, Hosted: []string{a}, Permissions: GuestPermissions(a), Expires: hour},
			"issued to the key it hosts", ""},
		{"app issued to another key", UserSpec{PublicKey: b, Kind: KindApp, Hosted: []string{a}, Permissions: AppPermissions(a, true), Expires: hour},
			"issued to the key it hosts", ""},
		{"bootstrap issued to the agent key", UserSpec{PublicKey: a, Kind: KindBootstrap, Hosted: []string{a}, Permissions: BootstrapPermissions(a, PrivateOnly(cred)), Expires: hour},
			"never to the agent key", ""},
		{"guest without expiry", UserSpec{PublicKey: a, Kind: KindGuest, Hosted: []string{a}, Permissions: GuestPermissions(a)}, "must expire", ""},
		{"job without expiry", UserSpec{PublicKey: cred, Kind: KindJob, Hosted: []string{a}, Permissions: JobPermissions(cred, a, "t1")}, "must expire", ""},
		{"job for a day", UserSpec{PublicKey: cred, Kind: KindJob, Hosted: []string{a}, Permissions: JobPermissions(cred, a, "t1"), Expires: time.Now().Add(24 * time.Hour)},
			"lives at most", ""},
		{"hosted agents without a kind", UserSpec{Kind: KindService, PublicKey: cred, Hosted: []string{a}, Permissions: NodePermissions([]string{a}, PrivateOnly(cred))}, "set the kind", ""},
		{"service with hosted agents", UserSpec{PublicKey: cred, Kind: KindService, Hosted: []string{a}, Permissions: ServicePermissions()}, "set the kind", ""},
		{"unknown kind", UserSpec{PublicKey: cred, Kind: Kind(42), Permissions: ServicePermissions()}, "unknown credential kind", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token, err := tr.MintUser(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				var ge *GuardError
				if tc.wantRule != "" && (!errors.As(err, &ge) || ge.Rule != tc.wantRule) {
					t.Fatalf("err = %v, want a guard refusal by %q", err, tc.wantRule)
				}
				return
			}
			if err != nil {
				t.Fatalf("MintUser: %v", err)
			}
			uc, err := jwt.DecodeUserClaims(token)
			if err != nil {
				t.Fatal(err)
			}
			p := tc.spec.Permissions
			if !slices.Equal(uc.Pub.Allow, p.PubAllow) || !slices.Equal(uc.Sub.Allow, p.SubAllow) ||
				!slices.Equal(uc.Pub.Deny, p.PubDeny) || !slices.Equal(uc.Sub.Deny, p.SubDeny) {
				t.Fatal("JWT permissions differ from the spec's")
			}
		})
	}
}

// TestMintRoomUser: a fresh key per credential, the room set, an expiry
// of ttl, and a refusal of a ttl beyond an hour, of none, and of a room id
// that is not one token.
func TestMintRoomUser(t *testing.T) {
	tr := mustTrust(t)
	before := time.Now()
	c1, err := tr.MintRoomUser("room-1", "member U1", 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := tr.MintRoomUser("room-1", "member U1", MaxRoomLifetime)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Key.Public() == c2.Key.Public() {
		t.Fatal("two room credentials share a key: revoking one would revoke the other")
	}
	uc, err := jwt.DecodeUserClaims(c1.JWT)
	if err != nil {
		t.Fatal(err)
	}
	p := RoomPermissions("room-1")
	if uc.Subject != c1.Key.Public() || uc.Name != "member U1" ||
		!slices.Equal(uc.Pub.Allow, p.PubAllow) || !slices.Equal(uc.Sub.Allow, p.SubAllow) ||
		!slices.Equal(uc.Pub.Deny, p.PubDeny) || !slices.Equal(uc.Sub.Deny, p.SubDeny) {
		t.Fatalf("claims: subject %s name %q pub %q sub %q", uc.Subject, uc.Name, uc.Pub.Allow, uc.Sub.Allow)
	}
	if exp := time.Unix(uc.Expires, 0); exp.Before(before.Add(30*time.Minute).Truncate(time.Second)) || exp.After(time.Now().Add(30*time.Minute)) {
		t.Fatalf("expires %s, want 30 minutes from the mint", exp)
	}
	for _, tc := range []struct {
		room string
		ttl  time.Duration
		want string
	}{
		{"room-1", MaxRoomLifetime + time.Second, "longer than a room credential lives"},
		{"room-1", 0, "must expire"},
		{"room-1", -time.Minute, "must expire"},
		{"*", time.Minute, "not one subject token"},
		{"a.b", time.Minute, "not one subject token"},
		{"", time.Minute, "not one subject token"},
	} {
		if _, err := tr.MintRoomUser(tc.room, "x", tc.ttl); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("MintRoomUser(%q, %s) = %v, want %q", tc.room, tc.ttl, err, tc.want)
		}
	}
}

// TestMintUserCarriesClassAndLimits: a fence class travels as a JWT tag
// the broker reports in its connection events, and the limits as the
// JWT's own, which the broker enforces.
func TestMintUserCarriesClassAndLimits(t *testing.T) {
	tr := mustTrust(t)
	a := agentKeys(t, 1)[0]
	lim := DefaultClassLimits()[ClassGuest]
	token, err := tr.MintUser(UserSpec{PublicKey: a, Kind: KindGuest, Hosted: []string{a}, Permissions: GuestPermissions(a),
		Expires: time.Now().Add(time.Hour), Class: ClassGuest, Limits: lim.ConnLimits})
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if got := ClassOfTags(uc.Tags); got != ClassGuest {
		t.Errorf("class of tags %q = %q, want %q", uc.Tags, got, ClassGuest)
	}
	if uc.Limits.Payload != lim.Payload || uc.Limits.Subs != lim.Subs {
		t.Errorf("limits payload %d subs %d, want %d and %d", uc.Limits.Payload, uc.Limits.Subs, lim.Payload, lim.Subs)
	}
	// Unclassed: no tag, the account's limits.
	token, err = tr.MintUser(UserSpec{PublicKey: a, Kind: KindApp, Hosted: []string{a}, Permissions: AppPermissions(a, true), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if uc, err = jwt.DecodeUserClaims(token); err != nil {
		t.Fatal(err)
	}
	if ClassOfTags(uc.Tags) != "" || uc.Limits.Payload != jwt.NoLimit || uc.Limits.Subs != jwt.NoLimit {
		t.Errorf("unclassed credential: tags %q, payload %d, subs %d", uc.Tags, uc.Limits.Payload, uc.Limits.Subs)
	}
}

func TestMintServiceUser(t *testing.T) {
	tr := mustTrust(t)
	c, err := tr.MintServiceUser("worker")
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Subject != c.Key.Public() || uc.IssuerAccount != tr.PublicKeys().MeshAccount {
		t.Errorf("subject %s account %s", uc.Subject, uc.IssuerAccount)
	}
	if !slices.Contains(uc.Pub.Deny, "$SYS.>") || !slices.Contains(uc.Sub.Deny, "$SYS.>") {
		t.Errorf("service user does not deny $SYS.>: %v %v", uc.Pub.Deny, uc.Sub.Deny)
	}
	if uc.Expires != 0 {
		t.Errorf("service user expires")
	}
}

func TestMintUserIssuesAfterRevocation(t *testing.T) {
	tr := mustTrust(t)
	key := mustUserKey(t)
	ag := agentKeys(t, 1)
	account := tr.MeshAccountClaims()

	now := time.Now()
	tests := []struct {
		name      string
		revokedAt time.Time
		// minIAT is the least iat the JWT may carry; maxIAT the most.
		minIAT, maxIAT int64
	}{
		{"never revoked", time.Time{}, now.Unix(), now.Unix() + 2},
		{"revoked long ago", now.Add(-time.Hour), now.Unix(), now.Unix() + 2},
		{"revoked this second", now, now.Unix() + 1, now.Unix() + 1},
		{"revoked ahead of the clock", now.Add(10 * time.Second), now.Unix() + 11, now.Unix() + 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token, err := tr.MintUser(UserSpec{
				PublicKey:   key.Public(),
				Name:        "node",
				Kind:        KindNode,
				Hosted:      ag,
				Permissions: NodePermissions(ag, PrivateOnly(key.Public())),
				Expires:     now.Add(time.Hour),
				RevokedAt:   tc.revokedAt,
			})
			if err != nil {
				t.Fatal(err)
			}
			// Decoding verifies the signature of the re-issued JWT.
			uc, err := jwt.DecodeUserClaims(token)
			if err != nil {
				t.Fatal(err)
			}
			if uc.IssuedAt < tc.minIAT || uc.IssuedAt > tc.maxIAT {
				t.Fatalf("iat = %d, want in [%d, %d]", uc.IssuedAt, tc.minIAT, tc.maxIAT)
			}
			if uc.Issuer != tr.PublicKeys().MeshSigningKey || !account.DidSign(uc) {
				t.Fatal("re-issued JWT is not vouched for by the mesh account")
			}
			vr := jwt.CreateValidationResults()
			if uc.Validate(vr); vr.IsBlocking(true) {
				t.Fatalf("re-issued JWT invalid: %v", vr.Errors())
			}
			if !slices.Equal(uc.Pub.Allow, NodePermissions(ag, PrivateOnly(key.Public())).PubAllow) || uc.Name != "node" {
				t.Fatal("re-issued JWT lost its claims")
			}
			// The claim id is the library's own: re-encoding the decoded claims
			// at the same iat gives the same id.
			id, err := claimsID(&jwt.ClaimsData{Audience: uc.Audience, Expires: uc.Expires, IssuedAt: uc.IssuedAt,
				Issuer: uc.Issuer, Name: uc.Name, NotBefore: uc.NotBefore, Subject: uc.Subject})
			if err != nil || id != uc.ID {
				t.Fatalf("claim id %s, recomputed %s (%v)", uc.ID, id, err)
			}
			if !tc.revokedAt.IsZero() {
				revoked := tr.MeshAccountClaims()
				if err := RevokeCredentials(revoked, tc.revokedAt, key.Public()); err != nil {
					t.Fatal(err)
				}
				if revoked.IsClaimRevoked(uc) {
					t.Fatal("fresh credential falls under the revocation it was minted after")
				}
			}
		})
	}
}

func TestRevokeCredentials(t *testing.T) {
	tr := mustTrust(t)
	k1, k2 := mustUserKey(t).Public(), mustUserKey(t).Public()
	ac := tr.MeshAccountClaims()
	at := time.Unix(1_800_000_000, 0)

	if err := RevokeCredentials(ac, at, k1, k2); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{k1, k2} {
		if got := RevokedAt(ac, k); !got.Equal(at) {
			t.Errorf("RevokedAt(%s) = %v, want %v", k, got, at)
		}
		if !ac.Revocations.IsRevoked(k, at) || ac.Revocations.IsRevoked(k, at.Add(time.Second)) {
			t.Errorf("revocation of %s does not cover exactly up to its second", k)
		}
	}
	// An older revocation does not move a newer one back.
	if err := RevokeCredentials(ac, at.Add(-time.Hour), k1); err != nil {
		t.Fatal(err)
	}
	if got := RevokedAt(ac, k1); !got.Equal(at) {
		t.Errorf("revocation moved back to %v", got)
	}
	// The all-keys entry counts when it is the later one.
	other := mustUserKey(t).Public()
	if got := RevokedAt(ac, other); !got.IsZero() {
		t.Errorf("RevokedAt of an unrevoked key = %v", got)
	}
	ac.RevokeAt(jwt.All, at.Add(time.Minute))
	if got := RevokedAt(ac, other); !got.Equal(at.Add(time.Minute)) {
		t.Errorf("RevokedAt ignores the all-keys entry: %v", got)
	}
	if RevokedAt(nil, other) != (time.Time{}) {
		t.Error("RevokedAt(nil) not zero")
	}

	for _, bad := range []struct {
		name string
		ac   *jwt.AccountClaims
		at   time.Time
		keys []string
	}{
		{"nil claims", nil, at, []string{k1}},
		{"zero time", ac, time.Time{}, []string{k1}},
		{"no keys", ac, at, nil},
		{"all keys", ac, at, []string{jwt.All}},
		{"account key", ac, at, []string{tr.PublicKeys().MeshAccount}},
		{"garbage", ac, at, []string{k1, "nope"}},
	} {
		before := len(ac.Revocations)
		if err := RevokeCredentials(bad.ac, bad.at, bad.keys...); err == nil {
			t.Errorf("%s: accepted", bad.name)
		}
		if bad.ac != nil && len(ac.Revocations) != before {
			t.Errorf("%s: revocations changed on refusal", bad.name)
		}
	}
}

// BenchmarkMintNode16 measures the node-credential door's signing work: build
// the set of a 16-agent roster, guard it and sign the JWT.
func BenchmarkMintNode16(b *testing.B) {
	tr, err := Generate()
	if err != nil {
		b.Fatal(err)
	}
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		b.Fatal(err)
	}
	ag := agentKeys(b, MaxNodeAgents)
	expires := time.Now().Add(30 * 24 * time.Hour)
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		if _, err := tr.MintUser(UserSpec{
			PublicKey:   node.Public(),
			Name:        "node",
			Kind:        KindNode,
			Hosted:      ag,
			Permissions: NodePermissions(ag, PrivateOnly(node.Public())),
			Expires:     expires,
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardNode16 is the guard alone, for the same roster.
func BenchmarkGuardNode16(b *testing.B) {
	ag := agentKeys(b, MaxNodeAgents+1)
	node := ag[MaxNodeAgents]
	ag = ag[:MaxNodeAgents]
	p := NodePermissions(ag, PrivateOnly(node))
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		if err := Guard(KindNode, node, ag, p); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLargestCredentialFitsMaxControlLine: the largest credential this
// package mints, with a CONNECT line's overhead, fits MaxControlLine.
func TestLargestCredentialFitsMaxControlLine(t *testing.T) {
	tr := mustTrust(t)
	ag := agentKeys(t, MaxNodeAgents)
	cred := mustUserKey(t).Public()
	token, err := tr.MintUser(UserSpec{
		PublicKey: cred, Name: strings.Repeat("n", 256), Kind: KindNode, Hosted: ag,
		Permissions: NodePermissions(ag, Replies{Key: cred, Shared: true}), Expires: time.Now().Add(time.Hour),
		Class: ClassUnowned, Limits: DefaultClassLimits()[ClassUnowned].ConnLimits,
	})
	if err != nil {
		t.Fatal(err)
	}
	// CONNECT {"verbose":false,...,"jwt":"...","sig":"<86 chars>","name":"..."}:
	// well under 1 KB besides the JWT.
	if len(token)+connectLineOverhead > MaxControlLine {
		t.Fatalf("16-agent node JWT is %d bytes; CONNECT would exceed MaxControlLine %d", len(token), MaxControlLine)
	}
	t.Logf("16-agent node JWT: %d bytes", len(token))

	// A JWT no broker would take is refused at minting.
	_, err = tr.MintUser(UserSpec{Kind: KindService, PublicKey: mustUserKey(t).Public(), Name: strings.Repeat("n", MaxControlLine),
		Permissions: Permissions{PubAllow: []string{"_INBOX.>"}}})
	if err == nil || !strings.Contains(err.Error(), "max_control_line") {
		t.Fatalf("oversized JWT: err = %v", err)
	}
}

// reportCPU reports the process's CPU time per operation since cpu0: on a
// machine others share, it holds still where ns/op does not.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N)/1e3, "cpu-µs/op")
}

// cpuTime is the CPU time this process has used (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
