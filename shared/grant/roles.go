package grant

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"regexp"
	"strings"
)

// RolesPath is where the control plane serves the published role list (the
// permissions URL of every grant answer). docs/grant-roles.md is the same
// list, generated from Roles (a test keeps them equal).
const RolesPath = "/v1/cloud/grant-roles"

// Role is one role the customer grants in their own project.
type Role struct {
	Role string
	// On is what the role is granted on.
	On string
	// Member is who receives it: "account" (the customer's service
	// account) or "deployer" (the mesh's deployer).
	Member string
	// Why says what it allows, and who uses it.
	Why string
}

// Roles is the published role list: everything a grant needs in the
// customer's project, and nothing else. The deployer's TokenCreator
// binding is the only one that names the mesh; removing it revokes.
var Roles = []Role{
	{"roles/iam.serviceAccountTokenCreator", "the service account", "deployer",
		"lets the mesh's deployer mint short-lived tokens for the account: the grant itself, and the only binding that names the mesh. Remove it to revoke."},
	{"roles/browser", "the project", "account",
		"reads the project (resourcemanager.projects.get): the check proves the chain reaches the project you named."},
	{"roles/run.developer", "the project", "account",
		"creates and updates the agent's Cloud Run worker pool (run.workerpools.*)."},
	{"roles/iam.serviceAccountUser", "the service account", "account",
		"lets the worker pool run as the account itself (iam.serviceAccounts.actAs); the agent runs with the account's rights and no others."},
	{"roles/secretmanager.admin", "the project", "account",
		"creates the agent's secrets (`mesh-NAME-agent-key`, `mesh-NAME-model-key`) and adds versions. The mesh never reads a secret back. A custom role with secretmanager.secrets.create and secretmanager.versions.add is enough if you prefer it narrower."},
	{"roles/secretmanager.secretAccessor", "the project", "account",
		"lets the running agent read its own key and your model API key at start (the agent reads them, the mesh does not)."},
	{"roles/storage.objectUser", "the state bucket", "account",
		"holds the agent's state directory (its identity and its 30-day credential), so a restart keeps the agent's identity."},
}

// Services are the APIs the customer enables in their project.
var Services = []string{
	"run.googleapis.com", "secretmanager.googleapis.com", "iamcredentials.googleapis.com",
	"cloudresourcemanager.googleapis.com", "artifactregistry.googleapis.com", "storage.googleapis.com",
}

// Setup is one customer's setup, for the exact commands they run. Empty
// fields are shown as placeholders (PROJECT_ID, ...).
type Setup struct {
	ProjectID  string // the customer's project
	Account    string // the account id to create (the part before @), e.g. mesh-agent
	Deployer   string // the mesh's deployer (grant_to)
	Region     string // e.g. europe-west1
	Bucket     string // the state bucket's name
	Repository string // the Artifact Registry repository for the agent's image
	// MeshAccount is the mesh account the grant is for (its id, acct_…):
	// the project's ProjectLabel names it.
	MeshAccount string
}

// ProjectLabel is the label on the customer's project that names the mesh
// account a grant is for (its value is LabelValue of the account id). The
// deployer is shared by every mesh account, so the check requires it: only
// the project's owners can set a label, which proves the grant is this
// account's and not someone naming another customer's service account.
// One project serves one mesh account.
const ProjectLabel = "agentmesh-grant"

// labelValueRE is what Google accepts as a label value (the ASCII part).
var labelValueRE = regexp.MustCompile(`^[a-z0-9_-]{1,63}$`)

// LabelValue is the value of ProjectLabel for a mesh account: the account
// id itself when it is a valid label value (acct_ and 32 lower-case hex
// digits always is); otherwise "h-" and the first 40 hex digits of the
// id's SHA-256, so any id maps to one valid value.
func LabelValue(accountID string) string {
	if labelValueRE.MatchString(accountID) {
		return accountID
	}
	sum := sha256.Sum256([]byte(accountID))
	return "h-" + hex.EncodeToString(sum[:20])
}

func labelCommand(project, value string) string {
	return fmt.Sprintf("gcloud projects update %s --update-labels=%s=%s", project, ProjectLabel, value)
}

// LabelCommand labels the project with the mesh account the grant is for.
func (s Setup) LabelCommand() string {
	v := "MESH_ACCOUNT_ID"
	if s.MeshAccount != "" {
		v = LabelValue(s.MeshAccount)
	}
	return labelCommand(or(s.ProjectID, "PROJECT_ID"), v)
}

func or(v, placeholder string) string {
	if v == "" {
		return placeholder
	}
	return v
}

// ServiceAccount is the address of the account the setup creates.
func (s Setup) ServiceAccount() string {
	return or(s.Account, "ACCOUNT") + "@" + or(s.ProjectID, "PROJECT_ID") + iamDomain
}

// Step is one step of the setup: what it is for, and its commands.
type Step struct {
	Title    string
	Commands []string
}

// Steps are the gcloud commands of the setup in its four steps, in order:
// enable the services; create the account, the repository and the bucket;
// grant the account its roles; and last, the one binding that lets the
// deployer impersonate the account. The console's Cloud page shows them
// step by step; Commands is the same list, flat.
func (s Setup) Steps() []Step {
	p, sa := or(s.ProjectID, "PROJECT_ID"), s.ServiceAccount()
	region, bucket := or(s.Region, "REGION"), or(s.Bucket, "BUCKET")
	member := "serviceAccount:" + sa
	var roles []string
	for _, r := range Roles {
		if r.Member != "account" {
			continue
		}
		switch r.On {
		case "the project":
			roles = append(roles, fmt.Sprintf("gcloud projects add-iam-policy-binding %s --member %s --role %s --condition None", p, member, r.Role))
		case "the service account":
			roles = append(roles, fmt.Sprintf("gcloud iam service-accounts add-iam-policy-binding %s --project %s --member %s --role %s", sa, p, member, r.Role))
		case "the state bucket":
			roles = append(roles, fmt.Sprintf("gcloud storage buckets add-iam-policy-binding gs://%s --member %s --role %s", bucket, member, r.Role))
		}
	}
	return []Step{
		{"The APIs the grant uses", []string{
			fmt.Sprintf("gcloud services enable %s --project %s", strings.Join(Services, " "), p),
		}},
		{"The account the mesh will act as, the repository for your agent's image, and the bucket that keeps the agent's state", []string{
			fmt.Sprintf("gcloud iam service-accounts create %s --project %s --display-name \"agentmesh agent\"", or(s.Account, "ACCOUNT"), p),
			fmt.Sprintf("gcloud artifacts repositories create %s --repository-format docker --location %s --project %s", or(s.Repository, "REPOSITORY"), region, p),
			fmt.Sprintf("gcloud storage buckets create gs://%s --location %s --project %s --uniform-bucket-level-access", bucket, region, p),
		}},
		{"The account's roles", roles},
		{"The grant itself: the only binding that names the mesh, and the label that names your mesh account", []string{s.GrantCommand(), s.LabelCommand()}},
	}
}

// Commands are the gcloud commands of the setup, in order (Steps, flat).
func (s Setup) Commands() []string {
	var out []string
	for _, st := range s.Steps() {
		out = append(out, st.Commands...)
	}
	return out
}

// GrantCommand is the one binding that names the mesh: the deployer may
// mint tokens for the account.
func (s Setup) GrantCommand() string {
	return fmt.Sprintf("gcloud iam service-accounts add-iam-policy-binding %s --project %s --member serviceAccount:%s --role roles/iam.serviceAccountTokenCreator",
		s.ServiceAccount(), or(s.ProjectID, "PROJECT_ID"), or(s.Deployer, "DEPLOYER"))
}

// RevokeCommand removes that binding: the whole of revoking a grant.
func (s Setup) RevokeCommand() string {
	return fmt.Sprintf("gcloud iam service-accounts remove-iam-policy-binding %s --project %s --member serviceAccount:%s --role roles/iam.serviceAccountTokenCreator",
		s.ServiceAccount(), or(s.ProjectID, "PROJECT_ID"), or(s.Deployer, "DEPLOYER"))
}

func memberText(m string) string {
	if m == "deployer" {
		return "the mesh's deployer (DEPLOYER)"
	}
	return "your service account"
}

// RolesMarkdown is docs/grant-roles.md.
func RolesMarkdown() string {
	var b strings.Builder
	b.WriteString("# The roles a cloud grant needs\n\n")
	b.WriteString("<!-- Generated from shared/grant/roles.go (Roles, Services, Setup); `go test ./shared/grant` fails when this file differs. -->\n\n")
	b.WriteString("This is the published role list of the cloud grants: everything the mesh\n" +
		"needs in your Google Cloud project, and nothing else. The control plane serves\n" +
		"it at `" + RolesPath + "` (the `permissions` URL of every grant answer), with the\n" +
		"deployer's address filled in. [grants.md](grants.md) explains the setup, what\n" +
		"the mesh can and cannot do, and how to revoke.\n\n")
	b.WriteString("| role | granted on | to | why |\n|---|---|---|---|\n")
	for _, r := range Roles {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Role, r.On, memberText(r.Member), r.Why)
	}
	b.WriteString("\nServices to enable: " + "`" + strings.Join(Services, "`, `") + "`.\n\n")
	b.WriteString("## The commands\n\nReplace the placeholders (`DEPLOYER` is the `grant_to` of the API's answers\n" +
		"and of the console's Cloud page):\n\n```sh\n")
	for _, c := range (Setup{}).Commands() {
		b.WriteString(c + "\n")
	}
	b.WriteString("```\n\nTo revoke, remove the one binding that names the mesh:\n\n```sh\n" + (Setup{}).RevokeCommand() + "\n```\n")
	return b.String()
}

var rolesPage = template.Must(template.New("roles").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>The roles a cloud grant needs</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top;text-align:left}pre{background:#f4f4f4;padding:1rem;overflow-x:auto}</style>
</head><body>
<h1>The roles a cloud grant needs</h1>
<p>Everything this mesh needs in your Google Cloud project, and nothing else. The mesh's deployer is <code>{{.Deployer}}</code>.</p>
<table><tr><th>role</th><th>granted on</th><th>to</th><th>why</th></tr>
{{range .Roles}}<tr><td><code>{{.Role}}</code></td><td>{{.On}}</td><td>{{if eq .Member "deployer"}}the mesh's deployer{{else}}your service account{{end}}</td><td>{{.Why}}</td></tr>
{{end}}</table>
<p>Services to enable: {{range $i, $s := .Services}}{{if $i}}, {{end}}<code>{{$s}}</code>{{end}}.</p>
<h2>The commands</h2>
<pre>{{range .Commands}}{{.}}
{{end}}</pre>
<p>To revoke, remove the one binding that names the mesh (IAM takes 2–7 minutes to apply it):</p>
<pre>{{.Revoke}}</pre>
</body></html>
`))

// RolesHTML is the page the permissions URL serves: the same list, with
// the deployer's address filled in.
func RolesHTML(deployer string) []byte {
	s := Setup{Deployer: deployer}
	var b bytes.Buffer
	_ = rolesPage.Execute(&b, map[string]any{"Deployer": or(deployer, "DEPLOYER (not configured on this instance)"), "Roles": Roles, "Services": Services,
		"Commands": s.Commands(), "Revoke": s.RevokeCommand()})
	return b.Bytes()
}
