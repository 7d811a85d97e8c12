package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// fakeCommerce is the bus as the commerce pages read it: registry
// records by agent key, the public listing, agreements by owner, the
// account's agents and the paired handles. Tests change it between page
// loads (a seller re-pricing).
type fakeCommerce struct {
	mu         sync.Mutex
	records    map[string]map[string]any
	public     []string // agent keys the listing holds, in order
	incomplete bool
	agreements map[string][]console.HeldAgreement
	agents     []console.AccountAgent
	handles    map[string]string
	down       bool // every read fails
}

var errDown = errors.New("the bus is down")

func newFakeCommerce() *fakeCommerce {
	return &fakeCommerce{records: map[string]map[string]any{}, agreements: map[string][]console.HeldAgreement{}, handles: map[string]string{}}
}

// clone hands out a copy, as a bus answer would be: a page that changed
// what it was given must not change the registry.
func clone(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

func (f *fakeCommerce) Agent(_ context.Context, agent string) (map[string]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	if r := f.records[agent]; r != nil {
		return clone(r), nil
	}
	return nil, nil
}

func (f *fakeCommerce) Listing(context.Context) ([]map[string]any, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, false, errDown
	}
	var out []map[string]any
	for _, k := range f.public {
		out = append(out, clone(f.records[k]))
	}
	return out, !f.incomplete, nil
}

func (f *fakeCommerce) Agreements(_ context.Context, owner string) ([]console.HeldAgreement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	return f.agreements[owner], nil
}

func (f *fakeCommerce) AccountAgents(context.Context, string) ([]console.AccountAgent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents, nil
}

func (f *fakeCommerce) HandleAgent(_ context.Context, handle string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handles[handle], nil
}

func (f *fakeCommerce) set(fn func(f *fakeCommerce)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// fakeEngagements lists fixed engagements for the agents asked about.
type fakeEngagements struct {
	list  []console.EngagementSummary
	asked []string
}

func (e *fakeEngagements) ListForAgents(_ context.Context, agents []string) ([]console.EngagementSummary, error) {
	e.asked = agents
	return e.list, nil
}

// commerceHost serves a console built with the given commerce stand-ins,
// and hands out a signed-in browser and a signed-out one.
type commerceHost struct {
	srv       *httptest.Server
	in, out   *browser
	accountID string
}

func startCommerceHost(t *testing.T, c console.Commerce, e console.EngagementLister) *commerceHost {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h := &commerceHost{}
	mux := http.NewServeMux()
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	m := &lastMail{}
	acc := account.New(account.Config{Store: st, Mail: m, ConsoleURL: h.srv.URL + "/console/"})
	mux.Handle("/console/", console.New(console.Config{Accounts: acc, ConsoleURL: h.srv.URL + "/console/", Commerce: c, Engagements: e}))
	ctx := context.Background()
	if _, err := acc.StartLogin(ctx, "ana@example.org", true, "test"); err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`\b(\d{6})\b`).FindStringSubmatch(m.msg.Text)[1]
	tok, _, a, err := acc.VerifyLogin(ctx, "ana@example.org", code)
	if err != nil {
		t.Fatal(err)
	}
	h.accountID = a.ID
	h.in, h.out = newBrowser(t, h.srv.URL+"/console/"), newBrowser(t, h.srv.URL+"/console/")
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(h.srv.URL + "/console/")
	jar.SetCookies(u, []*http.Cookie{{Name: "mesh_console_session", Value: tok, Path: "/console/"}})
	h.in.hc.Jar = jar
	return h
}

func newKey(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The fixture's SKU (docs/commerce.md "Worked example") at amount, and its
// digest as the commerce library computes it.
func caselawSKU(t *testing.T, amount int64) (map[string]any, string) {
	t.Helper()
	v := map[string]any{"sku": "caselaw-metered", "covers": map[string]any{"offerings": []any{"caselaw-summary", "caselaw-cite-check"}},
		"price": map[string]any{"model": "per_unit", "currency": "USD", "meter": "tokens_out", "per": float64(1000), "amount_micro": float64(amount),
			"included": map[string]any{"quantity": float64(10000), "period": "day"}},
		"provider": map[string]any{"id": "internal", "terms_url": "https://example.com/agent-terms/v3"}}
	s, err := commerce.SKUFromValue(clone(v))
	if err != nil {
		t.Fatal(err)
	}
	return v, s.Digest()
}

func flatCreditsSKU(t *testing.T, id string, amount int64) (map[string]any, string) {
	t.Helper()
	v := map[string]any{"sku": id, "covers": map[string]any{"agent": true},
		"price":    map[string]any{"model": "flat", "currency": "XCR", "amount_micro": float64(amount)},
		"provider": map[string]any{"id": "internal"}}
	s, err := commerce.SKUFromValue(clone(v))
	if err != nil {
		t.Fatal(err)
	}
	return v, s.Digest()
}

func registration(id, name, node, owner string, skus ...any) map[string]any {
	r := map[string]any{"id": id, "name": name, "node": map[string]any{"id": node}}
	if owner != "" {
		r["owner"], r["owner_expires_at"] = owner, protocol.FormatTime(time.Now().Add(time.Hour))
	}
	if skus != nil {
		r["skus"] = skus
	}
	return r
}

// text is a page's body with its tags removed and its spaces collapsed,
// for sentences that span elements.
func text(page answer) string {
	s := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page.body, " ")
	return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
}

// A seller's offers page, public, lists each SKU of its registration:
// id, what it covers, the price in exact words, who bills, the terms and
// the current digest, with the approval page of each paid one; by key or
// by handle. An agent that publishes none, or is not registered, is one
// sentence.
func TestConsoleOffersPage(t *testing.T) {
	f := newFakeCommerce()
	h := startCommerceHost(t, f, nil)
	seller, node, owner := newKey(t).Public(), newKey(t).Public(), newKey(t).Public()
	caselaw, caselawDigest := caselawSKU(t, 1500)
	flat, flatDigest := flatCreditsSKU(t, "whole-agent", 2_500_000)
	free := map[string]any{"sku": "sampler", "covers": map[string]any{"offerings": []any{"sample"}}, "price": map[string]any{"model": "free"},
		"provider": map[string]any{"id": "internal"}}
	f.records[seller] = registration(seller, "Caselaw bot", node, owner, caselaw, flat, free)
	f.handles["law.ana@example.org"] = seller

	for _, asked := range []string{seller, "law.ana@example.org"} {
		page := h.out.get("offers/" + asked)
		body, words := page.body, text(page)
		if page.status != 200 {
			t.Fatalf("offers of %s: %d\n%s", asked, page.status, body)
		}
		for _, want := range []string{"Offers of Caselaw bot", seller, owner,
			"caselaw-metered caselaw-summary, caselaw-cite-check 0.0015 USD per 1000 tokens_out. The first 10000 tokens_out each day are included free.",
			"whole-agent every offering of the agent 2.5 credits (XCR) per request.",
			"sampler sample Free: no agreement is needed.", caselawDigest, flatDigest} {
			if !strings.Contains(words, want) {
				t.Errorf("offers of %s lack %q:\n%s", asked, want, words)
			}
		}
		for _, want := range []string{`<a href="https://example.com/agent-terms/v3">terms</a>`,
			`<a href="/console/agreements/approve?seller=` + seller + `&amp;sku=caselaw-metered">how to approve</a>`} {
			if !strings.Contains(body, want) {
				t.Errorf("offers of %s lack %s", asked, want)
			}
		}
	}

	plain := newKey(t).Public()
	f.records[plain] = registration(plain, "Plain", node, "")
	bad := newKey(t).Public()
	f.records[bad] = registration(bad, "Bad", node, "", map[string]any{"sku": "x"})
	for _, tc := range []struct {
		asked  string
		status int
		note   string
	}{
		{plain, 200, "This agent publishes no SKUs: every offering it has is free, and no agreement is needed to use it."},
		{bad, 200, "This agent's published SKUs cannot be read: SKU: x: covers is required: {agent: true} or {offerings: [...]}."},
		{newKey(t).Public(), 404, "is not registered on this mesh now, so it offers nothing."},
		{"nobody.ana@example.org", 404, "No agent is paired with the handle nobody.ana@example.org."},
		{"not-a-key", 404, "That is neither an agent key (U followed by 55 characters) nor a handle (name.you@example.org)."},
	} {
		page := h.out.get("offers/" + tc.asked)
		if page.status != tc.status || !strings.Contains(text(page), tc.note) {
			t.Errorf("offers of %s: %d, want %d with %q:\n%s", tc.asked, page.status, tc.status, tc.note, text(page))
		}
	}
	f.set(func(f *fakeCommerce) { f.down = true })
	if page := h.out.get("offers/" + seller); page.status != http.StatusBadGateway || !strings.Contains(page.body, "The registry cannot be read right now.") {
		t.Errorf("registry down: %d\n%s", page.status, page.body)
	}
}

// The approval page AGREEMENT_REQUIRED points at is public, and says for
// every public seller publishing the SKU what it costs, its current
// digest and the exact command that approves it; &seller= names one that
// the listing does not hold. The host's approval address forwards to it.
func TestConsoleApprovalPage(t *testing.T) {
	f := newFakeCommerce()
	h := startCommerceHost(t, f, nil)
	node := newKey(t).Public()
	a, b, other, unlisted := newKey(t).Public(), newKey(t).Public(), newKey(t).Public(), newKey(t).Public()
	skuA, digestA := caselawSKU(t, 1500)
	skuB, digestB := caselawSKU(t, 1501)
	flat, _ := flatCreditsSKU(t, "whole-agent", 1)
	f.records[a] = registration(a, "Alpha law", node, "", skuA)
	f.records[b] = registration(b, "Beta law", node, "", skuB, flat)
	f.records[other] = registration(other, "Other", node, "", flat)
	f.records[unlisted] = registration(unlisted, "Unlisted law", node, "", skuA)
	f.public = []string{b, other, a}

	for _, br := range []*browser{h.out, h.in} {
		page := br.get("agreements/approve?sku=caselaw-metered")
		words := text(page)
		if page.status != 200 {
			t.Fatalf("approval: %d\n%s", page.status, page.body)
		}
		cmds := regexp.MustCompile(`class="agree-command">([^<]+)<`).FindAllStringSubmatch(page.body, -1)
		if len(cmds) != 2 || cmds[0][1] != "mesh-adapter agree "+a+" caselaw-metered --digest "+digestA || cmds[1][1] != "mesh-adapter agree "+b+" caselaw-metered --digest "+digestB {
			t.Errorf("the commands: %q", cmds)
		}
		digests := regexp.MustCompile(`class="id digest">([^<]+)<`).FindAllStringSubmatch(page.body, -1)
		if len(digests) != 2 || digests[0][1] != digestA || digests[1][1] != digestB {
			t.Errorf("the digests: %q, want %s then %s", digests, digestA, digestB)
		}
		for _, want := range []string{"Alpha law", "0.0015 USD per 1000 tokens_out.", "Beta law", "0.001501 USD per 1000 tokens_out.",
			"The console cannot sign it: the owner key stays in your adapter's state"} {
			if !strings.Contains(words, want) {
				t.Errorf("the approval page lacks %q:\n%s", want, words)
			}
		}
		if strings.Contains(words, "Other") || strings.Contains(words, unlisted) {
			t.Errorf("a seller not publishing the SKU, or not listed, is shown:\n%s", words)
		}
		if signedIn := strings.Contains(page.body, `href="/console/agreements" aria-current="page"`); signedIn != (br == h.in) {
			t.Errorf("the navigation is shown: %v", signedIn)
		}
	}

	page := h.out.get("agreements/approve?sku=caselaw-metered&seller=" + unlisted)
	if cmds := regexp.MustCompile(`class="agree-command">([^<]+)<`).FindAllStringSubmatch(page.body, -1); page.status != 200 ||
		len(cmds) != 1 || !strings.HasPrefix(cmds[0][1], "mesh-adapter agree "+unlisted+" caselaw-metered --digest ") {
		t.Errorf("a named seller: %d %q", page.status, cmds)
	}
	f.set(func(f *fakeCommerce) { f.incomplete = true })
	if page := h.out.get("agreements/approve?sku=caselaw-metered"); !strings.Contains(text(page), "Only the first 3 public agents were searched. If the seller is not below, name it") {
		t.Errorf("a partial listing is not said:\n%s", text(page))
	}
	for _, tc := range []struct {
		path   string
		status int
		note   string
	}{
		{"agreements/approve", 400, "This address names no SKU"},
		{"agreements/approve?sku=Not_An_Id", 400, "This address names no SKU"},
		{"agreements/approve?sku=nobody-sells", 404, "No public agent on this mesh publishes the SKU nobody-sells. If the seller is unlisted, name it: /console/agreements/approve?sku=nobody-sells&seller=<agent key or handle>"},
		{"agreements/approve?sku=caselaw-metered&seller=" + other, 404, "does not publish the SKU caselaw-metered now"},
	} {
		page := h.out.get(tc.path)
		if page.status != tc.status || !strings.Contains(text(page), tc.note) {
			t.Errorf("%s: %d, want %d with %q:\n%s", tc.path, page.status, tc.status, tc.note, text(page))
		}
	}

	// The address of the refusal itself, commerce.ApprovalURL's, is the
	// group's second row: it forwards to the page with the members the
	// page reads.
	var row *http.HandlerFunc
	for _, rt := range console.Routes {
		if rt.Path == commerce.ApprovalPath {
			fn := rt.Handler(nil)
			hf := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = fn(w, r) })
			row = &hf
		}
	}
	if row == nil {
		t.Fatal("no row serves " + commerce.ApprovalPath)
	}
	approval, err := url.Parse(commerce.ApprovalURL("https://console.example.com", mustSKU(t, skuA)))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	(*row)(rec, httptest.NewRequest(http.MethodGet, approval.RequestURI()+"&junk=1", nil))
	if rec.Code != http.StatusFound || rec.Header().Get("Location") != "/console/agreements/approve?sku=caselaw-metered" {
		t.Errorf("the approval address answers %d %q", rec.Code, rec.Header().Get("Location"))
	}
}

func mustSKU(t *testing.T, v map[string]any) commerce.SKU {
	t.Helper()
	s, err := commerce.SKUFromValue(clone(v))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// agreement is an owner-signed agreement to sku at digest, as stored.
func agreement(t *testing.T, owner *keys.Agent, seller, sku, digest string, agreed time.Time, expires string, revoked *time.Time) console.HeldAgreement {
	t.Helper()
	a := commerce.Agreement{SellerAgent: seller, SKU: sku, SKUDigest: digest, AgreedAt: protocol.FormatTime(agreed), ExpiresAt: expires}
	if err := commerce.Sign(&a, owner); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return console.HeldAgreement{Seller: seller, Owner: owner.Public(), SKU: sku,
		Record: commerce.AgreementRecord{Agreement: raw, FiledAt: agreed, RevokedAt: revoked}}
}

// agreementRows is the agreements table: SKU → [state, digest].
func agreementRows(t *testing.T, page answer) map[string][2]string {
	t.Helper()
	rows := regexp.MustCompile(`(?s)<td data-label="SKU"><code>([^<]+)</code></td>\s*<td data-label="Digest"><code class="id">([^<]*)</code></td>.*?state-([a-z-]+)"`).FindAllStringSubmatch(page.body, -1)
	out := map[string][2]string{}
	for _, r := range rows {
		out[r[1]] = [2]string{r[3], r[2]}
	}
	return out
}

// The agreements page lists the agreements held by the owners of the
// account's agents (the registration's owner, else its node), each judged
// against the seller's SKU as registered now: a re-priced SKU makes the
// agreement stale at once, naming the new digest and linking the approval
// page. Engagements are listed by the lister the console is given, each
// linking its public record; without one the section says so.
func TestConsoleAgreementsPage(t *testing.T) {
	f := newFakeCommerce()
	eng := &fakeEngagements{}
	h := startCommerceHost(t, f, eng)
	if a := h.out.get("agreements"); a.status != http.StatusSeeOther || a.location != "/console/login?next=%2Fconsole%2Fagreements" {
		t.Fatalf("signed out: %d %q", a.status, a.location)
	}
	mine, hosted, gone := newKey(t).Public(), newKey(t).Public(), newKey(t).Public()
	owner, node, seller := newKey(t), newKey(t), newKey(t).Public()
	f.agents = []console.AccountAgent{{ID: mine, Label: "mine", Handle: "mine.ana@example.org"}, {ID: hosted, Label: "hosted"}, {ID: gone, Label: "gone"}}
	f.records[mine] = registration(mine, "Mine", node.Public(), owner.Public())
	f.records[hosted] = registration(hosted, "Hosted", node.Public(), "")
	caselaw, digest := caselawSKU(t, 1500)
	flat, flatDigest := flatCreditsSKU(t, "whole-agent", 1_000_000)
	f.records[seller] = registration(seller, "Caselaw bot", newKey(t).Public(), "", caselaw, flat)
	now := time.Now().UTC()
	revokedAt := now.Add(-time.Hour)
	f.agreements[owner.Public()] = []console.HeldAgreement{
		agreement(t, owner, seller, "caselaw-metered", digest, now.Add(-48*time.Hour), "", nil),
		agreement(t, owner, seller, "whole-agent", flatDigest, now.Add(-48*time.Hour), protocol.FormatTime(now.Add(-time.Minute)), nil),
	}
	f.agreements[node.Public()] = []console.HeldAgreement{
		agreement(t, node, seller, "gone-sku", flatDigest, now.Add(-48*time.Hour), "", nil),
	}
	f.agreements[node.Public()] = append(f.agreements[node.Public()], func() console.HeldAgreement {
		a := agreement(t, node, seller, "whole-agent", flatDigest, now.Add(-48*time.Hour), "", &revokedAt)
		a.SKU = "whole-agent-revoked" // a second row under the same owner
		return a
	}())

	page := h.in.get("agreements")
	if page.status != 200 {
		t.Fatalf("agreements: %d\n%s", page.status, page.body)
	}
	rows := agreementRows(t, page)
	want := map[string][2]string{"caselaw-metered": {"in-force", digest}, "whole-agent": {"expired", flatDigest},
		"gone-sku": {"withdrawn", flatDigest}, "whole-agent-revoked": {"revoked", flatDigest}}
	if len(rows) != len(want) {
		t.Fatalf("rows %v, want %v\n%s", rows, want, text(page))
	}
	for k, v := range want {
		if rows[k] != v {
			t.Errorf("%s: %v, want %v", k, rows[k], v)
		}
	}
	words := text(page)
	for _, w := range []string{owner.Public() + " , owner of mine.ana@example.org", node.Public() + " , owner of hosted",
		"Not registered now, so their owners are not known: gone.", "Caselaw bot"} {
		if !strings.Contains(words, w) {
			t.Errorf("the page lacks %q:\n%s", w, words)
		}
	}

	// The seller re-prices: the standing agreement is stale at once.
	repriced, newDigest := caselawSKU(t, 1501)
	f.set(func(f *fakeCommerce) { f.records[seller]["skus"] = []any{repriced, flat} })
	page = h.in.get("agreements")
	if got := agreementRows(t, page)["caselaw-metered"]; got != [2]string{"stale", digest} {
		t.Errorf("after re-pricing: %v", got)
	}
	if !strings.Contains(text(page), "Stale: the seller changed the terms (the digest is now "+newDigest+").") ||
		!strings.Contains(page.body, `<a href="/console/agreements/approve?seller=`+seller+`&amp;sku=caselaw-metered">Approve again</a>`) {
		t.Errorf("the stale row does not name the new digest or link the approval:\n%s", page.body)
	}

	// Engagements: none, then one, linked to its public record.
	if !strings.Contains(text(page), "Your agents are party to no engagement.") || len(eng.asked) != 3 {
		t.Errorf("no engagements (asked for %v):\n%s", eng.asked, text(page))
	}
	eng.list = []console.EngagementSummary{{SowID: "sow_1", Version: 2, Client: mine, Seller: seller, Offering: "caselaw-summary", State: "in force", StartsAt: now}}
	page = h.in.get("agreements")
	if !strings.Contains(page.body, `<a href="/v1/engagements/`+mine+`/`+seller+`/caselaw-summary">sow_1 v2</a>`) ||
		!strings.Contains(text(page), "mine.ana@example.org Caselaw bot caselaw-summary in force") {
		t.Errorf("the engagement row:\n%s", page.body)
	}

	// The owner's attestation of mine expires: mine has no owner now (not
	// its node instead), and that owner's agreements are not the
	// account's any more (review 18 #1).
	f.set(func(f *fakeCommerce) {
		f.records[mine]["owner_expires_at"] = protocol.FormatTime(now.Add(-time.Second))
	})
	page = h.in.get("agreements")
	if rows := agreementRows(t, page); len(rows) != 2 || rows["caselaw-metered"] != [2]string{} {
		t.Errorf("rows after the owner's attestation expired: %v", rows)
	}
	if words := text(page); !strings.Contains(words, "No owner now, so no agreement covers their requests") ||
		!strings.Contains(words, "has expired; restart it from an adapter with an owner key to register it with one): mine.ana@example.org.") ||
		strings.Contains(words, "owner of mine.ana@example.org") {
		t.Errorf("the page after the owner's attestation expired:\n%s", words)
	}

	// Without a bus, or a lister, the sections say so.
	bare := startCommerceHost(t, nil, nil)
	page = bare.in.get("agreements")
	if page.status != 200 || strings.Count(page.body, "this console has no connection to it.") != 2 {
		t.Errorf("no bus: %d\n%s", page.status, text(page))
	}
	f2 := newFakeCommerce()
	noLister := startCommerceHost(t, f2, nil)
	if page := noLister.in.get("agreements"); !strings.Contains(text(page), "Engagements cannot be listed on this instance.") ||
		!strings.Contains(text(page), "None of your agents is registered now") {
		t.Errorf("no lister:\n%s", text(page))
	}
}
