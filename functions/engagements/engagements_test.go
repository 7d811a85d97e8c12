package engagements_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/engagements"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// The rendered record shows every clause with the grade it was signed
// with, the history with the denial's reason, the termination block and
// the reviews, everything escaped.
func TestRenderGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "document.json"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := sow.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	const client, seller = "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP", "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A"
	v := &engagement.View{Client: client, Seller: seller, Offering: "summarize-filing", SowID: d.ID, State: sow.StateActive, InForce: true,
		Version: 2, Document: string(raw), DocumentSHA256: "00ff", Offerings: d.Scope.Offerings, StartsAt: d.StartsAt, EndsAt: d.EndsAt,
		FormedAt: "2026-08-04T00:00:00.000000000Z", Owners: engagement.Owners{Provider: "UOWNERPROVIDER", Client: "UOWNERCLIENT"},
		Clauses: engagement.Clauses(d),
		Amendments: []engagement.HistoryItem{
			{Kind: engagement.EventProposed, At: "2026-08-05T00:00:00Z", Version: 2, Role: "client"},
			{Kind: engagement.EventDenied, At: "2026-08-06T00:00:00Z", Version: 2, Role: "provider", Reason: `Not at this price <script>alert(1)</script>`},
		},
		History: []engagement.HistoryItem{{Seq: 2, Kind: engagement.EventFormed, At: "2026-08-04T00:00:00Z", Version: 1, Role: "provider",
			SignedSHA256: "00ff", Link: "/v1/engagements/" + client + "/" + seller + "/summarize-filing?event=2"}},
		HistoryTotal: 5, HistoryNext: 2,
		Termination: &engagement.TermView{ForCause: false, By: "UOWNERCLIENT", Role: "client", SignedAt: "2026-08-07T00:00:00Z",
			RecordedAt: "2026-08-07T00:00:00Z", EffectiveAt: "2026-08-08T00:00:00Z", InNotice: true},
		Reviews: []engagement.ReviewView{{Verdict: "rejected", Reason: "Missed the totals & the dates.", TaskID: "task-1", SignedAt: "2026-08-07T00:00:00Z"}},
	}
	if d.Language != nil {
		v.Language = "this renderer does not know the standard language " + d.Language.ID + "; the signed fields are shown verbatim (§4.3)"
	}
	got, err := engagements.Render(v)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "engagement.html")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the page differs from %s (go test -update rewrites it):\n%s", golden, got)
	}
	for _, must := range []string{"confidentiality.transport", "confidentiality.promises", "&lt;script&gt;", "notice running, in force until"} {
		if !bytes.Contains(got, []byte(must)) {
			t.Errorf("the page lacks %q", must)
		}
	}
	if bytes.Contains(got, []byte("<script>")) {
		t.Error("a reason reached the page unescaped")
	}
}

type dir map[string]engagement.AgentInfo

func (d dir) Agent(_ context.Context, a string, _ time.Time) (engagement.AgentInfo, error) {
	return d[a], nil
}

func key(t *testing.T) *keys.Agent {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Over the routes: the document travels as the body's document member and
// is kept byte for byte; the record answers JSON by default and the page
// when asked (Accept or ?format=html); an unknown record is 404.
func TestRoutes(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	provider, client, pOwner, cOwner := key(t), key(t), key(t), key(t)
	now := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	svc := engagement.New(engagement.Config{Store: st, Now: func() time.Time { return now }, Directory: dir{
		provider.Public(): {Registered: true, Owner: pOwner.Public(), Offerings: []string{"summarize"}},
		client.Public():   {Registered: true, Owner: cOwner.Public()},
	}})
	d := &api.Deps{Log: slog.New(slog.DiscardHandler), Engagements: svc}
	mux := http.NewServeMux()
	d.Mount(mux, engagements.Routes)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	doc := map[string]any{"sow": "v1", "id": "sow_routes000000001", "version": 1, "starts_at": nil, "ends_at": nil,
		"parties":        map[string]any{"provider": map[string]any{"agent": provider.Public(), "owner": "P"}, "client": nil, "grade": "evidence"},
		"scope":          map[string]any{"offerings": []any{"summarize"}, "grade": "evidence"},
		"price":          map[string]any{"arrangement": "no_charge", "grade": "recorded"},
		"change_control": map[string]any{"review_window_days": 3, "approval": map[string]any{"formation": "agent", "amendment": "agent"}, "grade": "enforced"},
		"termination":    map[string]any{"convenience_notice_hours": 1, "grade": "recorded"}}
	sign := func(m map[string]any, role string, k keys.Signer) []byte {
		s, err := sow.Sign(m, k, role, now)
		if err != nil {
			t.Fatal(err)
		}
		sigs, _ := m["signatures"].([]any)
		m["signatures"] = append(sigs, map[string]any{"role": s.Role, "key": s.Key, "signed_at": s.SignedAt, "sig": s.Sig})
		b, _ := json.MarshalIndent(m, "", "\t")
		return b
	}
	post := func(path string, body []byte) (int, map[string]any) {
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	wrap := func(doc []byte) []byte { return append(append([]byte(`{"document": `), doc...), '}') }
	if st, out := post("/v1/engage/proposals", wrap(sign(doc, sow.RoleProvider, pOwner))); st != 200 {
		t.Fatalf("proposal: %d %v", st, out)
	}
	delete(doc, "signatures")
	doc["parties"].(map[string]any)["client"] = map[string]any{"agent": client.Public(), "owner": "C"}
	doc["starts_at"], doc["ends_at"] = "2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z"
	if st, out := post("/v1/engage/countersign", wrap(sign(doc, sow.RoleClient, cOwner))); st != 200 || out["formed"] != false {
		t.Fatalf("countersign: %d %v", st, out)
	}
	agreed := sign(doc, sow.RoleProvider, pOwner)
	if st, out := post("/v1/engage/sign", wrap(agreed)); st != 200 || out["formed"] != true {
		t.Fatalf("sign: %d %v", st, out)
	}
	path := engagements.RecordPath(client.Public(), provider.Public(), "summarize")
	get := func(path, accept string) (int, string, []byte) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), b
	}
	for _, accept := range []string{"", "application/json", "application/json, text/html"} {
		st, ct, body := get(path, accept)
		var out struct {
			Engagement engagement.View `json:"engagement"`
		}
		if st != 200 || ct != "application/json" || json.Unmarshal(body, &out) != nil || out.Engagement.Document != string(agreed) {
			t.Fatalf("Accept %q: %d %s %s", accept, st, ct, body)
		}
	}
	for _, p := range []string{path + "?format=html", path} {
		accept := ""
		if p == path {
			accept = "text/html,application/xhtml+xml"
		}
		st, ct, body := get(p, accept)
		if st != 200 || !strings.HasPrefix(ct, "text/html") || !bytes.Contains(body, []byte("change_control")) {
			t.Fatalf("%s as html: %d %s", p, st, ct)
		}
	}
	// One page of the history; a document event by its link.
	code, _, body := get(path+"?history_limit=1", "")
	var paged struct {
		Engagement engagement.View `json:"engagement"`
	}
	if code != 200 || json.Unmarshal(body, &paged) != nil || len(paged.Engagement.History) != 1 || paged.Engagement.HistoryNext != 1 || paged.Engagement.HistoryTotal != 2 {
		t.Fatalf("a page of one: %d %s", code, body)
	}
	code, _, body = get(path+"?history_after=1", "")
	if json.Unmarshal(body, &paged) != nil || len(paged.Engagement.History) != 1 || paged.Engagement.History[0].Link != path+"?event=2" {
		t.Fatalf("the second page: %d %s", code, body)
	}
	var ev struct {
		Event engagement.HistoryItem `json:"event"`
	}
	if st, _, body := get(path+"?event=2", ""); st != 200 || json.Unmarshal(body, &ev) != nil || ev.Event.Signed != string(agreed) {
		t.Fatalf("event 2: %d %s", st, body)
	}
	if st, _, _ := get(path+"?history_limit=-1", ""); st != 400 {
		t.Fatalf("a negative limit: %d", st)
	}
	if st, out := post("/v1/engage/countersign/withdraw", []byte(`{"v":1}`)); st != 400 {
		t.Fatalf("a malformed request withdrawal: %d %v", st, out)
	}
	if st, _, _ := get(engagements.RecordPath(client.Public(), provider.Public(), "other"), ""); st != 404 {
		t.Fatalf("unknown record: %d", st)
	}
	if st, out := post("/v1/reviews", []byte(`{"v":1}`)); st != 400 {
		t.Fatalf("a malformed review: %d %v", st, out)
	}
}
