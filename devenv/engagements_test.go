package devenv_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// engWorld is a mesh with a provider, a client and a stranger agent
// registered, each by its own node, whose key is then its owner key.
type engWorld struct {
	*cp
	provider, client, stranger *keys.Agent
	pOwner, cOwner, sOwner     *keys.Node
	kv                         jetstream.KeyValue
}

// registerAgent bootstraps agent under acct and registers it from node
// with the manifest's extra members.
func (c *cp) registerAgent(acct string, agent *keys.Agent, node *keys.Node, extra map[string]any) {
	c.t.Helper()
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "a"+agent.Public()[:8]), "agent_id": agent.Public()}, "")
	if st != 200 {
		c.t.Fatalf("bootstrap: %d %v", st, boot)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(boot["creds"].(string))))
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	// The node owns the agent while its vouch lasts (registry.OwnerOf), and
	// the engagement tests move the control plane's clock on by a day and
	// more: vouch for three days.
	vouch, err := protocol.NewVouch(node, agent.Public(), time.Now(), time.Now().Add(72*time.Hour))
	if err != nil {
		c.t.Fatal(err)
	}
	manifest := map[string]any{"id": agent.Public(), "name": "agent " + agent.Public()[:6], "endpoint": protocol.InboxSubject(agent.Public()),
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "visibility": "unlisted"}
	for k, v := range extra {
		manifest[k] = v
	}
	ctx, cancel := context.WithTimeout(c.t.Context(), 20*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest); err != nil {
		c.t.Fatalf("register: %v", err)
	}
}

// postBytes posts body as it is and decodes the JSON answer.
func (c *cp) postBytes(path string, body []byte) (int, map[string]any) {
	c.t.Helper()
	resp, err := http.Post(c.base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatalf("%s: %d, not JSON: %s", path, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

func (w *engWorld) template(id, offering string) map[string]any {
	return map[string]any{
		"sow": "v1", "id": id, "version": 1, "starts_at": nil, "ends_at": nil,
		"parties": map[string]any{"provider": map[string]any{"agent": w.provider.Public(), "owner": "Provider Ltd"}, "client": nil, "grade": "evidence"},
		"scope":   map[string]any{"offerings": []any{offering}, "grade": "enforced"},
		"price":   map[string]any{"arrangement": "no_charge", "grade": "recorded"},
		"volume":  map[string]any{"per_hour": 30, "grade": "enforced"},
		"change_control": map[string]any{"review_window_days": 1,
			"approval": map[string]any{"formation": "agent", "amendment": "agent"}, "grade": "enforced"},
		"termination":     map[string]any{"convenience_notice_hours": 2, "grade": "recorded"},
		"disputes":        map[string]any{"posture": "escalate_to_owners", "grade": "evidence"},
		"confidentiality": map[string]any{"promises": map[string]any{"no_training": true, "grade": "recorded"}},
	}
}

// sign appends role's signature by k and returns the document as sent:
// indented, so the record's exact bytes are seen to be these.
func (w *engWorld) sign(doc map[string]any, role string, k keys.Signer) []byte {
	w.t.Helper()
	s, err := sow.Sign(doc, k, role, w.clock.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	sigs, _ := doc["signatures"].([]any)
	doc["signatures"] = append(sigs, map[string]any{"role": s.Role, "key": s.Key, "signed_at": s.SignedAt, "sig": s.Sig})
	b, err := json.MarshalIndent(doc, "", "    ")
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

func documentBody(doc []byte) []byte {
	return append(append([]byte("{\"document\":\n"), doc...), '}')
}

// act signs a termination, review or amendment resolution.
func (w *engWorld) act(tag string, k keys.Signer, sowID, offering string, members map[string]any) []byte {
	w.t.Helper()
	obj := map[string]any{"v": 1, "client": w.client.Public(), "seller": w.provider.Public(), "offering": offering, "sow_id": sowID,
		"at": w.clock.Now().UTC().Format(time.RFC3339)}
	if tag == engagement.TagAmendment {
		// A resolution names the exact proposal it answers.
		open, _ := w.record(offering)["open_amendment"].(map[string]any)
		doc, _ := open["document"].(string)
		sum := sha256.Sum256([]byte(doc))
		obj["proposal_sha256"] = hex.EncodeToString(sum[:])
	}
	for k, v := range members {
		obj[k] = v
	}
	if err := engagement.SignAct(tag, obj, k); err != nil {
		w.t.Fatal(err)
	}
	b, _ := json.Marshal(obj)
	return b
}

// record reads the public record as JSON.
func (w *engWorld) record(offering string) map[string]any {
	w.t.Helper()
	st, _, body := w.get("/v1/engagements/" + w.client.Public() + "/" + w.provider.Public() + "/" + offering)
	var out map[string]any
	if st != 200 || json.Unmarshal(body, &out) != nil {
		w.t.Fatalf("record %s: %d %s", offering, st, body)
	}
	return out["engagement"].(map[string]any)
}

// terms reads the mirrored terms from the bus bucket.
func (w *engWorld) terms(offering string) *commerce.EngagementTerms {
	w.t.Helper()
	e, err := w.kv.Get(w.t.Context(), commerce.EngagementKey(w.provider.Public(), w.client.Public(), offering))
	if err != nil {
		w.t.Fatalf("terms under %s: %v", offering, err)
	}
	var t commerce.EngagementTerms
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		w.t.Fatal(err)
	}
	return &t
}

// scopes reads the mirrored scopes graded enforced between the two agents.
func (w *engWorld) scopes() []commerce.EngagementTerms {
	w.t.Helper()
	e, err := w.kv.Get(w.t.Context(), commerce.EngagementScopeKey(w.provider.Public(), w.client.Public()))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		w.t.Fatalf("scopes: %v", err)
	}
	var list []commerce.EngagementTerms
	if err := json.Unmarshal(e.Value(), &list); err != nil {
		w.t.Fatal(err)
	}
	return list
}

// form files a standing proposal, countersigns its completed instance and
// adds the provider's instance signature, over HTTP; it returns the
// instance's value and the agreed bytes.
func (w *engWorld) form(id, offering string) (map[string]any, []byte) {
	w.t.Helper()
	tmpl := w.template(id, offering)
	if st, out := w.postBytes("/v1/engage/proposals", documentBody(w.sign(tmpl, sow.RoleProvider, w.pOwner))); st != 200 {
		w.t.Fatalf("proposal: %d %v", st, out)
	}
	inst := w.template(id, offering)
	inst["parties"].(map[string]any)["client"] = map[string]any{"agent": w.client.Public(), "owner": "Client Inc"}
	now := w.clock.Now().UTC()
	inst["starts_at"], inst["ends_at"] = now.Format(time.RFC3339), now.AddDate(0, 3, 0).Format(time.RFC3339)
	if st, out := w.postBytes("/v1/engage/countersign", documentBody(w.sign(inst, sow.RoleClient, w.cOwner))); st != 200 || out["formed"] != false {
		w.t.Fatalf("countersign: %d %v", st, out)
	}
	if r := w.record(offering); r["state"] != engagement.StateRequested || r["in_force"] != false {
		w.t.Fatalf("after the countersign: %v %v", r["state"], r["in_force"])
	}
	agreed := w.sign(inst, sow.RoleProvider, w.pOwner)
	if st, out := w.postBytes("/v1/engage/sign", documentBody(agreed)); st != 200 || out["formed"] != true {
		w.t.Fatalf("instance signature: %d %v", st, out)
	}
	return inst, agreed
}

func code(out map[string]any) string {
	c, _ := out["code"].(string)
	return c
}

// The Must-show of issue 18, "Engagement flows over HTTP on devenv":
// formation (proposal, countersign, provider instance signature), an
// amendment approved, one denied (an unreasoned denial refused, a reasoned
// one recorded), one lapsed on the clock, reviews (a rejection without a
// reason refused, a non-party refused, the same signed review twice
// stored once), termination without cause (in force until the notice
// expires, then not) and with cause (ends at once, the reason on the
// public record), the record as JSON and as a page, and the terms in the
// bus bucket following formation, amendment and termination.
func TestEngagementsOverHTTP(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("engage@example.org")
	w := &engWorld{cp: c, provider: newAgent(t), client: newAgent(t), stranger: newAgent(t), pOwner: newNode(t), cOwner: newNode(t), sOwner: newNode(t)}
	// The provider publishes a (free) SKU: its node asks admission, which
	// counts volume, so a volume graded enforced is one this runtime keeps.
	c.registerAgent(acct, w.provider, w.pOwner, map[string]any{
		"offerings": []any{map[string]any{"id": "summarize", "name": "Summarize"}, map[string]any{"id": "translate", "name": "Translate"}},
		"skus":      []any{map[string]any{"sku": "free-summaries", "covers": map[string]any{"agent": true}, "price": map[string]any{"model": "free"}, "provider": map[string]any{"id": "internal"}}}})
	c.registerAgent(acct, w.client, w.cOwner, nil)
	c.registerAgent(acct, w.stranger, w.sOwner, nil)
	svc, err := c.m.ConnectService("test-engagements")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}

	// Formation.
	const id = "sow_devenv00000001"
	inst, agreed := w.form(id, "summarize")
	if w.kv, err = js.KeyValue(t.Context(), commerce.Bucket); err != nil {
		t.Fatalf("the mirror made no bucket: %v", err)
	}
	r := w.record("summarize")
	if r["state"] != sow.StateActive || r["in_force"] != true || r["document"] != string(agreed) || r["version"] != 1.0 {
		t.Fatalf("formed: %v %v v%v", r["state"], r["in_force"], r["version"])
	}
	if scopes := w.scopes(); len(scopes) != 1 || scopes[0].SowID != id || !slices.Equal(scopes[0].Offerings, []string{"summarize"}) {
		t.Fatalf("the scope graded enforced, mirrored: %+v", scopes)
	}
	terms := w.terms("summarize")
	if terms.SowID != id || terms.Version != 1 || terms.ClientOwner != w.cOwner.Public() || terms.SellerOwner != w.pOwner.Public() ||
		terms.Volume == nil || terms.Volume.PerHour != 30 || !terms.InForce(time.Now()) {
		t.Fatalf("mirrored at formation: %+v", terms)
	}

	// Amendment approved: the client proposes v2, the provider countersigns.
	next := func(version int, change func(d map[string]any)) map[string]any {
		d := map[string]any{}
		b, _ := json.Marshal(inst)
		_ = json.Unmarshal(b, &d)
		delete(d, "signatures")
		d["version"] = version
		change(d)
		return d
	}
	v2 := next(2, func(d map[string]any) { d["volume"] = map[string]any{"per_hour": 60, "grade": "enforced"} })
	if st, out := w.postBytes("/v1/engage/amend", documentBody(w.sign(v2, sow.RoleClient, w.cOwner))); st != 200 {
		t.Fatalf("propose v2: %d %v", st, out)
	}
	if st, out := w.postBytes("/v1/engage/amend", documentBody(w.sign(next(2, func(map[string]any) {}), sow.RoleProvider, w.pOwner))); st != 409 {
		t.Fatalf("a second open proposal: %d %v", st, out)
	}
	if st, out := w.postBytes("/v1/engage/amend/approve", documentBody(w.sign(v2, sow.RoleProvider, w.pOwner))); st != 200 || out["version"] != 2.0 {
		t.Fatalf("approve v2: %d %v", st, out)
	}
	if terms := w.terms("summarize"); terms.Version != 2 || terms.Volume.PerHour != 60 {
		t.Fatalf("mirrored after the amendment: %+v", terms)
	}

	// Amendment denied: without a reason refused, with one recorded.
	v3 := next(3, func(d map[string]any) { d["volume"] = map[string]any{"per_hour": 5, "grade": "enforced"} })
	if st, out := w.postBytes("/v1/engage/amend", documentBody(w.sign(v3, sow.RoleProvider, w.pOwner))); st != 200 {
		t.Fatalf("propose v3: %d %v", st, out)
	}
	if st, out := w.postBytes("/v1/engage/amend/resolve", w.act(engagement.TagAmendment, w.cOwner, id, "summarize", map[string]any{"version": 3, "act": "deny"})); st != 400 || code(out) != "INVALID_REQUEST" {
		t.Fatalf("a denial without a reason: %d %v", st, out)
	}
	const denial = "Five an hour is below what we need."
	if st, out := w.postBytes("/v1/engage/amend/resolve", w.act(engagement.TagAmendment, w.cOwner, id, "summarize", map[string]any{"version": 3, "act": "deny", "reason": denial})); st != 200 {
		t.Fatalf("a reasoned denial: %d %v", st, out)
	}

	// Amendment lapsed: v3 again, unanswered past the one-day window.
	v3b := next(3, func(d map[string]any) { d["volume"] = map[string]any{"per_hour": 45, "grade": "enforced"} })
	if st, out := w.postBytes("/v1/engage/amend", documentBody(w.sign(v3b, sow.RoleProvider, w.pOwner))); st != 200 {
		t.Fatalf("propose v3 again: %d %v", st, out)
	}
	if r := w.record("summarize"); r["state"] != sow.StateAmendmentProposed || r["open_amendment"] == nil {
		t.Fatalf("while open: %v", r["state"])
	}
	c.clock.Advance(24*time.Hour + time.Minute)
	r = w.record("summarize")
	if r["open_amendment"] != nil || r["version"] != 2.0 || r["state"] != sow.StateAmended {
		t.Fatalf("after the window: %v v%v open %v", r["state"], r["version"], r["open_amendment"])
	}
	var kinds []string
	var reasons []string
	for _, a := range r["amendments"].([]any) {
		m := a.(map[string]any)
		kinds = append(kinds, m["kind"].(string))
		reason, _ := m["reason"].(string)
		reasons = append(reasons, reason)
	}
	if strings.Join(kinds, ",") != "amendment_proposed,amendment_approved,amendment_proposed,amendment_denied,amendment_proposed,amendment_lapsed" || reasons[3] != denial {
		t.Fatalf("amendment history: %v %q", kinds, reasons)
	}
	if st, out := w.postBytes("/v1/engage/amend/approve", documentBody(w.sign(v3b, sow.RoleClient, w.cOwner))); st != 409 {
		t.Fatalf("approving a lapsed proposal: %d %v", st, out)
	}

	// Reviews.
	if st, out := w.postBytes("/v1/reviews", w.act(engagement.TagReview, w.cOwner, id, "summarize", map[string]any{"verdict": "rejected"})); st != 400 {
		t.Fatalf("a rejection without a reason: %d %v", st, out)
	}
	if st, out := w.postBytes("/v1/reviews", w.act(engagement.TagReview, w.sOwner, id, "summarize", map[string]any{"verdict": "accepted"})); st != 403 || code(out) != "FORBIDDEN" {
		t.Fatalf("a non-party's review: %d %v", st, out)
	}
	rejection := w.act(engagement.TagReview, w.cOwner, id, "summarize", map[string]any{"verdict": "rejected", "reason": "The totals were missing.", "task_id": "task-7"})
	if st, out := w.postBytes("/v1/reviews", rejection); st != 201 || out["duplicate"] != false {
		t.Fatalf("a review: %d %v", st, out)
	}
	if st, out := w.postBytes("/v1/reviews", rejection); st != 200 || out["duplicate"] != true {
		t.Fatalf("the same review again: %d %v", st, out)
	}
	if rv := w.record("summarize")["reviews"].([]any); len(rv) != 1 || rv[0].(map[string]any)["review"] != string(rejection) {
		t.Fatalf("reviews on the record: %v", rv)
	}

	// Termination without cause: in force until the two-hour notice expires.
	if st, out := w.postBytes("/v1/engage/terminate", w.act(engagement.TagTerminate, w.cOwner, id, "summarize", map[string]any{"version": 1, "for_cause": false})); st != 409 {
		t.Fatalf("terminating a superseded version: %d %v", st, out)
	}
	notice := w.act(engagement.TagTerminate, w.cOwner, id, "summarize", map[string]any{"version": 2, "for_cause": false})
	if st, out := w.postBytes("/v1/engage/terminate", notice); st != 200 {
		t.Fatalf("terminate for convenience: %d %v", st, out)
	}
	r = w.record("summarize")
	term := r["termination"].(map[string]any)
	if r["in_force"] != true || term["in_notice"] != true || term["for_cause"] != false || term["notice"] != string(notice) {
		t.Fatalf("in notice: in force %v %v", r["in_force"], term)
	}
	terms = w.terms("summarize")
	if terms.EffectiveUntil == nil || !terms.InForce(c.clock.Now()) || terms.InForce(c.clock.Now().Add(2*time.Hour)) {
		t.Fatalf("mirrored in notice: %+v", terms)
	}
	c.clock.Advance(2*time.Hour + time.Second)
	if r = w.record("summarize"); r["in_force"] != false || r["state"] != sow.StateTerminated {
		t.Fatalf("after the notice: %v %v", r["state"], r["in_force"])
	}

	// Termination for cause, on a second engagement: at once, reasoned.
	const id2 = "sow_devenv00000002"
	w.form(id2, "translate")
	if st, out := w.postBytes("/v1/engage/terminate", w.act(engagement.TagTerminate, w.pOwner, id2, "translate", map[string]any{"version": 1, "for_cause": true})); st != 400 {
		t.Fatalf("for cause without a reason: %d %v", st, out)
	}
	const cause = "The client sent work outside the scope three times."
	if st, out := w.postBytes("/v1/engage/terminate", w.act(engagement.TagTerminate, w.pOwner, id2, "translate", map[string]any{"version": 1, "for_cause": true, "reason": cause})); st != 200 {
		t.Fatalf("terminate for cause: %d %v", st, out)
	}
	r = w.record("translate")
	if term := r["termination"].(map[string]any); r["in_force"] != false || r["state"] != sow.StateTerminated || term["reason"] != cause || term["for_cause"] != true {
		t.Fatalf("for cause: %v %v %v", r["state"], r["in_force"], term)
	}
	if terms := w.terms("translate"); !terms.ForCause || terms.InForce(c.clock.Now()) {
		t.Fatalf("mirrored for cause: %+v", terms)
	}
	if scopes := w.scopes(); len(scopes) != 0 {
		t.Fatalf("ended engagements' scopes still mirrored: %+v", scopes)
	}
	// A history entry that signed a document is given by digest and link.
	hist := w.record("summarize")["history"].([]any)
	formed := hist[1].(map[string]any)
	if formed["kind"] != engagement.EventFormed || formed["signed"] != nil || formed["link"] == nil {
		t.Fatalf("the formation in the history: %v", formed)
	}
	if st, _, body := w.get(formed["link"].(string)); st != 200 || !strings.Contains(string(body), `"kind":"formed"`) {
		t.Fatalf("the formation by its link: %d %s", st, body)
	}

	// The page: every clause with its grade.
	req, _ := http.NewRequest(http.MethodGet, c.base+"/v1/engagements/"+w.client.Public()+"/"+w.provider.Public()+"/translate", nil)
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{"<code>volume</code>", "<code>confidentiality.promises</code>", `class="grade recorded">recorded`,
		`class="grade enforced">enforced`, "for cause: ended at once", "outside the scope three times"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
