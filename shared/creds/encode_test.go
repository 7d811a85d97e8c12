package creds

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
)

// libraryAndOurs encodes two copies of the claims build makes: one with the
// jwt library (encodeUser), one with encodeUserAt at the second the
// library stamped; they must be the same bytes.
func libraryAndOurs(t testing.TB, tr *Trust, build func() *jwt.UserClaims) (lib, ours string) {
	t.Helper()
	uc := build()
	lib, err := encodeUser(uc, tr.meshSigning)
	if err != nil {
		t.Fatal(err)
	}
	ours, err = encodeUserAt(build(), tr.meshSigning, uc.IssuedAt)
	if err != nil {
		t.Fatal(err)
	}
	return lib, ours
}

// TestEncodeUserAtIsTheLibrarysEncode: for every kind of credential this
// package mints, the hand-built token is byte for byte the jwt library's
// (header, payload with claim id and version, signature).
func TestEncodeUserAtIsTheLibrarysEncode(t *testing.T) {
	tr := mustTrust(t)
	ag := agentKeys(t, MaxNodeAgents+1)
	cred := ag[MaxNodeAgents]
	ag = ag[:MaxNodeAgents]
	exp := time.Now().Add(30 * 24 * time.Hour)
	type claimsCase struct {
		name   string
		perms  Permissions
		cname  string
		exp    time.Time
		class  string
		limits ConnLimits
	}
	cases := []claimsCase{
		{"service", ServicePermissions(), "svc", time.Time{}, "", ConnLimits{}},
		{"guest", GuestPermissions(ag[0]), "guest <&> \u2028", exp, ClassGuest, DefaultClassLimits()[ClassGuest].ConnLimits},
		{"job", JobPermissions(cred, ag[0], "t1"), "job", exp, "", ConnLimits{}},
		{"unowned", NodePermissions(ag[:3], PrivateOnly(cred)), "node", exp, ClassUnowned, DefaultClassLimits()[ClassUnowned].ConnLimits},
	}
	for n := 1; n <= MaxNodeAgents; n++ {
		cases = append(cases, claimsCase{fmt.Sprintf("node of %d", n), NodePermissions(ag[:n], Replies{Key: cred, Shared: n%2 == 0}), "node", exp, "", ConnLimits{}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			build := func() *jwt.UserClaims {
				uc := jwt.NewUserClaims(cred)
				uc.Name = c.cname
				uc.IssuerAccount = tr.mesh.Public()
				uc.Pub.Allow = append(jwt.StringList(nil), c.perms.PubAllow...)
				uc.Pub.Deny = append(jwt.StringList(nil), c.perms.PubDeny...)
				uc.Sub.Allow = append(jwt.StringList(nil), c.perms.SubAllow...)
				uc.Sub.Deny = append(jwt.StringList(nil), c.perms.SubDeny...)
				if !c.exp.IsZero() {
					uc.Expires = c.exp.Unix()
				}
				uc.Limits.Payload = max(c.limits.Payload, uc.Limits.Payload)
				if c.limits.Subs > 0 {
					uc.Limits.Subs = c.limits.Subs
				}
				if c.class != "" {
					uc.Tags.Add(ClassTag(c.class))
				}
				return uc
			}
			lib, ours := libraryAndOurs(t, tr, build)
			if lib != ours {
				t.Fatalf("encodeUserAt differs from the jwt library:\nlibrary %s\nours    %s", lib, ours)
			}
		})
	}
}

// FuzzEncodeUserAtIsTheLibrarysEncode: names and subjects of any bytes
// (escaping, invalid UTF-8) encode as the library encodes them.
func FuzzEncodeUserAtIsTheLibrarysEncode(f *testing.F) {
	tr := mustTrust(f)
	ag := agentKeys(f, 2)
	f.Add("node", "mesh.agent.*.inbox")
	f.Add("<script>&\u2028\u2029", "a\"b\\c")
	f.Add("\xff\xfe", "\x00\x01")
	f.Fuzz(func(t *testing.T, name, subject string) {
		build := func() *jwt.UserClaims {
			uc := jwt.NewUserClaims(ag[1])
			uc.Name = name
			uc.IssuerAccount = tr.mesh.Public()
			uc.Pub.Allow.Add(subject)
			uc.Sub.Allow.Add(subject)
			uc.Tags.Add(name)
			return uc
		}
		uc := build()
		lib, err := encodeUser(uc, tr.meshSigning)
		if err != nil {
			if _, err2 := encodeUserAt(build(), tr.meshSigning, uc.IssuedAt); err2 == nil {
				t.Fatalf("library refused (%v), ours accepted", err)
			}
			return
		}
		ours, err := encodeUserAt(build(), tr.meshSigning, uc.IssuedAt)
		if err != nil {
			t.Fatal(err)
		}
		if lib != ours {
			t.Fatalf("encodeUserAt differs from the jwt library:\nlibrary %s\nours    %s", lib, ours)
		}
	})
}
