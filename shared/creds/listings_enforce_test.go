package creds_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// TestBrokerEnforcesListingAccess: who may ask the three listing subjects
// (docs/bus.md "Who may call what"). The catalog (and removing one's own
// entry) is open to every credential but a guest's and a job's; the
// activity timeline and the usage counters only to an app (the worker
// answers it about its own account's agents) and to the services, for the
// account's HTTP views. A publish that is allowed reaches a service
// subscriber; one that is not is refused by the broker, whose violation
// the test waits for.
func TestBrokerEnforcesListingAccess(t *testing.T) {
	m := startMesh(t)
	svc := serviceConn(t, m)
	listings := []string{protocol.SubjCatalogList, protocol.SubjCatalogRemove, protocol.SubjActivityList, protocol.SubjUsageList}
	seen := map[string]*nats.Subscription{}
	for _, s := range listings {
		sub, err := svc.SubscribeSync(s)
		must(t, err)
		seen[s] = sub
	}
	must(t, svc.Flush())

	type kindCase struct {
		name  string
		allow []string
		conn  func(t *testing.T) *watched
	}
	hour := time.Now().Add(time.Hour)
	cases := []kindCase{
		{"node", []string{protocol.SubjCatalogList, protocol.SubjCatalogRemove}, func(t *testing.T) *watched {
			k, err := keys.Generate[keys.NodeRole]()
			must(t, err)
			roster := []string{agentKey(t)}
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindNode, Hosted: roster,
				Permissions: creds.NodePermissions(roster, creds.PrivateOnly(k.Public())), Expires: hour}), k.SignNonce)
		}},
		{"bootstrap", []string{protocol.SubjCatalogList, protocol.SubjCatalogRemove}, func(t *testing.T) *watched {
			k, agent := credKey(t), agentKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindBootstrap, Hosted: []string{agent},
				Permissions: creds.BootstrapPermissions(agent, creds.PrivateOnly(k.Public())), Expires: hour}), k.SignNonce)
		}},
		{"app", listings, func(t *testing.T) *watched {
			k := credKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindApp, Hosted: []string{k.Public()},
				Permissions: creds.AppPermissions(k.Public(), true), Expires: hour}), k.SignNonce)
		}},
		{"guest", nil, func(t *testing.T) *watched {
			k := credKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindGuest, Hosted: []string{k.Public()},
				Permissions: creds.GuestPermissions(k.Public()), Expires: hour}), k.SignNonce)
		}},
		{"pinned guest", nil, func(t *testing.T) *watched {
			k := credKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindGuest, Hosted: []string{k.Public()},
				Permissions: creds.PinnedGuestPermissions(k.Public()), Expires: hour}), k.SignNonce)
		}},
		{"job", nil, func(t *testing.T) *watched {
			k, agent := credKey(t), agentKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Kind: creds.KindJob, Hosted: []string{agent},
				Permissions: creds.JobPermissions(k.Public(), agent, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"), Expires: time.Now().Add(10 * time.Minute)}), k.SignNonce)
		}},
		{"operator", listings, func(t *testing.T) *watched {
			k := credKey(t)
			return dial(t, m, mint(t, m, creds.UserSpec{PublicKey: k.Public(), Name: creds.OperatorLabel, Kind: creds.KindOperator,
				Permissions: creds.OperatorPermissions(), Expires: hour}), k.SignNonce)
		}},
	}
	// One subtest at a time: the service subscriptions are shared.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc := c.conn(t)
			var refused []forbidden
			for _, s := range listings {
				allowed := false
				for _, a := range c.allow {
					allowed = allowed || a == s
				}
				if !allowed {
					refused = append(refused, forbidden{"publish", s})
					continue
				}
				body := c.name + " asks " + s
				must(t, nc.Publish(s, []byte(body)))
				receive(t, seen[s], body)
			}
			nc.quiet(t)
			nc.refuse(t, refused)
		})
	}
}
