package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/routes"
	"agentmesh.dev/mesh/shared/httpx"
)

// The committed files are what the tables generate today: a route added,
// removed or changed without regenerating fails here, naming the command.
func TestCommittedFilesAreCurrent(t *testing.T) {
	files, err := Files(routes.All(), workerRows())
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("generated %d files, want routes.tf.json and workers.tf.json", len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", "terraform", name))
		if err != nil {
			t.Errorf("terraform/%s: %v; run `go generate ./terraform`", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("terraform/%s differs from what the route and worker tables generate (first difference at line %d); run `go generate ./terraform` and commit the result",
				name, firstDifference(got, want))
		}
	}
}

func firstDifference(a, b []byte) int {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

// Two runs give the same bytes (map order never leaks into the output).
func TestDeterministic(t *testing.T) {
	a, err := Files(routes.All(), workerRows())
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b, err := Files(routes.All(), workerRows())
		if err != nil {
			t.Fatal(err)
		}
		for name := range a {
			if !bytes.Equal(a[name], b[name]) {
				t.Fatalf("%s changed between two runs", name)
			}
		}
	}
}

// urlMapRule is a route rule of the generated URL map, as the load
// balancer reads it.
type urlMapRule struct {
	Priority   int    `json:"priority"`
	Service    string `json:"service"`
	MatchRules []struct {
		FullPath      string `json:"full_path_match"`
		Prefix        string `json:"prefix_match"`
		PathTemplate  string `json:"path_template_match"`
		HeaderMatches []struct {
			Name  string `json:"header_name"`
			Exact string `json:"exact_match"`
			Regex string `json:"regex_match"`
		} `json:"header_matches"`
	} `json:"match_rules"`
}

func generatedURLMap(t *testing.T, rows []api.Route) (rules []urlMapRule, defaultService string) {
	t.Helper()
	files, err := Files(rows, workerRows())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Resource struct {
			URLMap map[string]struct {
				DefaultService string `json:"default_service"`
				PathMatcher    []struct {
					DefaultService string       `json:"default_service"`
					RouteRules     []urlMapRule `json:"route_rules"`
				} `json:"path_matcher"`
			} `json:"google_compute_url_map"`
		} `json:"resource"`
	}
	if err := json.Unmarshal(files["routes.tf.json"], &doc); err != nil {
		t.Fatal(err)
	}
	m, ok := doc.Resource.URLMap["mesh"]
	if !ok || len(m.PathMatcher) != 1 {
		t.Fatalf("want one URL map \"mesh\" with one path matcher, got %+v", doc.Resource.URLMap)
	}
	rules = m.PathMatcher[0].RouteRules
	slices.SortFunc(rules, func(a, b urlMapRule) int { return a.Priority - b.Priority })
	for i := 1; i < len(rules); i++ {
		if rules[i].Priority == rules[i-1].Priority {
			t.Fatalf("two route rules share priority %d", rules[i].Priority)
		}
	}
	return rules, m.PathMatcher[0].DefaultService
}

// lbRoute is the backend the load balancer picks for a request: the first
// rule by priority whose match holds, else the default service. It follows
// the URL map's documented semantics: a full path is compared whole, a
// prefix as a prefix, and in a path template "*" or {x=*} takes one
// non-empty segment and "**" or {x=**} the rest of the path.
func lbRoute(t *testing.T, rules []urlMapRule, def, method, path string) string {
	t.Helper()
	for _, r := range rules {
		for _, m := range r.MatchRules {
			ok := false
			switch {
			case m.FullPath != "":
				ok = path == m.FullPath
			case m.Prefix != "":
				ok = strings.HasPrefix(path, m.Prefix)
			case m.PathTemplate != "":
				ok = templateMatches(m.PathTemplate, path)
			}
			for _, h := range m.HeaderMatches {
				if h.Name != ":method" {
					t.Fatalf("unexpected header match %q", h.Name)
				}
				switch {
				case h.Exact != "":
					ok = ok && method == h.Exact
				case h.Regex != "":
					ok = ok && regexp.MustCompile(h.Regex).MatchString(method)
				}
			}
			if ok {
				return r.Service
			}
		}
	}
	return def
}

func templateMatches(template, path string) bool {
	ts, ps := strings.Split(strings.TrimPrefix(template, "/"), "/"), strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, seg := range ts {
		switch {
		case seg == "**" || strings.HasSuffix(seg, "=**}"):
			return i == len(ts)-1 && len(ps) > i
		case i >= len(ps):
			return false
		case seg == "*" || strings.HasSuffix(seg, "=*}"):
			if ps[i] == "" {
				return false
			}
		case seg != ps[i]:
			return false
		}
	}
	return len(ts) == len(ps)
}

// samplePath fills a ServeMux pattern path with values for its wildcards.
func samplePath(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if name, ok := strings.CutPrefix(s, "{"); ok {
			name = strings.TrimSuffix(name, "}")
			if strings.HasSuffix(name, "...") {
				segs[i] = "alice.bob@example.org/more"
			} else {
				segs[i] = "sample-" + name
			}
		}
	}
	out := strings.Join(segs, "/")
	if strings.HasSuffix(out, "/") {
		out += "page"
	}
	return out
}

// The URL map sends each row's request to that row's function, exactly as
// meshd's ServeMux does, and a scheduled row's request never reaches its
// function from the public host.
func TestURLMapAgreesWithServeMux(t *testing.T) { checkAgainstServeMux(t, routes.All()) }

// Overlapping patterns, which the table does not have today, are ordered
// as ServeMux orders them: the more specific one first.
func TestURLMapOrdersOverlaps(t *testing.T) {
	h := api.Handler(func(*api.Deps) httpx.HandlerFunc { return nil })
	checkAgainstServeMux(t, []api.Route{
		{EntryPoint: "Console", Path: "/console/", Handler: h},
		{EntryPoint: "CardPage", Method: http.MethodGet, Path: "/a/{handle...}", Handler: h},
		{EntryPoint: "ConsoleLogin", Method: http.MethodPost, Path: "/console/login", Handler: h},
		{EntryPoint: "Health", Method: http.MethodGet, Path: "/v1/health", Handler: h},
		{EntryPoint: "Special", Method: http.MethodGet, Path: "/a/special", Handler: h},
		{EntryPoint: "Item", Method: http.MethodGet, Path: "/x/{id}/{item}", Handler: h},
		{EntryPoint: "Items", Method: http.MethodGet, Path: "/x/{id}/items", Handler: h},
		{EntryPoint: "Page", Method: http.MethodGet, Path: "/x/{id}/items/{rest...}", Handler: h},
	})
}

func checkAgainstServeMux(t *testing.T, rows []api.Route) {
	t.Helper()
	rules, def := generatedURLMap(t, rows)
	mux := http.NewServeMux()
	for _, rt := range rows {
		mux.HandleFunc(rt.Pattern(), func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Row", rt.EntryPoint) })
	}
	backendOf := func(rt api.Route) string { return "${google_compute_backend_service." + resourceName(rt) + ".id}" }
	public := 0
	for _, rt := range rows {
		methods := []string{rt.Method}
		switch rt.Method {
		case "":
			methods = []string{http.MethodGet, http.MethodPost, http.MethodDelete}
		case http.MethodGet:
			methods = []string{http.MethodGet, http.MethodHead}
		}
		path := samplePath(rt.Path)
		for _, method := range methods {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
			if got := rec.Header().Get("X-Row"); got != rt.EntryPoint {
				t.Fatalf("test is wrong: the mux sends %s %s to %q, not %s", method, path, got, rt.EntryPoint)
			}
			got := lbRoute(t, rules, def, method, path)
			if rt.Auth.Kind == api.AuthScheduled {
				if got != def {
					t.Errorf("%s %s (scheduled) reaches %s from the public host", method, path, got)
				}
				continue
			}
			if want := backendOf(rt); got != want {
				t.Errorf("%s %s: the load balancer sends it to %s, meshd's mux to %s", method, path, got, want)
			}
		}
		if rt.Auth.Kind != api.AuthScheduled {
			public++
		}
	}
	if len(rules) != public {
		t.Errorf("%d route rules for %d public rows", len(rules), public)
	}
	// Something no row answers goes to the default, which answers 404.
	if got := lbRoute(t, rules, def, http.MethodGet, "/no/such/route"); got != def {
		t.Errorf("an unknown path went to %s", got)
	}
}

func TestMatchRule(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         string // JSON of the match
		err          bool
	}{
		{"GET", "/v1/health", `{"full_path_match":"/v1/health","header_matches":[{"header_name":":method","regex_match":"^(GET|HEAD)$"}]}`, false},
		{"POST", "/v1/accounts/{id}/apps", `{"header_matches":[{"exact_match":"POST","header_name":":method"}],"path_template_match":"/v1/accounts/{id=*}/apps"}`, false},
		{"GET", "/a/{handle...}", `{"header_matches":[{"header_name":":method","regex_match":"^(GET|HEAD)$"}],"path_template_match":"/a/{handle=**}"}`, false},
		{"", "/console/", `{"prefix_match":"/console/"}`, false},
		{"DELETE", "/x/{$}", `{"full_path_match":"/x/","header_matches":[{"exact_match":"DELETE","header_name":":method"}]}`, false},
		{"GET", "/a/{rest...}/b", ``, true},
		{"GET", "/a/x{y}", ``, true},
		{"GET", "/{a}/{b}/{c}/{d}/{e}/{f}", ``, true},
	} {
		m, _, err := matchRule(api.Route{EntryPoint: "X", Method: c.method, Path: c.path})
		if c.err {
			if err == nil {
				t.Errorf("%s %s: want an error, got %v", c.method, c.path, m)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %s: %v", c.method, c.path, err)
			continue
		}
		b, _ := json.Marshal(m)
		if string(b) != c.want {
			t.Errorf("%s %s:\n got %s\nwant %s", c.method, c.path, b, c.want)
		}
	}
}

func TestSchedule(t *testing.T) {
	for _, c := range []struct {
		every time.Duration
		want  string
	}{
		{time.Minute, "* * * * *"},
		{10 * time.Minute, "*/10 * * * *"},
		{30 * time.Minute, "*/30 * * * *"},
		{time.Hour, "0 * * * *"},
		{6 * time.Hour, "0 */6 * * *"},
		{24 * time.Hour, "0 0 * * *"},
		{7 * time.Minute, ""},
		{90 * time.Second, ""},
		{5 * time.Hour, ""},
		{48 * time.Hour, ""},
		{0, ""},
	} {
		got, err := schedule(c.every)
		if c.want == "" {
			if err == nil {
				t.Errorf("%s: want an error, got %q", c.every, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.every, got, err, c.want)
		}
	}
}

// A worker that reads the trust chain (the rooms worker) is granted the
// four trust seeds beside its credential and the services seed, and its
// service waits for those grants; every other worker gets its two only.
func TestTrustWorkerReadsTheTrustSeeds(t *testing.T) {
	out, err := workerConfig([]Worker{{Name: "rooms", MinInstances: 1, MaxInstances: 1, Trust: true},
		{Name: "feeds", MinInstances: 1, MaxInstances: 1}})
	if err != nil {
		t.Fatal(err)
	}
	res := out["resource"].(tf)
	access := res["google_secret_manager_secret_iam_member"].(tf)
	readBy := map[string][]string{}
	for name, g := range access {
		w := strings.Split(strings.TrimPrefix(name, "worker_"), "_")[0]
		readBy[w] = append(readBy[w], g.(tf)["secret_id"].(string))
	}
	for _, secret := range []string{"mesh-worker-rooms-creds", "mesh-services-seed", "mesh-operator-seed", "mesh-system-account-seed",
		"mesh-account-seed", "mesh-account-signing-seed"} {
		if !slices.Contains(readBy["rooms"], "${"+secretRef(secret)+".id}") {
			t.Errorf("the rooms worker may not read %s", secret)
		}
	}
	if len(readBy["rooms"]) != 6 || len(readBy["feeds"]) != 2 {
		t.Errorf("grants %v", readBy)
	}
	deps := res["google_cloud_run_v2_service"].(tf)["worker_rooms"].(tf)["depends_on"].([]string)
	if len(deps) != 7 || !slices.Contains(deps, "google_secret_manager_secret_iam_member.worker_rooms_trust0") {
		t.Errorf("the rooms service depends on %v", deps)
	}
}

func TestWorkerTableChecked(t *testing.T) {
	for _, bad := range [][]Worker{
		{{Name: "Registry", MinInstances: 1, MaxInstances: 1}},
		{{Name: "registry", MinInstances: 1, MaxInstances: 1}, {Name: "registry", MinInstances: 1, MaxInstances: 1}},
		{{Name: "registry", MinInstances: 0, MaxInstances: 1}},
		{{Name: "registry", MinInstances: 2, MaxInstances: 1}},
		{{Name: "rooms", MinInstances: 1, MaxInstances: 1, Env: map[string]string{"MESH_NATS_URL": "nats://elsewhere"}}},
		{{Name: "rooms", MinInstances: 1, MaxInstances: 1, Env: map[string]string{"PATH": "/tmp"}}},
	} {
		if _, err := workerConfig(bad); err == nil {
			t.Errorf("%+v: want an error", bad)
		}
	}
}

// A table without the default row, or with a job the scheduler cannot
// run, generates nothing.
func TestRouteTableChecked(t *testing.T) {
	h := api.Handler(func(*api.Deps) httpx.HandlerFunc { return nil })
	health := api.Route{EntryPoint: "Health", Method: http.MethodGet, Path: "/v1/health", Handler: h}
	if _, err := routeConfig([]api.Route{{EntryPoint: "Other", Method: http.MethodGet, Path: "/x", Handler: h}}); err == nil {
		t.Error("a table without the Health row generated a URL map without a default")
	}
	job := api.Route{EntryPoint: "Odd", Method: http.MethodPost, Path: "/jobs/odd", Auth: api.Scheduled(7 * time.Minute), Handler: h}
	if _, err := routeConfig([]api.Route{health, job}); err == nil {
		t.Error("a job every 7 minutes got a cron schedule")
	}
}
