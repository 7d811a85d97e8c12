package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/sow"
)

// engageTemplate is a template this runtime accepts: it grades enforced
// only what the engagement service enforces of an agent that publishes no
// SKU (agent-approved change control); the rest is evidence or recorded.
// The provider seat names no agent: propose fills it with the adapter's
// own agent.
const engageTemplate = `{
  "sow": "v1", "version": 1, "starts_at": null, "ends_at": null, "term_months": 3,
  "parties": {"provider": {"owner": "Provider Ltd"}, "client": null, "grade": "evidence"},
  "scope": {"offerings": ["chat"], "grade": "evidence"},
  "price": {"arrangement": "no_charge", "grade": "recorded"},
  "change_control": {"review_window_days": 1, "approval": {"formation": "agent", "amendment": "agent"}, "grade": "enforced"},
  "termination": {"convenience_notice_hours": 2, "grade": "evidence"},
  "disputes": {"posture": "escalate_to_owners", "grade": "evidence"}
}`

// Two adapters' owners form an engagement with `engage` alone: the
// provider proposes, the client countersigns, the provider signs after
// seeing the terms; show prints it active with every clause's grade;
// amendments are proposed from the governing document, approved after
// showing what changed, denied with a reason, withdrawn by the proposer; a
// reasonless rejection is refused before anything is sent, a reasoned one
// is stored; a termination for cause without a reason is refused locally,
// with one it ends the engagement and the reason is on the record.
func TestEngageFromTheAdapter(t *testing.T) {
	w := newWorld(t)
	prov, cli := w.state("prov"), w.state("cli")
	pp, provID := w.start(prov, "up", w.agentKey("provider"))
	defer pp.stop()
	cp, cliID := w.start(cli, "up", w.agentKey("client"))
	defer cp.stop()
	pOwner, cOwner := ownerOf(t, prov), ownerOf(t, cli)

	docs := t.TempDir()
	tmpl := filepath.Join(docs, "chat.json")
	if err := os.WriteFile(tmpl, []byte(engageTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	out := w.must(prov, "engage", "propose", tmpl)
	m := regexp.MustCompile(`filed standing proposal (sow_[0-9a-z]+) of agent (\S+) \(owner (\S+)\) at \S+ for chat; signed proposal written to (\S+)\n`).FindStringSubmatch(out)
	if m == nil || m[2] != provID || m[3] != pOwner || !strings.Contains(out, "its owner runs `mesh-adapter engage countersign "+filepath.Base(m[4])+"`") {
		t.Fatalf("propose printed:\n%s", out)
	}
	sowID, proposal := m[1], m[4]
	if _, errOut, code := w.run(prov, "engage", "propose", proposal); code != 1 || !strings.Contains(errOut, "already signed") {
		t.Fatalf("proposing a signed document: exit %d %s", code, errOut)
	}

	out = w.must(cli, "engage", "countersign", proposal)
	if !strings.HasPrefix(out, "countersigned "+sowID+" (signed by provider owner "+pOwner+") as client agent "+cliID+", owner "+cOwner) ||
		!strings.Contains(out, "`mesh-adapter engage sign "+cliID+" "+provID+" chat`") {
		t.Fatalf("countersign printed:\n%s", out)
	}
	if out := w.must(cli, "engage", "show", cliID, provID, "chat"); !strings.HasPrefix(out, "engagement "+sowID+", version 0: ") ||
		!strings.Contains(out, " (not in force)\n") || !strings.Contains(out, "  awaiting  the provider's instance signature: its owner runs `mesh-adapter engage sign "+cliID+" "+provID+" chat`") {
		t.Fatalf("show before the provider signs:\n%s", out)
	}

	// The provider's owner sees what it signs and must say so.
	out, errOut, code := w.run(prov, "engage", "sign", cliID, provID, "chat")
	if code != 1 || !strings.Contains(out, "signing as the provider's owner "+pOwner+" the completed instance of "+sowID) ||
		!regexp.MustCompile(`\n  scope +evidence +\{"grade":"evidence","offerings":\["chat"\]\}\n`).MatchString(out) || !strings.Contains(errOut, "not signed") {
		t.Fatalf("sign without an answer: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := w.run(cli, "engage", "sign", cliID, provID, "chat", "--yes"); code != 1 || !strings.Contains(errOut, "not this adapter's agent") {
		t.Fatalf("the client signing as provider: exit %d %s", code, errOut)
	}
	out = w.must(prov, "engage", "sign", cliID, provID, "chat", "--yes")
	if !strings.Contains(out, "formed: engagement "+sowID+" between client "+cliID+" and provider "+provID+" is active (in force: true)") {
		t.Fatalf("sign printed:\n%s", out)
	}

	out = w.must(cli, "engage", "show", cliID, provID, "chat")
	for _, want := range []string{"engagement " + sowID + ", version 1: active (in force)\n", "  client    " + cliID + " (owner " + cOwner + ")\n",
		"  seller    " + provID + " (owner " + pOwner + ")\n", "\n  parties ", "\n  price                      recorded ", "\n  change_control             enforced ", "\n  termination                evidence ",
		"\n  disputes                   evidence ", "amendments: none\n", "termination: none\n", "reviews: none\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show lacks %q:\n%s", want, out)
		}
	}
	var v engagement.View
	if err := json.Unmarshal([]byte(w.must(prov, "engage", "show", cliID, provID, "chat", "--json")), &v); err != nil ||
		v.State != sow.StateActive || !v.InForce || v.Version != 1 || v.Owners.Client != cOwner || v.Owners.Provider != pOwner {
		t.Fatalf("show --json: %+v %v", v, err)
	}
	d, err := sow.Parse([]byte(v.Document))
	if err != nil || d.VerifySignatures() != nil || !d.Agreed() || d.Parties.Provider.Agent != provID || d.Parties.Client.Agent != cliID || d.TermMonths != 3 {
		t.Fatalf("the agreed document: %+v %v", d, err)
	}

	// Amendments: the client proposes version 2 from the governing
	// document, the provider sees it and approves; the client proposes
	// version 3, the provider denies it with its reason; the provider
	// proposes another version 3 and withdraws it.
	edit := func(who, name string, change func(map[string]any)) string {
		t.Helper()
		var doc map[string]any
		if err := json.Unmarshal([]byte(w.must(who, "engage", "show", cliID, provID, "chat", "--document")), &doc); err != nil {
			t.Fatal(err)
		}
		change(doc)
		b, _ := json.Marshal(doc)
		path := filepath.Join(docs, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	notice := func(hours int) func(map[string]any) {
		return func(d map[string]any) {
			d["termination"] = map[string]any{"convenience_notice_hours": hours, "grade": "evidence"}
		}
	}
	if out := w.must(cli, "engage", "amend", edit(cli, "v2.json", notice(4))); !strings.Contains(out, "proposed version 2 of "+sowID+" as the client; it lapses unanswered at ") ||
		!strings.Contains(out, "the provider's owner runs `mesh-adapter engage approve "+cliID+" "+provID+" chat`") {
		t.Fatalf("amend printed:\n%s", out)
	}
	if _, errOut, code := w.run(cli, "engage", "approve", cliID, provID, "chat", "--yes"); code != 1 || !strings.Contains(errOut, "the provider's owner approves it") {
		t.Fatalf("the proposer approving: exit %d %s", code, errOut)
	}
	out = w.must(prov, "engage", "approve", cliID, provID, "chat", "--yes")
	if !strings.Contains(out, "\n *termination                evidence   {\"convenience_notice_hours\":4,\"grade\":\"evidence\"}\n") ||
		!strings.Contains(out, "\n  scope ") || !strings.Contains(out, "approved: version 2 of "+sowID+" governs from now") {
		t.Fatalf("approve printed:\n%s", out)
	}
	w.must(cli, "engage", "amend", edit(cli, "v3.json", notice(1)))
	if _, errOut, code := w.run(prov, "engage", "deny", cliID, provID, "chat"); code != 2 || !strings.Contains(errOut, "a denial states its reason") {
		t.Fatalf("a denial without a reason: exit %d %s", code, errOut)
	}
	const denial = "One hour is too short a notice."
	if out := w.must(prov, "engage", "deny", cliID, provID, "chat", "--reason", denial); out != "denied version 3 of "+sowID+"; version 2 continues to govern: "+denial+"\n" {
		t.Fatalf("deny printed:\n%s", out)
	}
	w.must(prov, "engage", "amend", edit(prov, "v3b.json", notice(8)))
	if _, errOut, code := w.run(prov, "engage", "deny", cliID, provID, "chat", "--reason", "no"); code != 1 || !strings.Contains(errOut, "the proposer withdraws") {
		t.Fatalf("the proposer denying: exit %d %s", code, errOut)
	}
	if out := w.must(prov, "engage", "withdraw", cliID, provID, "chat"); out != "withdrew version 3 of "+sowID+"; version 2 continues to govern\n" {
		t.Fatalf("withdraw printed:\n%s", out)
	}
	out = w.must(cli, "engage", "show", cliID, provID, "chat")
	for _, want := range []string{"version 2: amended (in force)\n", " amendment_denied     version 3 by the provider: " + denial + "\n", " amendment_withdrawn  version 3 by the provider\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show after the amendments lacks %q:\n%s", want, out)
		}
	}

	// Reviews: the buyer's, a rejection with its reason.
	if _, errOut, code := w.run(cli, "engage", "review", cliID, provID, "chat", "--rejected"); code != 2 || !strings.Contains(errOut, "a rejection states its reason") {
		t.Fatalf("a rejection without a reason: exit %d %s", code, errOut)
	}
	if _, errOut, code := w.run(prov, "engage", "review", cliID, provID, "chat", "--accepted"); code != 1 || !strings.Contains(errOut, "signed by the buyer") {
		t.Fatalf("the seller reviewing: exit %d %s", code, errOut)
	}
	const why = "The totals were missing."
	if out := w.must(cli, "engage", "review", cliID, provID, "chat", "--rejected", "--reason", why, "--task", "task-7"); !strings.Contains(out, "rejected (task task-7): "+why) {
		t.Fatalf("review printed:\n%s", out)
	}

	// Termination for cause: refused locally without a reason.
	if _, errOut, code := w.run(prov, "engage", "terminate", cliID, provID, "chat", "--for-cause"); code != 2 || !strings.Contains(errOut, "states its reason") {
		t.Fatalf("for cause without a reason: exit %d %s", code, errOut)
	}
	const cause = "The client sent work outside the scope three times."
	if out := w.must(prov, "engage", "terminate", cliID, provID, "chat", "--for-cause", "--reason", cause); !strings.HasPrefix(out, "terminated "+sowID+" for cause, effective ") {
		t.Fatalf("terminate printed:\n%s", out)
	}
	out = w.must(cli, "engage", "show", cliID, provID, "chat")
	for _, want := range []string{"version 2: terminated (not in force)\n", "termination: for cause by the provider's owner " + pOwner, ": " + cause + "\n",
		"reviews:\n  ", " rejected task task-7: " + why + "\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("show after the termination lacks %q:\n%s", want, out)
		}
	}
	if _, errOut, code := w.run(cli, "engage", "show", cliID, provID, "other"); code != 1 || !strings.Contains(errOut, `no engagement between client `+cliID+` and seller `+provID+` for offering "other"`) {
		t.Fatalf("show of nothing: exit %d %s", code, errOut)
	}
}
