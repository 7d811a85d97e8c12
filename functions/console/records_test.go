package console_test

import (
	"context"
	"fmt"
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
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// recordsHost is one host serving the console and, beside it, stand-ins
// for the control plane's anchors and export routes, as the load balancer
// (or meshd's mux) puts them on one host: the Records page reads them
// there.
type recordsHost struct {
	srv *httptest.Server
	b   *browser
	// anchors and export answer GET /v1/anchors and the export route; nil
	// answers 404 (an instance without them).
	mu      sync.Mutex
	anchors http.HandlerFunc
	export  http.HandlerFunc
	acct    string
	token   string
}

type lastMail struct {
	mu  sync.Mutex
	msg mail.Message
}

func (l *lastMail) Send(_ context.Context, m mail.Message) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msg = m
	return nil
}

func startRecordsHost(t *testing.T) *recordsHost {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h := &recordsHost{}
	mux := http.NewServeMux()
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	m := &lastMail{}
	acc := account.New(account.Config{Store: st, Mail: m, ConsoleURL: h.srv.URL + "/console/"})
	mux.Handle("/console/", console.New(console.Config{Accounts: acc, ConsoleURL: h.srv.URL + "/console/"}))
	route := func(f func() http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h.mu.Lock()
			hf := f()
			h.mu.Unlock()
			if hf == nil {
				http.Error(w, `{"ok":false,"error":"not found"}`, http.StatusNotFound)
				return
			}
			hf(w, r)
		}
	}
	mux.HandleFunc("GET /v1/anchors", route(func() http.HandlerFunc { return h.anchors }))
	mux.HandleFunc("GET /v1/accounts/{id}/audit/export", route(func() http.HandlerFunc { return h.export }))

	// A session, signed in with the mailed code; its cookie is the
	// console's.
	ctx := context.Background()
	if _, err := acc.StartLogin(ctx, "ana@example.org", true, "test"); err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`\b(\d{6})\b`).FindStringSubmatch(m.msg.Text)[1]
	tok, _, a, err := acc.VerifyLogin(ctx, "ana@example.org", code)
	if err != nil {
		t.Fatal(err)
	}
	h.acct, h.token = a.ID, tok
	h.b = newBrowser(t, h.srv.URL+"/console/")
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(h.srv.URL + "/console/")
	jar.SetCookies(u, []*http.Cookie{{Name: "mesh_console_session", Value: tok, Path: "/console/"}})
	h.b.hc.Jar = jar
	return h
}

func (h *recordsHost) set(anchors, export http.HandlerFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.anchors, h.export = anchors, export
}

// The Records page lists the anchors GET /v1/anchors answers, newest
// first, with their links, and says so plainly when the route is not
// there or lists none.
func TestConsoleRecordsAnchors(t *testing.T) {
	h := startRecordsHost(t)
	page := h.b.get("records")
	if page.status != 200 || !strings.Contains(page.body, `<p id="anchors-note">This mesh publishes no anchors yet.</p>`) ||
		!strings.Contains(page.body, `href="/console/records/audit-export"`) ||
		!strings.Contains(page.body, `curl -H "Authorization: Bearer amt_…" `+h.srv.URL+"/v1/accounts/"+h.acct+"/audit/export") {
		t.Fatalf("records without anchors: %d\n%s", page.status, page.body)
	}
	h.set(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"ok":true,"anchors":[]}`)
	}, nil)
	if page := h.b.get("records"); !strings.Contains(page.body, "No anchor has been made yet") {
		t.Errorf("an empty list:\n%s", page.body)
	}
	h.set(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"ok":true,"anchors":[
			{"date":"2026-03-01","root":"r1","status":"stamped","document":"/v1/anchors/2026-03-01/document","proof_url":"https://tsa.example/p1"},
			{"date":"2026-03-02","root":"r2","status":"failed","links":{"document":"/v1/anchors/2026-03-02/document","evil":"javascript:alert(1)"}}]}`)
	}, nil)
	page = h.b.get("records")
	rows := regexp.MustCompile(`(?s)<tr>\s*<td data-label="Date">([^<]+)</td>.*?</tr>`).FindAllStringSubmatch(page.body, -1)
	if len(rows) != 2 || rows[0][1] != "2026-03-02" || rows[1][1] != "2026-03-01" {
		t.Fatalf("anchor rows: %v\n%s", rows, page.body)
	}
	for _, want := range []string{`state-failed">failed`, `<a href="/v1/anchors/2026-03-02/document">document</a>`,
		`<a href="/v1/anchors/2026-03-01/document">document</a>, <a href="https://tsa.example/p1">proof</a>`} {
		if !strings.Contains(page.body, want) {
			t.Errorf("the anchors table lacks %s", want)
		}
	}
	if strings.Contains(page.body, "javascript:") {
		t.Error("a link that is not http(s) or a path was rendered")
	}
}

// The download is the export route's answer, fetched with the session's
// own token, as a file; a route that is not there, or that refuses,
// leaves the Records page with one sentence saying so.
func TestConsoleRecordsExport(t *testing.T) {
	h := startRecordsHost(t)
	a := h.b.get("records/audit-export")
	if a.status != http.StatusNotFound || alert(a) != "The audit export is not available on this instance yet." {
		t.Fatalf("without the route: %d %q", a.status, alert(a))
	}
	var gotAuth, gotPath string
	h.set(nil, func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotPath = r.Header.Get("Authorization"), r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"manifest":{"account":"x"},"rows":[]}`)
	})
	a = h.b.get("records/audit-export")
	if a.status != 200 || a.body != `{"manifest":{"account":"x"},"rows":[]}` ||
		a.header.Get("Content-Disposition") != fmt.Sprintf(`attachment; filename="audit-%s-%s.json"`, h.acct, time.Now().UTC().Format("2006-01-02")) {
		t.Fatalf("download: %d %v\n%s", a.status, a.header, a.body)
	}
	if gotAuth != "Bearer "+h.token || gotPath != "/v1/accounts/"+h.acct+"/audit/export" {
		t.Errorf("the export was asked for as %q at %q", gotAuth, gotPath)
	}
	h.set(nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"ok":false,"error":"the audit chains cannot be read now; retry shortly"}`)
	})
	a = h.b.get("records/audit-export")
	if a.status != http.StatusServiceUnavailable || alert(a) != "The audit export could not be made: the audit chains cannot be read now; retry shortly." {
		t.Errorf("a refusal: %d %q", a.status, alert(a))
	}
}
