package mesh

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// depRule forbids what a set of packages may link, in tailscale's deptest
// shape: forbidden package (or path prefix) → why.
type depRule struct {
	pkgs      string
	forbidden map[string]string
}

// The dependency rules of DESIGN §2, checked on what each entry point
// really links (go list -deps, without tests).
var depRules = []depRule{
	{"./cmd/meshd", map[string]string{
		"cloud.google.com/go/firestore":                         "meshd keeps its documents in bbolt; Firestore is the cloud's",
		"github.com/GoogleCloudPlatform/functions-framework-go": "only deploy.go registers Cloud Functions",
	}},
	{"./adapter/...", map[string]string{
		"cloud.google.com/go":   "the adapter runs on laptops and talks only HTTP and NATS",
		"google.golang.org/api": "the adapter links none of the cloud stack",
		"github.com/GoogleCloudPlatform/functions-framework-go": "the adapter is not a Cloud Function",
		"github.com/go-webauthn/webauthn":                       "passkeys are the console's, in the browser",
		"github.com/nats-io/nats-server/v2":                     "the adapter is a client; it never embeds the broker",
	}},
	{"./workers/...", map[string]string{
		"cloud.google.com/go/firestore":                         "workers keep their state on the bus",
		"github.com/GoogleCloudPlatform/functions-framework-go": "workers run on Cloud Run, not as functions",
		"github.com/go-webauthn/webauthn":                       "passkeys are the console's",
	}},
	{"./cmd/audit-verify", map[string]string{
		"github.com/nats-io/nats-server/v2": "the offline verifier of audit exports embeds no broker",
		"cloud.google.com/go":               "the offline verifier of audit exports links none of the cloud stack",
	}},
	{"./functions/...", map[string]string{
		"github.com/nats-io/nats-server/v2": "functions reach the managed cluster as clients",
	}},
	{".", map[string]string{
		"github.com/nats-io/nats-server/v2": "the function source links no broker",
	}},
	{"./shared/protocol/...", map[string]string{
		"cloud.google.com/go":               "the protocol core is shared with the adapter",
		"github.com/nats-io/nats-server/v2": "the protocol core is shared with the adapter",
		"github.com/GoogleCloudPlatform":    "the protocol core is shared with the adapter",
	}},
	{"./shared/...", map[string]string{
		"agentmesh.dev/mesh/devenv":    "the domain never depends on the composition root (DESIGN §2: dependencies point one way)",
		"agentmesh.dev/mesh/functions": "the domain never depends on the HTTP adapters",
		"agentmesh.dev/mesh/workers":   "the domain never depends on the worker table",
	}},
	{"./shared/errs/...", map[string]string{
		"cloud.google.com/go": "the error table is shared by everything",
		"github.com/nats-io":  "the error table is shared by everything",
	}},
}

func goListDeps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return strings.Fields(string(out))
}

// matches reports whether pkg is pattern or below it.
func matches(pkg, pattern string) bool {
	return pkg == pattern || strings.HasPrefix(pkg, strings.TrimSuffix(pattern, "/")+"/")
}

func TestDependencyRules(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is slow-ish; skipped in -short")
	}
	// A rule whose pattern matches nothing the module links anywhere is
	// stale or misspelt, and would pass forever: it fails.
	everything := goListDeps(t, "./...")
	for _, r := range depRules {
		for f := range r.forbidden {
			found := false
			for _, p := range everything {
				if matches(p, f) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("rule for %s forbids %s, which nothing in the module links: a stale or misspelt rule", r.pkgs, f)
			}
		}
	}
	for _, r := range depRules {
		bad := map[string][]string{}
		for _, p := range goListDeps(t, r.pkgs) {
			for f := range r.forbidden {
				if matches(p, f) {
					bad[f] = append(bad[f], p)
				}
			}
		}
		fs := make([]string, 0, len(bad))
		for f := range bad {
			fs = append(fs, f)
		}
		sort.Strings(fs)
		for _, f := range fs {
			t.Errorf("%s links %s (%s): %s", r.pkgs, f, strings.Join(bad[f][:min(3, len(bad[f]))], ", "), r.forbidden[f])
		}
	}
}

// The matcher is what keeps the rules honest; check its edges.
func TestDependencyRuleMatch(t *testing.T) {
	for _, c := range []struct {
		pkg, pattern string
		want         bool
	}{
		{"cloud.google.com/go/firestore", "cloud.google.com/go/firestore", true},
		{"cloud.google.com/go/firestore/apiv1", "cloud.google.com/go/firestore", true},
		{"cloud.google.com/go/firestorex", "cloud.google.com/go/firestore", false},
		{"github.com/nats-io/nats.go", "github.com/nats-io", true},
		{"github.com/nats-io/nats-server/v2/server", "github.com/nats-io/nats-server/v2", true},
		{"github.com/nats-io/nats.go", "github.com/nats-io/nats-server/v2", false},
	} {
		if got := matches(c.pkg, c.pattern); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.pkg, c.pattern, got, c.want)
		}
	}
}
