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

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/httpx"
)

// The route tables are the single source for meshd's mux and the Cloud
// Function entry points: entry points and patterns are unique, every route
// is mounted (it answers JSON, or HTML for a page route, and not the mux's
// own 404 or 405), and deploy.go imports every function group so each
// entry point is registered.
func TestRouteTablesAgree(t *testing.T) {
	entry, pattern := map[string]bool{}, map[string]bool{}
	var all []httpx.Route
	for _, g := range devenv.Groups {
		for _, rt := range g.Routes {
			if entry[rt.EntryPoint] {
				t.Errorf("entry point %s is declared twice", rt.EntryPoint)
			}
			if pattern[rt.Pattern()] {
				t.Errorf("route %s is declared twice", rt.Pattern())
			}
			entry[rt.EntryPoint], pattern[rt.Pattern()] = true, true
			all = append(all, rt)
		}
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

	// deploy.go blank-imports every group under functions/ (api and cloud
	// are shared code, not groups).
	root := filepath.Join("..", "..")
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, "deploy.go"), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]bool{}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		imported[p] = true
	}
	dirs, err := os.ReadDir(filepath.Join(root, "functions"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "api" || d.Name() == "cloud" {
			continue
		}
		if !imported["agentmesh.dev/mesh/functions/"+d.Name()] {
			t.Errorf("deploy.go does not import functions/%s: its entry points would not be deployed", d.Name())
		}
	}
	if len(devenv.Groups) != len(dirs)-2 {
		t.Errorf("meshd mounts %d groups, functions/ has %d", len(devenv.Groups), len(dirs)-2)
	}
}
