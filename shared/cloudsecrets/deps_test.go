package cloudsecrets

import (
	"os/exec"
	"strings"
	"testing"
)

// The package is linked by meshd, the functions and the worker binaries:
// it must not bring the broker, Firestore or the functions framework with it
// (DESIGN §2). Each rule must match something the module does link, or it
// guards nothing.
func TestLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is slow-ish; skipped in -short")
	}
	forbidden := map[string]string{
		"github.com/nats-io/nats-server/":                       "the functions never link the broker",
		"cloud.google.com/go/firestore":                         "meshd never links Firestore",
		"github.com/GoogleCloudPlatform/functions-framework-go": "meshd never links the functions framework",
	}
	deps := func(pkgs ...string) []string {
		out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", pkgs, err, out)
		}
		return strings.Fields(string(out))
	}
	all := deps("agentmesh.dev/mesh/...")
	for prefix := range forbidden {
		found := false
		for _, d := range all {
			found = found || strings.HasPrefix(d, prefix)
		}
		if !found {
			t.Errorf("rule %q matches nothing the module links", prefix)
		}
	}
	for _, pkg := range []string{"agentmesh.dev/mesh/shared/cloudsecrets", "agentmesh.dev/mesh/shared/cloudsecrets/secretfake"} {
		for _, d := range deps(pkg) {
			for prefix, why := range forbidden {
				if strings.HasPrefix(d, prefix) {
					t.Errorf("%s links %s: %s", pkg, d, why)
				}
			}
		}
	}
}
