package devenv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// Where the features of issue 18 meet, end to end: a provider agent on
// this project's node runtime publishes a free SKU (so its node asks the
// agreements service at admission) and a paid one; the owners form
// engagements over HTTP whose volume clause, graded enforced, is two
// requests an hour; the provider's node enforces it from the terms the
// engagement service mirrored, and stops when a termination ends the
// engagement.
//
// The clocks: the control plane (the engagement service) and every bus
// worker (the agreements service among them) run on one clock, the test's
// (devenv.Config.Now). The node runtime and every envelope it signs keep
// real time, and a bus worker judges an envelope's freshness by its own
// clock (stale after 10 minutes). So the clock moves at most a few
// minutes while the node is asked (only to keep the counted requests in
// one clock hour), and the end of a convenience notice, hours later, is
// shown by asking the agreements service the node's question directly,
// in an envelope stamped by the moved clock.
func TestEngagementVolumeAtAdmission(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("engaged@example.org")
	pOwner, cOwner, c2Owner := newAgent(t), newAgent(t), newAgent(t)

	// The provider, on the node runtime, registered with its owner's
	// attestation.
	provider := &sellerAgent{ran: map[string]bool{}}
	handler := func(_ context.Context, call *node.Call) error {
		provider.mu.Lock()
		provider.ran[call.Env.ID] = true
		provider.mu.Unlock()
		return call.Reply(map[string]any{"ok": true})
	}
	free, err := commerce.ParseSKU([]byte(`{"sku":"free-summaries","covers":{"offerings":["summarize"]},"price":{"model":"free"},"provider":{"id":"internal"}}`))
	if err != nil {
		t.Fatal(err)
	}
	const price = 250000
	paid := flatXCR(t, price)
	pKey := newAgent(t)
	red, err := daemon.Bootstrap(t.Context(), c.base, c.agentKey(acct, "provider"), pKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(red.Credential.Seed))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(t.Context(), node.Config{NATSURL: c.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: red.Credential.JWT, Sign: nk.SignNonce}, HeartbeatEvery: time.Second, DrainEvery: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	provider.Agent, err = n.Host(t.Context(), node.AgentConfig{Key: pKey, Name: "provider", Handler: handler, Owner: pOwner,
		SKUs: []commerce.SKU{free, paid}, Offerings: []node.Offering{{ID: "summarize"}, {ID: "paid"}}, AvailabilityClass: "always_on"})
	if err != nil {
		t.Fatal(err)
	}

	// The clients (each registered with its owner's attestation) and an
	// agent party to nothing.
	client, client2, other := newAgent(t), newAgent(t), newAgent(t)
	attested := func(agent, owner *keys.Agent) map[string]any {
		v, err := protocol.NewOwnerAttestation(owner, agent.Public(), time.Now(), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return map[string]any{"owner_attestation": v}
	}
	c.registerAgent(acct, client, newNode(t), attested(client, cOwner))
	c.registerAgent(acct, client2, newNode(t), attested(client2, c2Owner))
	c.registerAgent(acct, other, newNode(t), nil)

	nc, err := c.m.ConnectService("engagement-admission")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), commerce.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	owner := func(agent string) string {
		t.Helper()
		b, found, err := bus.LeaderGet(t.Context(), nc, agreements.RegistryBucket, agent)
		if err != nil || !found {
			t.Fatalf("the record of %s: %v %v", agent, found, err)
		}
		var rec agreements.Record
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		return rec.Owner(time.Now())
	}
	if owner(provider.ID()) != pOwner.Public() || owner(client.Public()) != cOwner.Public() {
		t.Fatalf("the registry's owners are not the attested ones: provider %s, client %s", owner(provider.ID()), owner(client.Public()))
	}

	send := answersOn(t, nc, provider.ID())

	// The counted requests fall in one clock hour: the clock moves past
	// the hour when only a few minutes of it are left (a few minutes stay
	// inside the bus's freshness window).
	if left := c.clock.Now().Truncate(time.Hour).Add(time.Hour).Sub(c.clock.Now()); left < 5*time.Minute {
		c.clock.Advance(left + time.Second)
	}

	// answered asserts an accept and the handler's answer.
	answered := func(what string, from *keys.Agent, offering string) {
		t.Helper()
		id, out := send(from, offering)
		if len(out) != 2 || protocol.ResponseStatus(out[0]) != protocol.StatusAccepted || bus.ErrorOf(out[1]) != nil || !provider.handled(id) {
			t.Fatalf("%s: want an accept and the handler's answer; got %v, handler ran %v", what, describe(out), provider.handled(id))
		}
	}
	// refused asserts the refusal as the first and only answer, the
	// handler never run, and returns it.
	refused := func(what string, from *keys.Agent, offering string, code errs.Code) *errs.Error {
		t.Helper()
		id, out := send(from, offering)
		if len(out) != 1 || protocol.ResponseStatus(out[0]) == protocol.StatusAccepted {
			t.Fatalf("%s: want the refusal as the first and only answer, got %v", what, describe(out))
		}
		e := bus.ErrorOf(out[0])
		if e == nil || e.Code != code {
			t.Fatalf("%s: answered %v, want %s", what, e, code)
		}
		if provider.handled(id) {
			t.Fatalf("%s: the handler ran for a refused request", what)
		}
		return e
	}
	rateLimited := func(what string, from *keys.Agent, sowID string) {
		t.Helper()
		e := refused(what, from, "summarize", errs.RateLimited)
		if got := slices.Sorted(maps.Keys(e.Details)); !slices.Equal(got, []string{"limit", "sow_id", "window"}) ||
			e.Details["sow_id"] != sowID || e.Details["window"] != "hour" || e.Details["limit"] != float64(2) ||
			!e.Retryable || e.RetryAfterMS <= 0 || e.RetryAfterMS > time.Hour.Milliseconds() {
			t.Fatalf("%s: %+v", what, e)
		}
	}

	ew := &engagementParties{cp: c, provider: pKey, pOwner: pOwner}
	const sow1, sow2 = "sow_admission00001", "sow_admission00002"
	ew.form(sow1, client, cOwner)

	// The console lists it on the account's agreements page, linked to
	// its public record.
	console := consoleSignIn(t, c, "engaged@example.org")
	page := console.get("agreements")
	link := `href="/v1/engagements/` + client.Public() + `/` + pKey.Public() + `/summarize"`
	if !strings.Contains(page, link) || !strings.Contains(page, sow1+" v1") {
		t.Fatalf("the agreements page does not link the engagement (%s):\n%s", link, page)
	}
	if st, _, body := c.get("/v1/engagements/" + client.Public() + "/" + pKey.Public() + "/summarize"); st != 200 || !strings.Contains(string(body), sow1) {
		t.Fatalf("the linked record: %d %s", st, body)
	}

	// Two requests an hour for the client; the third is refused at the
	// provider's node, before any accept.
	answered("the client's first request", client, "summarize")
	answered("the client's second request", client, "summarize")
	rateLimited("the client's third request", client, sow1)
	answered("another agent", other, "summarize")

	// Scope graded enforced (§5.2): while the engagement is in force, the
	// client's request for an offering outside it is refused at the node,
	// before any accept, naming the engagement and its offerings.
	e := refused("an offering outside the engagement's scope", client, "paid", errs.Forbidden)
	if e.Details["sow_id"] != sow1 || fmt.Sprint(e.Details["offerings"]) != "[summarize]" {
		t.Fatalf("out of scope: %v", e.Details)
	}

	// Terminated for cause: the engagement ends at once, and the client
	// is admitted as anyone is (its hour's two units are still taken).
	ew.terminate(sow1, client, pOwner, map[string]any{"for_cause": true, "reason": "Requests outside the scope."})
	answered("the client after a termination for cause", client, "summarize")
	answered("the client again", client, "summarize")
	// SKUs and engagements are independent: once the engagement ended, the
	// paid SKU still needs the client owner's agreement.
	e = refused("the paid offering without an agreement", client, "paid", errs.AgreementRequired)
	if e.Details["sku"] != "paid-flat" || e.Details["sku_digest"] != paid.Digest() || e.Details["price_credits"] != float64(price) {
		t.Fatalf("AGREEMENT_REQUIRED: %v", e.Details)
	}
	a := commerce.Agreement{SellerAgent: pKey.Public(), SKU: "paid-flat", SKUDigest: paid.Digest(), AgreedAt: protocol.FormatTime(c.clock.Now())}
	if err := commerce.Sign(&a, cOwner); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, nc, client, protocol.AgreementVerbSubject("file"), protocol.TypeRequest, "", a); err != nil {
		t.Fatalf("file the agreement: %v", err)
	}
	b, _ := json.Marshal(commerce.Balance{Credits: 10 * price, UpdatedAt: c.clock.Now()})
	if _, err := kv.Put(t.Context(), commerce.BalancePrefix+cOwner.Public(), b); err != nil {
		t.Fatal(err)
	}
	answered("the paid offering with an agreement", client, "paid")

	// Terminated for convenience: the volume holds until the notice ends.
	ew.form(sow2, client2, c2Owner)
	answered("the second client's first request", client2, "summarize")
	answered("the second client's second request", client2, "summarize")
	rateLimited("the second client's third request", client2, sow2)
	ew.terminate(sow2, client2, c2Owner, map[string]any{"for_cause": false})
	rateLimited("the second client in notice", client2, sow2)
	// The console names both states.
	page = console.get("agreements")
	if !strings.Contains(page, "active (notice of termination given)") || !strings.Contains(page, ">terminated<") {
		t.Fatalf("the agreements page after the terminations:\n%s", page)
	}
	// The node's question, asked directly: the same refusal.
	ask := func(what string) *errs.Error {
		t.Helper()
		return admitQuestion(t, nc, pKey, client2.Public(), "summarize", c.clock.Now())
	}
	if e := ask("in notice"); e == nil || e.Code != errs.RateLimited || e.Details["sow_id"] != sow2 {
		t.Fatalf("the question in notice: %+v", e)
	}
	c.clock.Advance(2*time.Hour + time.Minute)
	for i := range 3 {
		if e := ask("after the notice"); e != nil {
			t.Fatalf("question %d after the notice: %+v", i+1, e)
		}
	}
	if r := ew.record(client2, "summarize"); r["state"] != sow.StateTerminated || r["in_force"] != false {
		t.Fatalf("the record after the notice: %v %v", r["state"], r["in_force"])
	}
}

// answersOn collects every answer on the bus to requests sent with the
// function it returns, which sends one signed request of from to seller's
// offering and waits for its terminal answer (the accept, when there is
// one, first).
func answersOn(t *testing.T, nc *nats.Conn, seller string) func(from *keys.Agent, offering string) (string, []*protocol.Envelope) {
	t.Helper()
	var mu sync.Mutex
	answers := map[string][]*protocol.Envelope{}
	collect := func(m *nats.Msg) {
		e, err := protocol.Decode(m.Data)
		if err != nil || e.Type != protocol.TypeRespond || e.From != seller {
			return
		}
		mu.Lock()
		answers[e.InReplyTo] = append(answers[e.InReplyTo], e)
		mu.Unlock()
	}
	sub, err := nc.Subscribe("_INBOX.engaged.>", collect)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// A performer also answers at the requester's inbox.
	inboxes := map[string]bool{}
	return func(from *keys.Agent, offering string) (string, []*protocol.Envelope) {
		t.Helper()
		if !inboxes[from.Public()] {
			inboxes[from.Public()] = true
			s, err := nc.Subscribe(protocol.InboxSubject(from.Public()), collect)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Unsubscribe() })
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		env, err := protocol.New(protocol.TypeRequest, from.Public(), map[string]any{"offering": offering, "input": map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		env.To = seller
		if err := env.Sign(from); err != nil {
			t.Fatal(err)
		}
		raw, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(protocol.InboxSubject(seller), "_INBOX.engaged."+env.ID, raw); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); ; {
			mu.Lock()
			out := slices.Clone(answers[env.ID])
			mu.Unlock()
			if n := len(out); n > 0 && protocol.ResponseStatus(out[n-1]) != protocol.StatusAccepted {
				return env.ID, out
			}
			if time.Now().After(deadline) {
				t.Fatalf("no terminal answer to a request for %s (%d answers)", offering, len(out))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// admitQuestion asks the agreements service what the seller's node asks
// at admission, in an envelope stamped at now; nil is admitted.
func admitQuestion(t *testing.T, nc *nats.Conn, seller *keys.Agent, requester, offering string, now time.Time) *errs.Error {
	t.Helper()
	env, err := protocol.New(protocol.TypeRequest, seller.Public(), agreements.AdmitRequest{Requester: requester, Offering: offering, RequestID: "q-" + now.Format(time.RFC3339Nano)})
	if err != nil {
		t.Fatal(err)
	}
	env.TS = protocol.FormatTime(now)
	if err := env.Sign(seller); err != nil {
		t.Fatal(err)
	}
	raw, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(protocol.SubjCommerceAdmit, raw, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := protocol.Decode(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if e := bus.ErrorOf(answer); e != nil {
		return e
	}
	var out agreements.Admitted
	if err := json.Unmarshal(answer.Payload, &out); err != nil || !out.Admitted {
		t.Fatalf("the admission answer: %s (%v)", answer.Payload, err)
	}
	return nil
}

// engagementParties forms and terminates engagements of one provider over
// HTTP, the way TestEngagementsOverHTTP does, with owner keys the
// registry holds by attestation.
type engagementParties struct {
	*cp
	provider *keys.Agent
	pOwner   keys.Signer
}

// form files a standing proposal for client on summarize, with a volume
// of two requests an hour graded enforced and a two-hour convenience
// notice, countersigns it and signs the instance.
func (e *engagementParties) form(id string, client *keys.Agent, cOwner keys.Signer) {
	e.t.Helper()
	doc := func() map[string]any {
		return map[string]any{
			"sow": "v1", "id": id, "version": 1, "starts_at": nil, "ends_at": nil,
			"parties": map[string]any{"provider": map[string]any{"agent": e.provider.Public(), "owner": "Provider Ltd"}, "client": nil, "grade": "evidence"},
			"scope":   map[string]any{"offerings": []any{"summarize"}, "grade": "enforced"},
			"price":   map[string]any{"arrangement": "no_charge", "grade": "recorded"},
			"volume":  map[string]any{"per_hour": 2, "grade": "enforced"},
			"change_control": map[string]any{"review_window_days": 1,
				"approval": map[string]any{"formation": "agent", "amendment": "agent"}, "grade": "enforced"},
			"termination": map[string]any{"convenience_notice_hours": 2, "grade": "recorded"},
			"disputes":    map[string]any{"posture": "escalate_to_owners", "grade": "evidence"},
		}
	}
	if st, out := e.postBytes("/v1/engage/proposals", documentBody(e.sign(doc(), sow.RoleProvider, e.pOwner))); st != 200 {
		e.t.Fatalf("proposal %s: %d %v", id, st, out)
	}
	inst := doc()
	inst["parties"].(map[string]any)["client"] = map[string]any{"agent": client.Public(), "owner": "Client Inc"}
	now := e.clock.Now().UTC()
	inst["starts_at"], inst["ends_at"] = now.Format(time.RFC3339), now.AddDate(0, 3, 0).Format(time.RFC3339)
	if st, out := e.postBytes("/v1/engage/countersign", documentBody(e.sign(inst, sow.RoleClient, cOwner))); st != 200 {
		e.t.Fatalf("countersign %s: %d %v", id, st, out)
	}
	if st, out := e.postBytes("/v1/engage/sign", documentBody(e.sign(inst, sow.RoleProvider, e.pOwner))); st != 200 || out["formed"] != true {
		e.t.Fatalf("instance signature %s: %d %v", id, st, out)
	}
}

func (e *engagementParties) sign(doc map[string]any, role string, k keys.Signer) []byte {
	e.t.Helper()
	s, err := sow.Sign(doc, k, role, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	sigs, _ := doc["signatures"].([]any)
	doc["signatures"] = append(sigs, map[string]any{"role": s.Role, "key": s.Key, "signed_at": s.SignedAt, "sig": s.Sig})
	b, err := json.Marshal(doc)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// terminate sends a termination of version 1 signed by k.
func (e *engagementParties) terminate(id string, client *keys.Agent, k keys.Signer, members map[string]any) {
	e.t.Helper()
	obj := map[string]any{"v": 1, "client": client.Public(), "seller": e.provider.Public(), "offering": "summarize", "sow_id": id,
		"version": 1, "at": e.clock.Now().UTC().Format(time.RFC3339)}
	maps.Copy(obj, members)
	if err := engagement.SignAct(engagement.TagTerminate, obj, k); err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(obj)
	if st, out := e.postBytes("/v1/engage/terminate", b); st != 200 {
		e.t.Fatalf("terminate %s: %d %v", id, st, out)
	}
}

func (e *engagementParties) record(client *keys.Agent, offering string) map[string]any {
	e.t.Helper()
	st, _, body := e.get("/v1/engagements/" + client.Public() + "/" + e.provider.Public() + "/" + offering)
	var out map[string]any
	if st != 200 || json.Unmarshal(body, &out) != nil {
		e.t.Fatalf("record: %d %s", st, body)
	}
	return out["engagement"].(map[string]any)
}

// consoleBrowser is a signed-in console session.
type consoleBrowser struct {
	t    *testing.T
	base string // the console URL, ending in /console/
	hc   *http.Client
}

var consoleCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// consoleSignIn signs in to the console with the mailed code.
func consoleSignIn(t *testing.T, c *cp, email string) *consoleBrowser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &consoleBrowser{t: t, base: c.m.URLs().Console, hc: &http.Client{Jar: jar, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	post := func(path string, form url.Values) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		u, _ := url.Parse(b.base)
		req.Header.Set("Origin", u.Scheme+"://"+u.Host)
		resp, err := b.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	csrf := func(page string) string {
		t.Helper()
		m := consoleCSRF.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no csrf field on the page:\n%s", page)
		}
		return m[1]
	}
	resp := post("login", url.Values{"email": {email}, "csrf": {csrf(b.get("login"))}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("console sign-in: %d", resp.StatusCode)
	}
	// The account's mail also holds the notices of the agent keys minted
	// for it: the code is in the first message that has one.
	var code string
	for code == "" {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		msg, err := c.smtp.Wait(ctx, email)
		cancel()
		if err != nil {
			t.Fatalf("no code mailed to %s: %v", email, err)
		}
		if m := codeRE.FindStringSubmatch(msg.Message.Text); m != nil {
			code = m[1]
		}
	}
	codePage := b.get(strings.TrimPrefix(resp.Header.Get("Location"), "/console/"))
	if resp := post("login/verify", url.Values{"email": {email}, "code": {code}, "csrf": {csrf(codePage)}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("console verify: %d", resp.StatusCode)
	}
	return b
}

// get fetches a page under the console and returns its body (200 only).
func (b *consoleBrowser) get(path string) string {
	b.t.Helper()
	resp, err := b.hc.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	if _, err := io.Copy(&sb, resp.Body); err != nil || resp.StatusCode != 200 {
		b.t.Fatalf("console %s: %d %v", path, resp.StatusCode, err)
	}
	return sb.String()
}
