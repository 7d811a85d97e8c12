package audittest

import (
	"context"
	"slices"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/keys"
)

// Fixture is a complete export and what made it.
type Fixture struct {
	Bundle *audit.Bundle
	// Signer is the export key.
	Signer *keys.Agent
	// Authorities stamped the anchors.
	Authorities []*Authority
	// Trust pins the export key and the authorities' roots.
	Trust audit.Trust
	// Agents are the exported agents, sorted; Other has a chain in the
	// anchors' trees but is not exported.
	Agents []string
	Other  string
}

// Mesh is the fixture's mesh name.
const Mesh = "fixture-mesh"

// Dates of the fixture's two anchors.
const (
	Date1 = "2026-03-01"
	Date2 = "2026-03-02"
)

// NewFixture makes three exported chains (5, 3 and 2 rows) and one other,
// anchors them on Date1 (two chains begun) and Date2 (all four), each
// anchor stamped by two test-only authorities, and exports the three.
func NewFixture(t testing.TB) *Fixture {
	t.Helper()
	f := &Fixture{Authorities: []*Authority{NewAuthority(t, "tsa-one"), NewAuthority(t, "tsa-two")}}
	signer, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	f.Signer = signer
	f.Agents = []string{Agent(t), Agent(t), Agent(t)}
	slices.Sort(f.Agents)
	f.Other = Agent(t)

	chains := NewMemChains()
	day1, _ := audit.ParseDate(Date1)
	n := 0
	add := func(agent string, count int, at time.Time) {
		for range count {
			n++
			if _, err := chains.Append(Entry(agent, n), at.Add(time.Duration(n)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// During Date1: two rows of the first agent, all three of the second.
	add(f.Agents[0], 2, day1.Add(time.Hour))
	add(f.Agents[1], 3, day1.Add(2*time.Hour))
	// During Date2: the rest, and the agent that is not exported.
	add(f.Agents[0], 3, day1.Add(25*time.Hour))
	add(f.Agents[2], 2, day1.Add(26*time.Hour))
	add(f.Other, 4, day1.Add(27*time.Hour))
	// After Date2: a row no anchor commits to yet.
	add(f.Agents[2], 1, day1.Add(49*time.Hour))

	now := day1.Add(50 * time.Hour)
	store := audit.NewMemAnchors()
	var auths []audit.Authority
	for _, a := range f.Authorities {
		auths = append(auths, a.Config())
		f.Trust.Roots = append(f.Trust.Roots, a.Root())
	}
	an, err := audit.NewAnchorer(audit.AnchorerConfig{Mesh: Mesh, Ledger: chains, Store: store, Authorities: auths,
		Client: f.Authorities[0].Server.Client(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{Date1, Date2} {
		a, err := an.Anchor(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status != audit.StatusStamped {
			t.Fatalf("the anchor of %s is %s: %s", d, a.Status, a.LastError)
		}
	}
	ex := &audit.Exporter{Mesh: Mesh, Chains: chains, Anchors: store, Signer: signer, Now: func() time.Time { return now }}
	if f.Bundle, err = ex.Export(context.Background(), "acct-fixture", f.Agents); err != nil {
		t.Fatal(err)
	}
	f.Trust.Signer = signer.Public()
	return f
}
