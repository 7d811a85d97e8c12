package mesh

import (
	"os/exec"
	"strings"
	"testing"
)

// The dependency rules of DESIGN §2, checked on what each entry point
// really links: functions never link the NATS server; the adapter never
// links Firestore or the Functions Framework; the protocol core links no
// cloud SDK and no broker.
func TestLinkedPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is slow-ish; skipped in -short")
	}
	for _, c := range []struct {
		pkgs      string
		forbidden []string
	}{
		{"./functions/...", []string{"github.com/nats-io/nats-server"}},
		{".", []string{"github.com/nats-io/nats-server"}},
		{"./adapter/...", []string{"cloud.google.com/go/firestore", "github.com/GoogleCloudPlatform/functions-framework-go"}},
		{"./shared/protocol/...", []string{"cloud.google.com/", "github.com/nats-io/nats-server", "github.com/GoogleCloudPlatform/"}},
		{"./shared/errs/...", []string{"cloud.google.com/", "github.com/nats-io/"}},
	} {
		out, err := exec.Command("go", "list", "-deps", c.pkgs).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "matched no packages") {
				continue // the entry point does not exist yet
			}
			t.Fatalf("go list %s: %v\n%s", c.pkgs, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range c.forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s links %s, which DESIGN §2 forbids", c.pkgs, dep)
				}
			}
		}
	}
}
