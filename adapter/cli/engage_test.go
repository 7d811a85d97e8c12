package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/engagement"
)

// The mistakes engage refuses before it signs or sends anything: one line
// on stderr, and exit 2 for a mistake in the command line.
func TestEngageRefusedLocally(t *testing.T) {
	dir := t.TempDir()
	const c, s = "UB4QJ525ZYYEC3LKTXXDGE2BMTCY4Z5KD6JFQRLZBH3LLGLW3MDCGCYE", "UBLCJYGY2DOPALXHYE7R4AUPG2TV5HCD7D7GAKQ5VAX6SHJYHK3ZHVPU"
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"engage"}, 2, "say what to do: show, propose"},
		{[]string{"engage", "frobnicate"}, 2, `unknown engage action "frobnicate"`},
		{[]string{"engage", "deny", c, s, "chat"}, 2, "a denial states its reason"},
		{[]string{"engage", "amend"}, 2, "give one document"},
		{[]string{"engage", "terminate", c, s, "chat", "--for-cause"}, 2, "a termination for cause states its reason"},
		{[]string{"engage", "terminate", c, s, "chat", "--for-cause", "--reason", "  "}, 2, "a termination for cause states its reason"},
		{[]string{"engage", "review", c, s, "chat", "--rejected"}, 2, "a rejection states its reason"},
		{[]string{"engage", "review", c, s, "chat"}, 2, "say --accepted or --rejected"},
		{[]string{"engage", "review", c, s, "chat", "--accepted", "--rejected", "--reason", "r"}, 2, "say --accepted or --rejected"},
		{[]string{"engage", "propose"}, 2, "give one document"},
		{[]string{"engage", "countersign", "a.json", "b.json"}, 2, "give the standing proposal's document"},
		{[]string{"engage", "show", c, s}, 2, "give the client, the seller and the offering"},
		{[]string{"engage", "show", "nobody", s, "chat"}, 2, `"nobody" is neither an agent id`},
		{[]string{"engage", "show", "ana.helper@example.org", s, "chat"}, 2, "resolving the handle ana.helper@example.org needs the registrar"},
		{[]string{"engage", "sign", c, s, "chat"}, 1, "signing needs this adapter's owner key"},
	} {
		var out, errOut bytes.Buffer
		getenv := func(k string) string {
			if k == "MESH_ADAPTER_HOME" {
				return dir
			}
			if k == "MESH_CONTROL_URL" {
				return "http://127.0.0.1:1"
			}
			return ""
		}
		code := Main(tc.args, strings.NewReader(""), &out, &errOut, getenv)
		first, _, _ := strings.Cut(errOut.String(), "\n")
		if code != tc.code || !strings.Contains(first, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

func TestParseInstant(t *testing.T) {
	now := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want string
		bad  bool
	}{
		{in: "now", want: "2026-11-25T04:00:00Z"},
		{in: "90d", want: "2027-02-23T04:00:00Z"},
		{in: "2h", want: "2026-11-25T06:00:00Z"},
		{in: "2027-01-01T00:00:00Z", want: "2027-01-01T00:00:00Z"},
		{in: "soon", bad: true},
		{in: "-1h", bad: true},
	} {
		got, err := parseInstant("--ends-at", tc.in, now)
		if (err != nil) != tc.bad || (!tc.bad && rfc3339(got) != tc.want) {
			t.Errorf("%q: %v %v", tc.in, got, err)
		}
	}
}

// show prints what the record says: an open amendment, amendments with
// their reasons, a convenience notice still running, reviews.
func TestPrintEngagement(t *testing.T) {
	v := &engagement.View{Client: "UC", Seller: "US", Offering: "chat", SowID: "sow_x", State: "amendment_proposed", InForce: true, Version: 2,
		Document: "{}", DocumentSHA256: "abc", Offerings: []string{"chat", "summarize"}, StartsAt: "2026-11-25T04:00:00Z", EndsAt: "2027-02-25T04:00:00Z",
		FormedAt: "2026-11-25T04:00:01Z", Owners: engagement.Owners{Provider: "UPO", Client: "UCO"},
		Clauses: []engagement.Clause{{Path: "scope", Grade: "enforced", Value: "{\n  \"grade\": \"enforced\",\n  \"offerings\": [\"chat\"]\n}"}, {Path: "inputs", Value: "[]"}},
		Open:    &engagement.OpenView{Version: 3, Proposer: "provider", ProposedAt: "2026-11-26T00:00:00Z", LapsesAt: "2026-11-27T00:00:00Z"},
		Amendments: []engagement.HistoryItem{{Kind: "amendment_proposed", At: "2026-11-25T05:00:00Z", Version: 2, Role: "client"},
			{Kind: "amendment_denied", At: "2026-11-25T06:00:00Z", Version: 2, Role: "provider", Reason: "Too many."}},
		Termination: &engagement.TermView{By: "UCO", Role: "client", SignedAt: "2026-11-26T01:00:00Z", EffectiveAt: "2026-11-26T03:00:00Z", InNotice: true},
		Reviews:     []engagement.ReviewView{{Verdict: "accepted", StoredAt: "2026-11-26T00:30:00Z"}}}
	var b bytes.Buffer
	printEngagement(&b, v)
	for _, want := range []string{
		"engagement sow_x, version 2: amendment_proposed (in force)\n",
		"  scope     chat, summarize\n",
		"  scope                      enforced   {\"grade\":\"enforced\",\"offerings\":[\"chat\"]}\n",
		"  inputs                     (no grade) []\n",
		"open amendment: version 3 proposed by the provider at 2026-11-26T00:00:00Z, lapses at 2026-11-27T00:00:00Z\n",
		"  2026-11-25T06:00:00Z  amendment_denied     version 2 by the provider: Too many.\n",
		"termination: for convenience by the client's owner UCO, signed 2026-11-26T01:00:00Z, effective 2026-11-26T03:00:00Z (notice running: still in force)\n",
		"reviews:\n  2026-11-26T00:30:00Z  accepted\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("show lacks %q:\n%s", want, b.String())
		}
	}
}

// record reads every page of the history and the reviews, and asks a
// list that is complete past its end while the other one pages on.
func TestRecordReadsEveryPage(t *testing.T) {
	const histories, reviews = 450, 250
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.RawQuery)
		q := r.URL.Query()
		num := func(k string) int { n, _ := strconv.Atoi(q.Get(k)); return n }
		if num("history_limit") != engagement.MaxPage || num("reviews_limit") != engagement.MaxPage || q.Get("format") != "json" {
			t.Errorf("asked %s", r.URL.RawQuery)
		}
		v := engagement.View{SowID: "sow_x", HistoryTotal: histories, ReviewsTotal: reviews, History: []engagement.HistoryItem{}, Reviews: []engagement.ReviewView{}}
		for i := num("history_after") + 1; i <= histories && i <= num("history_after")+engagement.MaxPage; i++ {
			v.History = append(v.History, engagement.HistoryItem{Seq: i})
			if i%100 == 0 {
				v.Amendments = append(v.Amendments, engagement.HistoryItem{Seq: i})
			}
			v.HistoryNext = i
		}
		if v.HistoryNext >= histories {
			v.HistoryNext = 0
		}
		for i := num("reviews_after") + 1; i <= reviews && i <= num("reviews_after")+engagement.MaxPage; i++ {
			v.Reviews = append(v.Reviews, engagement.ReviewView{Digest: strconv.Itoa(i)})
			v.ReviewsNext = i
		}
		if v.ReviewsNext >= reviews {
			v.ReviewsNext = 0
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "engagement": v})
	}))
	defer srv.Close()
	s := &engageSession{cp: engageCP{base: srv.URL, http: srv.Client()}}
	v, err := s.record(t.Context(), "UC", "US", "chat")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.History) != histories || len(v.Reviews) != reviews || len(v.Amendments) != 4 || v.HistoryNext != 0 || v.ReviewsNext != 0 {
		t.Fatalf("history %d, reviews %d, amendments %d, next %d %d", len(v.History), len(v.Reviews), len(v.Amendments), v.HistoryNext, v.ReviewsNext)
	}
	for i, h := range v.History {
		if h.Seq != i+1 {
			t.Fatalf("history entry %d is seq %d", i, h.Seq)
		}
	}
	for i, r := range v.Reviews {
		if r.Digest != strconv.Itoa(i+1) {
			t.Fatalf("review %d is %s", i, r.Digest)
		}
	}
	if len(asked) != 3 {
		t.Fatalf("asked %d pages: %v", len(asked), asked)
	}
}
