package devenv_test

import (
	"bytes"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/routes"
)

// The route table is the single source for meshd's mux and the Cloud
// Function entry points: it is well formed (api.Check: unique entry points
// and patterns), every public row is mounted on meshd's mux (it answers
// JSON, or HTML for a page route, and not the mux's own 404 or 405), no
// scheduled job is (meshd runs them from a ticker; the public host never
// serves them), and the table takes in every function group.
func TestRouteTablesAgree(t *testing.T) {
	all := routes.All()
	if err := api.Check(all); err != nil {
		t.Fatal(err)
	}
	c := startCP(t)
	for _, rt := range all {
		path := strings.NewReplacer("{id}", "acct_x", "{kind}", "register", "{token}", "t", "{key}", "k", "{app}", "a",
			"{handle...}", "nobody.x@example.org").Replace(rt.Path)
		req, _ := http.NewRequest(rt.Method, c.base+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rt.Auth.Kind == api.AuthScheduled {
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("job %s answered %d on the public mux: %s", rt.EntryPoint, resp.StatusCode, body)
			}
			continue
		}
		// Every route answers JSON, except the HTML pages (the console and
		// the card page, its 404 too); the mux's own 404 and 405 are JSON
		// too, but say there is no such route.
		want := "application/json"
		if rt.HTML {
			want = "text/html"
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, want) {
			t.Errorf("%s answered %d %q: not mounted", rt.Pattern(), resp.StatusCode, ct)
		}
		if resp.StatusCode == http.StatusMethodNotAllowed || bytes.Contains(body, []byte("there is no route")) {
			t.Errorf("%s answered %d %s: not mounted", rt.Pattern(), resp.StatusCode, body)
		}
	}

	// The table takes in every group under functions/ (api, cloud and
	// routes are shared code, not groups).
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "functions", "routes", "routes.go"), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]bool{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		imported[p] = true
	}
	dirs, err := os.ReadDir(filepath.Join("..", "functions"))
	if err != nil {
		t.Fatal(err)
	}
	groups := 0
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "api" || d.Name() == "cloud" || d.Name() == "routes" {
			continue
		}
		groups++
		if !imported["agentmesh.dev/mesh/functions/"+d.Name()] {
			t.Errorf("functions/routes does not take in functions/%s: its rows would be neither mounted nor deployed", d.Name())
		}
	}
	if groups == 0 {
		t.Fatal("no function groups found under functions/")
	}
}
