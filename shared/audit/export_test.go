package audit_test

import (
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// The whole path on the bus: rows appended to the stream, the anchor made
// from the stream's heads and kept in the stream, proofs recorded in the
// chains, and an export of them that verifies.
func TestAnchorAndExportOnTheStream(t *testing.T) {
	b := bustest.Start(t)
	c := openChains(t, b, "audit", nil)
	agents := []string{bustest.Agent(t).Public(), bustest.Agent(t).Public()}
	for i, a := range agents {
		for j := range i + 2 {
			if _, _, err := c.Append(t.Context(), entry(a, fmt.Sprint(j))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The date of the last row: every row was stored before its end.
	last := storedAt(t, b, agents[1]).UTC()
	date := last.Format(time.DateOnly)
	clk := &clock{t: last.Add(48 * time.Hour)}
	tsas := []*switchTSA{newSwitchTSA(t, "tsa-a"), newSwitchTSA(t, "tsa-b")}
	for _, ts := range tsas {
		ts.a.Now = clk.Now // the authorities stamp after the date ends, as the anchorer does
	}
	an, err := audit.NewAnchorer(audit.AnchorerConfig{Mesh: "bus-mesh", Ledger: c, Store: c.Anchors(),
		Authorities: []audit.Authority{tsas[0].config(), tsas[1].config()}, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := an.Anchor(t.Context(), date)
	if err != nil {
		t.Fatal(err)
	}
	again, err := an.Anchor(t.Context(), date)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != audit.StatusStamped || again.Document != a.Document || again.Attempts != 1 || a.Document.Heads != 2 || a.Document.Rows != 5 {
		t.Fatalf("anchor %+v, again %+v", a, again)
	}
	for _, ag := range agents {
		ps, err := c.Proofs(t.Context(), ag)
		if err != nil || len(ps) != 1 || ps[0].Verify(a.Document.Root) != nil {
			t.Fatalf("proofs of %s: %+v, %v", ag, ps, err)
		}
	}
	signer := bustest.Agent(t)
	ex := &audit.Exporter{Mesh: "bus-mesh", Chains: c, Anchors: c.Anchors(), Signer: signer, Now: clk.Now}
	bundle, err := ex.Export(t.Context(), "acct", agents)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := audit.Check(bundle, audit.Trust{Signer: signer.Public(), Roots: []*x509.Certificate{tsas[0].a.Root(), tsas[1].a.Root()}})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Chains != 2 || sum.Rows != 5 || sum.AnchoredRows != 5 || sum.Anchors != 1 || sum.Stamps != 2 || sum.Proofs != 2 {
		t.Fatalf("summary %+v", sum)
	}
}
