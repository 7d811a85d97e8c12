package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/protocol"
)

// `credits` shows the credits of the owner the agent is registered with
// (the adapter's owner key): through the running adapter and, once it
// stopped, with the agent brought up for the command; --json prints the
// clearing service's answers.
func TestCreditsOfTheOwner(t *testing.T) {
	w := newWorld(t)
	dir := w.state("cr")
	p, _ := w.start(dir, "up", w.agentKey("buyer"))
	owner := ownerOf(t, dir)
	if _, err := w.m.Control().Bus.Call(t.Context(), protocol.SubjCreditsGrant, protocol.TypeRequest,
		map[string]any{"owner": owner, "credits": 2_500_000, "reason": "welcome"}); err != nil {
		t.Fatal(err)
	}
	out := w.must(dir, "credits")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] != "owner "+owner+": 2.5 credits" || !strings.Contains(lines[1], "grant") ||
		!strings.Contains(lines[1], "2.5") || !strings.HasSuffix(lines[1], "welcome") {
		t.Fatalf("credits:\n%s", out)
	}
	var res struct {
		Balance map[string]any `json:"balance"`
		History struct {
			Entries []map[string]any `json:"entries"`
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(w.must(dir, "credits", "--json")), &res); err != nil || res.Balance["credits"] != 2_500_000.0 ||
		res.Balance["currency"] != "XCR" || len(res.History.Entries) != 1 || res.History.Entries[0]["kind"] != "grant" {
		t.Fatalf("credits --json: %+v %v", res, err)
	}
	p.stop()
	if out := w.must(dir, "credits"); !strings.HasPrefix(out, "owner "+owner+": 2.5 credits\n") {
		t.Fatalf("credits without a running adapter:\n%s", out)
	}
	if _, errOut, code := w.run(dir, "credits", "extra"); code != 2 || !strings.Contains(errOut, "takes no arguments") {
		t.Fatalf("credits extra: %d %q", code, errOut)
	}
}
