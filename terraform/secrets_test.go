package terraform

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/cloudsecrets"
)

// The secret containers Terraform makes are the ones `meshd cloud init`
// fills (cloudsecrets.Secrets, plus one credential per worker), and the
// runtime account reads exactly the seeds the functions load: the two
// lists cannot drift apart.
func TestSecretsAreTheOnesCloudInitFills(t *testing.T) {
	b, err := os.ReadFile("secrets.tf")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	m := regexp.MustCompile(`(?s)seed_secrets = \[(.*?)\]`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("secrets.tf has no local.seed_secrets list")
	}
	var seeds []string
	for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(m[1], -1) {
		seeds = append(seeds, q[1])
	}
	var want []string
	for _, s := range cloudsecrets.Secrets {
		switch s.Kind {
		case cloudsecrets.TrustSeed, cloudsecrets.KeySeed:
			want = append(want, s.Name)
		default:
			if !strings.Contains(src, `"`+s.Name+`"`) {
				t.Errorf("secrets.tf makes no container %s", s.Name)
			}
		}
	}
	slices.Sort(seeds)
	slices.Sort(want)
	if !slices.Equal(seeds, want) {
		t.Errorf("local.seed_secrets (what the runtime reads) = %v, cloudsecrets loads %v", seeds, want)
	}
	if !strings.Contains(src, `"mesh-worker-${w}-creds"`) || cloudsecrets.WorkerCredsSecret("w") != "mesh-worker-w-creds" {
		t.Errorf("worker credential containers: secrets.tf and cloudsecrets.WorkerCredsSecret disagree")
	}
}
