package grant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// googleErr is an error as the clients return it: a status with an
// ErrorInfo, wrapped by apierror.
func googleErr(c codes.Code) error {
	st, _ := status.New(c, "the message").WithDetails(&errdetails.ErrorInfo{Reason: "R", Domain: "iam.googleapis.com"})
	if ae, ok := apierror.FromError(st.Err()); ok {
		return ae
	}
	return st.Err()
}

// The classification of the token call, code by code: a 403 or 404 is the
// customer's revocation only when the one more question about our own hop
// succeeded; if that failed it is our side; anything else is unreachable.
// Only the code decides, never the ErrorInfo reason.
func TestJudgeImpersonation(t *testing.T) {
	g := Grant{ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com"}
	d := "mesh-deployer@mesh-prod.iam.gserviceaccount.com"
	for _, tc := range []struct {
		err, own error
		state    State
		word     string
	}{
		{googleErr(codes.PermissionDenied), nil, Revoked, "roles/iam.serviceAccountTokenCreator"},
		{googleErr(codes.NotFound), nil, Revoked, "was not found"},
		{googleErr(codes.PermissionDenied), googleErr(codes.PermissionDenied), Unreachable, "Our side"},
		{googleErr(codes.NotFound), googleErr(codes.NotFound), Unreachable, "Our side"},
		{googleErr(codes.PermissionDenied), googleErr(codes.Unavailable), Unreachable, "Our side"},
		{fmt.Errorf("wrapped: %w", googleErr(codes.PermissionDenied)), nil, Revoked, "binding"},
		{googleErr(codes.Unavailable), nil, Unreachable, "UNAVAILABLE"},
		{googleErr(codes.Unauthenticated), nil, Unreachable, "UNAUTHENTICATED"},
		{googleErr(codes.InvalidArgument), nil, Unreachable, "INVALID_ARGUMENT"},
		{googleErr(codes.ResourceExhausted), nil, Unreachable, "RESOURCE_EXHAUSTED"},
		{context.DeadlineExceeded, nil, Unreachable, "DEADLINE_EXCEEDED"},
		{errors.New("dial tcp: connection refused"), nil, Unreachable, "UNKNOWN"},
	} {
		v := judgeImpersonation(g, d, tc.err, tc.own)
		if v.state != tc.state || !strings.Contains(v.lastError, tc.word) {
			t.Errorf("%v (own hop %v): %s %q, want %s saying %q", tc.err, tc.own, v.state, v.lastError, tc.state, tc.word)
		}
		if v.state == Unreachable && tc.own != nil && !strings.Contains(v.lastError, d) {
			t.Errorf("our hop's failure does not name our deployer: %q", v.lastError)
		}
	}
}

// The project read: verified only when it succeeds, names the project
// recorded and carries the label naming this mesh account; anything else
// is unreachable, never revoked.
func TestJudgeProjectRead(t *testing.T) {
	const acct = "acct_0123456789abcdef0123456789abcdef"
	g := Grant{AccountID: acct, ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com"}
	ours := map[string]string{ProjectLabel: acct, "env": "prod"}
	for _, tc := range []struct {
		answered string
		labels   map[string]string
		err      error
		state    State
		word     string
	}{
		{"acme-agents", ours, nil, Verified, ""},
		{"acme-agents", nil, nil, Unreachable, "gcloud projects update acme-agents --update-labels=agentmesh-grant=" + acct},
		{"acme-agents", map[string]string{"env": "prod"}, nil, Unreachable, "has no label agentmesh-grant"},
		{"acme-agents", map[string]string{ProjectLabel: "acct_eve"}, nil, Unreachable, `names another mesh account ("acct_eve")`},
		{"acme-agents", map[string]string{ProjectLabel: strings.ToUpper(acct)}, nil, Unreachable, "--update-labels=agentmesh-grant=" + acct},
		{"other-project", ours, nil, Unreachable, `"other-project"`},
		{"", ours, nil, Unreachable, "instead"},
		{"", nil, googleErr(codes.PermissionDenied), Unreachable, "roles/browser"},
		{"", nil, googleErr(codes.NotFound), Unreachable, "NOT_FOUND"},
		{"", nil, googleErr(codes.Unavailable), Unreachable, "retries on its own"},
		{"", nil, context.DeadlineExceeded, Unreachable, "DEADLINE_EXCEEDED"},
	} {
		v := judgeProjectRead(g, tc.answered, tc.labels, tc.err)
		if v.state != tc.state || !strings.Contains(v.lastError, tc.word) || (v.state == Verified) != (v.lastError == "") {
			t.Errorf("%q %v: %s %q, want %s saying %q", tc.answered, tc.err, v.state, v.lastError, tc.state, tc.word)
		}
	}
}

// Every account id maps to a valid label value: ours as they are, any
// other through the documented hash.
func TestLabelValue(t *testing.T) {
	if got := LabelValue("acct_0123456789abcdef0123456789abcdef"); got != "acct_0123456789abcdef0123456789abcdef" {
		t.Errorf("an account id changed: %q", got)
	}
	for _, id := range []string{"ACCT_X", "acct.x", "", strings.Repeat("a", 64), "Ünïcode"} {
		got := LabelValue(id)
		if !labelValueRE.MatchString(got) || !strings.HasPrefix(got, "h-") || got == LabelValue(id+"x") {
			t.Errorf("LabelValue(%q) = %q", id, got)
		}
	}
}

func TestRecheckWait(t *testing.T) {
	for failures, want := range map[int]time.Duration{0: RecheckEvery, 1: RecheckEvery, 2: 2 * RecheckEvery, 3: 4 * RecheckEvery,
		7: 64 * RecheckEvery, 8: MaxRecheckWait, 1000: MaxRecheckWait} {
		if got := recheckWait(failures); got != want {
			t.Errorf("recheckWait(%d) = %v, want %v", failures, got, want)
		}
	}
}

// CheckRequest accepts exactly the accounts a customer can create in the
// project named.
// isServiceAgent matches Google's agents precisely: an account a user can
// create, such as service-bot@, is not one.
func TestIsServiceAgent(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		agent bool
	}{
		{"service-bot@p-123456.iam.gserviceaccount.com", false},
		{"service-account@p-123456.iam.gserviceaccount.com", false},
		{"service-12a@p-123456.iam.gserviceaccount.com", false},
		{"mesh-agent@acme-agents.iam.gserviceaccount.com", false},
		{"mesh-agent@example.org", false},
		{"mesh-agent@notgserviceaccount.com", false},
		{"service-123456789@p-123456.iam.gserviceaccount.com", true},
		{"service-123456789@gcp-sa-run.iam.gserviceaccount.com", true},
		{"mesh-agent@gcp-sa-aiplatform.iam.gserviceaccount.com", true},
		{"123456789@p-123456.iam.gserviceaccount.com", true},
		{"123456789-compute@p-123456.iam.gserviceaccount.com", true},
		{"123456789@cloudservices.gserviceaccount.com", true},
		{"123456789@cloudbuild.gserviceaccount.com", true},
		{"123456789-compute@developer.gserviceaccount.com", true},
		{"acme-agents@appspot.gserviceaccount.com", true},
		{"acme-agents@system.gserviceaccount.com", true},
	} {
		local, domain, _ := strings.Cut(tc.addr, "@")
		if got := isServiceAgent(local, domain); got != tc.agent {
			t.Errorf("isServiceAgent(%s) = %v, want %v", tc.addr, got, tc.agent)
		}
	}
	// The door accepts service-bot as the customer's own account.
	if _, err := CheckRequest(Request{Provider: "gcp", ProjectID: "p-123456", ServiceAccount: "service-bot@p-123456.iam.gserviceaccount.com"}); err != nil {
		t.Errorf("service-bot refused: %v", err)
	}
	if _, err := CheckRequest(Request{Provider: "gcp", ProjectID: "p-123456", ServiceAccount: "service-42@p-123456.iam.gserviceaccount.com"}); err == nil ||
		!strings.Contains(err.Error(), "service agent") {
		t.Errorf("service-42 accepted, or not as a service agent: %v", err)
	}
}

func TestCheckRequest(t *testing.T) {
	ok := []Request{
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "a12345", ServiceAccount: "abcdef@a12345.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "  MESH-AGENT@ACME-AGENTS.IAM.GSERVICEACCOUNT.COM\n"},
	}
	for _, r := range ok {
		if _, err := CheckRequest(r); err != nil {
			t.Errorf("%+v refused: %v", r, err)
		}
	}
	bad := []Request{
		{Provider: "GCP", ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com"},
		{Provider: "", ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme", ServiceAccount: "mesh-agent@acme.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents-", ServiceAccount: "mesh-agent@acme-agents-.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "abc@acme-agents.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com@x"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "@acme-agents.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "mesh-agent@acme-agents.iam.gserviceaccount.com.evil.org"},
		{Provider: "gcp", ProjectID: "gcp-sa-run", ServiceAccount: "service-1234@gcp-sa-run.iam.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "acme-agents@system.gserviceaccount.com"},
		{Provider: "gcp", ProjectID: "acme-agents", ServiceAccount: "1234567-compute@developer.gserviceaccount.com"},
	}
	for _, r := range bad {
		if _, err := CheckRequest(r); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}

// FuzzCheckRequest: the door never panics, and what it accepts is an
// account of the project named, in normal form, which the door accepts
// again unchanged.
func FuzzCheckRequest(f *testing.F) {
	f.Add("gcp", "acme-agents", "mesh-agent@acme-agents.iam.gserviceaccount.com")
	f.Add("gcp", "acme-agents", "1-compute@developer.gserviceaccount.com")
	f.Add("gcp", "acme-agents", "service-1@gcp-sa-x.iam.gserviceaccount.com")
	f.Add("aws", "", "")
	f.Add("gcp", "a:b", "x@y@z")
	f.Fuzz(func(t *testing.T, provider, project, sa string) {
		r, err := CheckRequest(Request{Provider: provider, ProjectID: project, ServiceAccount: sa})
		if err != nil {
			return
		}
		if r.Provider != ProviderGCP || !strings.HasSuffix(r.ServiceAccount, "@"+r.ProjectID+iamDomain) || r.ServiceAccount != strings.ToLower(r.ServiceAccount) {
			t.Fatalf("accepted %+v", r)
		}
		again, err := CheckRequest(r)
		if err != nil || again != r {
			t.Fatalf("not stable: %+v → %+v %v", r, again, err)
		}
	})
}

// CheckDeploy refuses what Cloud Run or Secret Manager would, before any
// key is minted.
func TestCheckDeploy(t *testing.T) {
	good := DeployRequest{Name: "helper", Region: "europe-west1", Image: "europe-west1-docker.pkg.dev/acme-agents/agents/helper:1",
		Bucket: "acme-state", ModelAPIKey: "sk-1"}
	if r, err := CheckDeploy(good); err != nil || r.ModelAPIKeyEnv != DefaultModelKeyEnv {
		t.Fatalf("%+v %v", r, err)
	}
	for name, mut := range map[string]func(r *DeployRequest){
		"name upper":      func(r *DeployRequest) { r.Name = "Helper" },
		"name long":       func(r *DeployRequest) { r.Name = strings.Repeat("a", 31) },
		"region":          func(r *DeployRequest) { r.Region = "europe" },
		"image spaces":    func(r *DeployRequest) { r.Image = "x/y z" },
		"image no repo":   func(r *DeployRequest) { r.Image = "ubuntu" },
		"bucket gs://":    func(r *DeployRequest) { r.Bucket = "gs://acme-state" },
		"no model key":    func(r *DeployRequest) { r.ModelAPIKey = " " },
		"model key lines": func(r *DeployRequest) { r.ModelAPIKey = "a\nb" },
		"env MESH_":       func(r *DeployRequest) { r.ModelAPIKeyEnv = "MESH_AGENT_KEY" },
		"env lower":       func(r *DeployRequest) { r.ModelAPIKeyEnv = "model" },
	} {
		r := good
		mut(&r)
		if _, err := CheckDeploy(r); err == nil {
			t.Errorf("%s: accepted %+v", name, r)
		} else if strings.Contains(err.Error(), r.ModelAPIKey) && r.ModelAPIKey != "" && len(r.ModelAPIKey) > 2 {
			t.Errorf("%s: the refusal repeats the model key: %v", name, err)
		}
	}
}

// docs/grant-roles.md is the role list the route serves, generated from
// Roles; a difference fails with the way to regenerate it.
func TestRolesDocIsGenerated(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "grant-roles.md")
	want := RolesMarkdown()
	if os.Getenv("UPDATE_GRANT_ROLES") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("docs/grant-roles.md differs from shared/grant.Roles; regenerate it with UPDATE_GRANT_ROLES=1 go test ./shared/grant -run TestRolesDocIsGenerated")
	}
	// The customer's guide gives the same commands, word for word.
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "grants.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append((Setup{}).Commands(), (Setup{}).RevokeCommand()) {
		if !strings.Contains(string(guide), c+"\n") {
			t.Errorf("docs/grants.md lacks the command\n%s", c)
		}
	}
	page := string(RolesHTML("mesh-deployer@mesh-prod.iam.gserviceaccount.com"))
	for _, r := range Roles {
		if !strings.Contains(page, r.Role) {
			t.Errorf("the page lacks %s", r.Role)
		}
	}
	if !strings.Contains(page, "--member serviceAccount:mesh-deployer@mesh-prod.iam.gserviceaccount.com --role roles/iam.serviceAccountTokenCreator") {
		t.Error("the page does not fill the deployer into the grant command")
	}
}

// The setup's steps, as the console's Cloud page shows them, are the
// commands in their order, filled in; the last step is the one binding
// that names the mesh.
func TestSetupSteps(t *testing.T) {
	s := Setup{ProjectID: "acme-agents", Account: "mesh-agent", Deployer: "mesh-deployer@mesh-prod.iam.gserviceaccount.com",
		Region: "europe-west1", Bucket: "acme-agents-mesh-state", Repository: "agents", MeshAccount: "acct_0123456789abcdef0123456789abcdef"}
	steps := s.Steps()
	var flat []string
	for _, st := range steps {
		if st.Title == "" || len(st.Commands) == 0 {
			t.Errorf("empty step %+v", st)
		}
		flat = append(flat, st.Commands...)
	}
	if !slices.Equal(flat, s.Commands()) {
		t.Errorf("the steps are not the commands:\n%q\n%q", flat, s.Commands())
	}
	if len(steps) != 4 || !slices.Equal(steps[3].Commands, []string{s.GrantCommand(), s.LabelCommand()}) {
		t.Fatalf("steps %+v", steps)
	}
	if want := "gcloud projects update acme-agents --update-labels=agentmesh-grant=acct_0123456789abcdef0123456789abcdef"; s.LabelCommand() != want {
		t.Errorf("label command %q, want %q", s.LabelCommand(), want)
	}
	for _, c := range flat {
		for _, ph := range []string{"PROJECT_ID", "ACCOUNT", "REGION", "BUCKET", "REPOSITORY", "DEPLOYER"} {
			if strings.Contains(c, ph) {
				t.Errorf("placeholder %s left in %q", ph, c)
			}
		}
	}
}
