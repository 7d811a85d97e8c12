package terraform

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/routes"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/workers"
)

const (
	runtimeEmail   = "${google_service_account.runtime.email}"
	schedulerEmail = "${google_service_account.scheduler.email}"
)

// Every reference in every file (var.x, local.x, type.name, data.t.n,
// module.x, depends_on entries) names something declared in the module.
func TestEveryReferenceResolves(t *testing.T) {
	m := loadModule(t)
	if len(m.refs) < 100 {
		t.Fatalf("found only %d references: the walk is broken", len(m.refs))
	}
	for _, r := range m.refs {
		if !m.resolves(r.ref) {
			t.Errorf("%s: %s does not resolve to any declaration", r.file, r.ref)
		}
	}
	// The checker itself: a made-up name must not resolve.
	for _, bogus := range []string{"var.nope", "local.nope", "google_compute_network.nope", "data.google_x.nope", "module.nope"} {
		if m.resolves(bogus) {
			t.Errorf("the checker resolves %s", bogus)
		}
	}
}

// Every route row has exactly one function (its entry point, the runtime
// account); every row on the public host exactly one serverless NEG, one
// backend service, an allUsers invoker and one URL-map rule; every
// scheduled row a scheduler job and an invoker for the scheduler's account
// only, and nothing on the public host. Nothing else exists.
func TestRoutesAreDeployed(t *testing.T) {
	m := loadModule(t)
	rows := routes.All()
	fns := m.resources["google_cloudfunctions2_function"]
	byEntry := map[string]string{}
	for name, fn := range fns {
		entry := str(fn, "build_config", "entry_point")
		if prev, ok := byEntry[entry]; ok {
			t.Errorf("functions %s and %s both run entry point %q", prev, name, entry)
		}
		byEntry[entry] = name
		if got := str(fn, "service_config", "service_account_email"); got != runtimeEmail {
			t.Errorf("function %s runs as %q, not the runtime account", name, got)
		}
		if str(fn, "build_config", "source", "storage_source", "object") != "${google_storage_bucket_object.source.name}" {
			t.Errorf("function %s is not built from the one source zip", name)
		}
	}
	if len(fns) != len(rows) {
		t.Errorf("%d functions for %d route rows", len(fns), len(rows))
	}

	negs := m.resources["google_compute_region_network_endpoint_group"]
	backends := m.resources["google_compute_backend_service"]
	invokers := m.resources["google_cloud_run_service_iam_member"]
	jobs := m.resources["google_cloud_scheduler_job"]
	rules := urlMapRules(t, m)

	countWhere := func(set map[string]map[string]any, keys []string, want string) []string {
		var names []string
		for name, r := range set {
			if str(r, keys...) == want {
				names = append(names, name)
			}
		}
		return names
	}

	public, scheduled := 0, 0
	for _, rt := range rows {
		fn, ok := byEntry[rt.EntryPoint]
		if !ok {
			t.Errorf("route %s (%s) has no function", rt.EntryPoint, rt.Pattern())
			continue
		}
		fnRef := "google_cloudfunctions2_function." + fn
		ingress := str(fns[fn], "service_config", "ingress_settings")
		neg := countWhere(negs, []string{"cloud_function", "function"}, "${"+fnRef+".name}")
		inv := countWhere(invokers, []string{"service"}, "${"+fnRef+".name}")
		if rt.Auth.Kind == api.AuthScheduled {
			scheduled++
			if len(neg) != 0 {
				t.Errorf("scheduled route %s has a NEG on the public host", rt.EntryPoint)
			}
			if ingress != "ALLOW_INTERNAL_ONLY" {
				t.Errorf("scheduled route %s admits %s traffic", rt.EntryPoint, ingress)
			}
			if len(inv) != 1 || str(invokers[inv[0]], "member") != "serviceAccount:"+schedulerEmail {
				t.Errorf("scheduled route %s: want exactly one invoker, the scheduler's account; got %v", rt.EntryPoint, inv)
			}
			var js []string
			for name, j := range jobs {
				uri := str(j, "http_target", "uri")
				if strings.HasPrefix(uri, "${"+fnRef+".") {
					js = append(js, name)
					if !strings.HasSuffix(uri, rt.Path) || str(j, "http_target", "http_method") != rt.Method ||
						str(j, "http_target", "oidc_token", "service_account_email") != schedulerEmail {
						t.Errorf("job %s does not call %s as the scheduler's account: %v", name, rt.Pattern(), get(j, "http_target"))
					}
				}
			}
			if len(js) != 1 {
				t.Errorf("scheduled route %s has %d scheduler jobs, want 1", rt.EntryPoint, len(js))
			}
			continue
		}
		public++
		if ingress != "ALLOW_INTERNAL_AND_GCLB" {
			t.Errorf("route %s admits %s traffic: only the load balancer may reach it", rt.EntryPoint, ingress)
		}
		if len(inv) != 1 || str(invokers[inv[0]], "member") != "allUsers" {
			t.Errorf("route %s: want exactly one allUsers invoker (the application authenticates), got %v", rt.EntryPoint, inv)
		}
		if len(neg) != 1 {
			t.Errorf("route %s has %d NEGs, want 1", rt.EntryPoint, len(neg))
			continue
		}
		be := countWhere(backends, []string{"backend", "group"}, "${google_compute_region_network_endpoint_group."+neg[0]+".id}")
		if len(be) != 1 {
			t.Errorf("route %s has %d backend services, want 1", rt.EntryPoint, len(be))
			continue
		}
		var matching []map[string]any
		for _, r := range rules {
			if str(r, "service") == "${google_compute_backend_service."+be[0]+".id}" {
				matching = append(matching, r)
			}
		}
		if len(matching) != 1 {
			t.Errorf("route %s has %d URL-map rules, want 1", rt.EntryPoint, len(matching))
			continue
		}
		checkMatch(t, rt, get(matching[0], "match_rules"))
	}
	if len(negs) != public || len(backends) != public || len(rules) != public {
		t.Errorf("%d NEGs, %d backend services and %d URL-map rules for %d public routes", len(negs), len(backends), len(rules), public)
	}
	if len(jobs) != scheduled {
		t.Errorf("%d scheduler jobs for %d scheduled routes", len(jobs), scheduled)
	}
	if len(invokers) != len(rows) {
		t.Errorf("%d invoker bindings for %d functions", len(invokers), len(rows))
	}
}

// urlMapRules is the route rules of the generated URL map; the only other
// URL map is the plain-HTTP redirect, which routes nothing.
func urlMapRules(t *testing.T, m *module) []map[string]any {
	t.Helper()
	maps := m.resources["google_compute_url_map"]
	if names := sortedNames(maps); !slices.Equal(names, []string{"mesh", "redirect"}) {
		t.Fatalf("URL maps %v, want the generated mesh and the redirect", names)
	}
	if blocks(maps["redirect"], "path_matcher") != nil || blocks(maps["redirect"], "host_rule") != nil {
		t.Error("the redirect URL map routes requests")
	}
	if got := str(m.resources["google_compute_target_https_proxy"]["mesh"], "url_map"); got != "${google_compute_url_map.mesh.id}" {
		t.Errorf("the HTTPS proxy serves %q, not the generated URL map", got)
	}
	var rules []map[string]any
	for _, pm := range blocks(maps["mesh"], "path_matcher") {
		rules = append(rules, blocks(pm, "route_rules")...)
	}
	return rules
}

// checkMatch holds a URL-map match to its row: the path (or prefix) and
// the method.
func checkMatch(t *testing.T, rt api.Route, match any) {
	t.Helper()
	path := regexp.MustCompile(`\{([^}=]+)=\*\*\}`).ReplaceAllString(str(match, "path_template_match"), "{$1...}")
	path = regexp.MustCompile(`\{([^}=]+)=\*\}`).ReplaceAllString(path, "{$1}")
	if path == "" {
		path = str(match, "full_path_match") + str(match, "prefix_match")
	}
	if path != rt.Path {
		t.Errorf("route %s: the URL map matches %q, the row is %q", rt.EntryPoint, path, rt.Path)
	}
	method := str(match, "header_matches", "exact_match")
	if re := str(match, "header_matches", "regex_match"); re != "" {
		if !regexp.MustCompile(re).MatchString(rt.Method) {
			t.Errorf("route %s: method match %q does not admit %s", rt.EntryPoint, re, rt.Method)
		}
		method = rt.Method
	}
	if method != rt.Method {
		t.Errorf("route %s: the URL map matches method %q, the row %q", rt.EntryPoint, method, rt.Method)
	}
	if rt.Method != "" && str(match, "header_matches", "header_name") != ":method" {
		t.Errorf("route %s: the method is not matched on :method", rt.EntryPoint)
	}
}

// The grants chain: the runtime account, and only it, may mint tokens for
// the deployer; the deployer holds nothing in this project.
func TestDeployerChain(t *testing.T) {
	m := loadModule(t)
	if _, ok := m.resources["google_service_account"]["deployer"]; !ok {
		t.Fatal("no deployer service account")
	}
	grants := 0
	for name, r := range m.resources["google_service_account_iam_member"] {
		if str(r, "service_account_id") != "${google_service_account.deployer.name}" {
			continue
		}
		grants++
		if str(r, "role") != "roles/iam.serviceAccountTokenCreator" || str(r, "member") != "serviceAccount:"+runtimeEmail {
			t.Errorf("%s grants %q on the deployer to %q; only TokenCreator to the runtime account is expected", name, str(r, "role"), str(r, "member"))
		}
	}
	if grants != 1 {
		t.Errorf("%d grants on the deployer, want exactly the runtime's TokenCreator", grants)
	}
	for _, typ := range []string{"google_service_account_iam_binding", "google_service_account_iam_policy"} {
		if len(m.resources[typ]) > 0 {
			t.Errorf("%s would overwrite who may impersonate an account; use google_service_account_iam_member", typ)
		}
	}
	for name, r := range m.resources["google_project_iam_member"] {
		if strings.Contains(str(r, "member"), "google_service_account.deployer") {
			t.Errorf("%s gives the deployer a project role", name)
		}
	}
	if !slices.Contains(apis(t, m), "iamcredentials.googleapis.com") {
		t.Error("iamcredentials.googleapis.com, which the impersonation chain calls, is not enabled")
	}
}

func apis(t *testing.T, m *module) []string {
	t.Helper()
	src, err := os.ReadFile("main.tf")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`"([a-z0-9]+\.googleapis\.com)"`).FindAllStringSubmatch(string(src), -1) {
		out = append(out, m[1])
	}
	return out
}

// Least privilege: no project-wide Editor or Owner (nor a policy that
// replaces the project's), secrets are read one by one, and no secret
// value is ever in Terraform.
func TestLeastPrivilegeAndNoSecretValues(t *testing.T) {
	m := loadModule(t)
	for _, typ := range []string{"google_project_iam_policy", "google_project_iam_binding"} {
		if len(m.resources[typ]) > 0 {
			t.Errorf("%s replaces grants made outside this module; use google_project_iam_member", typ)
		}
	}
	for name, r := range m.resources["google_project_iam_member"] {
		role := str(r, "role")
		if strings.HasPrefix(role, "${") {
			role = "" // a for_each: the roles are in its set, checked below
		}
		for _, bad := range []string{"roles/editor", "roles/owner", "roles/secretmanager.", "roles/iam.serviceAccountTokenCreator", "roles/iam.serviceAccountUser"} {
			if strings.HasPrefix(role, bad) || strings.Contains(fmt.Sprint(r["for_each"]), bad) {
				t.Errorf("google_project_iam_member.%s grants %s project-wide", name, bad)
			}
		}
	}
	for name, r := range m.resources["google_secret_manager_secret_iam_member"] {
		if str(r, "role") != "roles/secretmanager.secretAccessor" {
			t.Errorf("secret grant %s is %q, want roles/secretmanager.secretAccessor", name, str(r, "role"))
		}
		if !strings.HasPrefix(str(r, "secret_id"), "${google_secret_manager_secret.mesh[") {
			t.Errorf("secret grant %s is not on one of the mesh's secrets: %q", name, str(r, "secret_id"))
		}
	}
	if n := len(m.resources["google_secret_manager_secret_version"]); n > 0 {
		t.Errorf("%d google_secret_manager_secret_version resources: secret values are added by meshd cloud init, never by Terraform (they would be in its state)", n)
	}
	for typ, byName := range m.resources {
		for name, body := range byName {
			walk(body, func(key string, v any) {
				if key == "secret_data" || key == "secret_data_wo" || key == "payload" {
					t.Errorf("%s.%s holds literal secret data in %q", typ, name, key)
				}
			})
		}
	}
}

func walk(v any, f func(key string, v any)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			f(k, x)
			walk(x, f)
		}
	case []any:
		for _, x := range v {
			walk(x, f)
		}
	}
}

// workerBinaries are the worker mains in the tree: ./workers/cmd/<name>-worker
// (or, before that move, ./workers/<name>/cmd/<name>-worker).
func workerBinaries(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, pattern := range []string{"../workers/cmd/*-worker", "../workers/*/cmd/*-worker"} {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				names = append(names, strings.TrimSuffix(filepath.Base(d), "-worker"))
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Every worker binary runs as a Cloud Run service with CPU always
// allocated, at least one copy, its own account, the bus's private
// addresses, and read access to exactly its credential and the services
// seed, which it reads through the Secret Manager API.
func TestWorkersAreDeployed(t *testing.T) {
	m := loadModule(t)
	bins := workerBinaries(t)
	if len(bins) == 0 {
		t.Fatal("no worker mains found under ../workers")
	}
	services := m.resources["google_cloud_run_v2_service"]
	if len(services) != len(bins) {
		t.Errorf("%d Cloud Run services for %d worker binaries %v", len(services), len(bins), bins)
	}
	for _, name := range bins {
		svc, ok := services["worker_"+name]
		if !ok {
			t.Errorf("worker %s has no Cloud Run service", name)
			continue
		}
		tmpl := get(svc, "template")
		c := get(tmpl, "containers")
		if img := str(c, "image"); !strings.Contains(img, "/"+name+"-worker:") {
			t.Errorf("worker %s runs image %q", name, img)
		}
		if get(c, "resources", "cpu_idle") != false {
			t.Errorf("worker %s: CPU is not always allocated", name)
		}
		if n, _ := get(tmpl, "scaling", "min_instance_count").(float64); n < 1 {
			t.Errorf("worker %s keeps %v copies at rest, want at least 1", name, n)
		}
		if got := str(tmpl, "service_account"); got != "${google_service_account.worker_"+name+".email}" {
			t.Errorf("worker %s runs as %q, not its own account", name, got)
		}
		env := map[string]string{}
		for _, e := range blocks(c, "env") {
			env[str(e, "name")] = str(e, "value")
		}
		// The worker reads its keys through the Secret Manager API (as
		// the functions do), so nothing is mounted as a file.
		if env["MESH_NATS_URL"] != "${local.nats_internal_urls}" || env["MESH_SECRETS_PROJECT"] != "${var.project}" {
			t.Errorf("worker %s environment %v", name, env)
		}
		if v := blocks(tmpl, "volumes"); len(v) != 0 {
			t.Errorf("worker %s mounts volumes %v: its keys are read through the API", name, v)
		}
	}
	// Each worker's account reads exactly its credential and the seed; the
	// rooms worker (workers.ReadsTrust) the four trust seeds as well.
	trustSeeds := []string{cloudsecrets.OperatorSeed, cloudsecrets.SystemAccountSeed, cloudsecrets.AccountSeed, cloudsecrets.AccountSigningSeed}
	for name, r := range m.resources["google_secret_manager_secret_iam_member"] {
		w, ok := strings.CutPrefix(name, "worker_")
		if !ok {
			continue
		}
		w, _, _ = strings.Cut(w, "_") // worker names have no '_'
		if str(r, "member") != "serviceAccount:${google_service_account.worker_"+w+".email}" {
			t.Errorf("%s grants to %q", name, str(r, "member"))
		}
		secret := str(r, "secret_id")
		own := []string{"mesh-worker-" + w + "-creds", "mesh-services-seed"}
		if workers.ReadsTrust(w) {
			own = append(own, trustSeeds...)
		}
		if !slices.ContainsFunc(own, func(s string) bool { return secret == `${google_secret_manager_secret.mesh["`+s+`"].id}` }) {
			t.Errorf("worker %s may read %s", w, secret)
		}
	}
}

// The function environment has what functions/cloud requires.
func TestFunctionEnvironment(t *testing.T) {
	src, err := os.ReadFile("main.tf")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"GOOGLE_CLOUD_PROJECT", "MESH_SECRETS_PROJECT", "MESH_CONTROL_URL", "MESH_CONSOLE_URL", "MESH_NATS_URLS", "MESH_NATS_INTERNAL_URLS", "MESH_WS_URLS",
		"SMTP_ADDR", "SMTP_FROM", "MESH_TRUSTED_PROXY_HOPS", "MESH_DEPLOYER_SA"} {
		if !regexp.MustCompile(`(?m)^\s+` + k + `\s+=`).Match(src) {
			t.Errorf("local.function_env does not set %s", k)
		}
	}
	if regexp.MustCompile(`(?m)^\s+SMTP_PASSWORD\s+=\s+var\.`).Match(src) {
		t.Error("SMTP_PASSWORD comes from a variable: it would be in the state; it comes from the mesh-smtp-password secret")
	}
}

// Terraform's own configuration loader accepts the module (both syntaxes,
// block structure, depends_on, duplicate names), when a terraform binary
// is installed. `terraform providers` reads the whole configuration
// without a provider or the network; the copy drops the GCS backend, which
// would need init. Schemas are not checked: that needs the provider.
func TestTerraformLoadsModule(t *testing.T) {
	bin, err := exec.LookPath("terraform")
	if err != nil {
		t.Skip("no terraform binary on PATH")
	}
	dir := t.TempDir()
	files, _ := filepath.Glob("*.tf*")
	files = append(files, "nats-startup.sh")
	backend := regexp.MustCompile(`(?s)\n  backend "gcs" \{.*?\n  \}\n`)
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "versions.tf" {
			if !backend.Match(src) {
				t.Fatal("versions.tf has no gcs backend block to drop; update this test")
			}
			src = backend.ReplaceAll(src, []byte("\n"))
		}
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-chdir="+dir, "providers", "-no-color")
	cmd.Env = append(os.Environ(), "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hashicorp/google") {
		t.Fatalf("terraform providers: %v\n%s", err, out)
	}
}

// The default timestamp authorities, made into MESH_TIMESTAMP_AUTHORITIES as
// main.tf does, are what functions/cloud reads: two or more, each with a
// root certificate.
func TestTimestampAuthorities(t *testing.T) {
	src, err := os.ReadFile("variables.tf")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)variable "timestamp_authorities" \{.*?\n\}`).Find(src)
	entries := regexp.MustCompile(`\{ name = "([^"]+)", url = "([^"]+)", root_pem_file = "([^"]+)" \}`).FindAllSubmatch(block, -1)
	var cfgs []audit.AuthorityConfig
	for _, e := range entries {
		pem, err := os.ReadFile(string(e[3]))
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, audit.AuthorityConfig{Name: string(e[1]), URL: string(e[2]), RootPEM: string(pem)})
	}
	data, err := json.Marshal(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	as, err := audit.ParseAuthorities(data)
	if err != nil || len(as) < audit.MinAuthorities {
		t.Fatalf("%d authorities: %v", len(as), err)
	}
	for _, a := range as {
		if !a.Root.IsCA || a.Root.CheckSignatureFrom(a.Root) != nil {
			t.Errorf("%s: %s is not a self-signed root", a.Name, a.Root.Subject)
		}
	}
	if main, _ := os.ReadFile("main.tf"); !regexp.MustCompile(`(?m)^\s+MESH_TIMESTAMP_AUTHORITIES\s+=`).Match(main) {
		t.Error("local.function_env does not set MESH_TIMESTAMP_AUTHORITIES")
	}
}
