package cloudsecrets

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/cloudsecrets/secretfake"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

const project = "acme-mesh"

var workers = []string{"registry", "presence", "feeds", "tasks", "admission", "activity", "mailbox"}

// world is a fake Secret Manager and the real client connected to it.
type world struct {
	fake   *secretfake.Fake
	client *secretmanager.Client
}

func newWorld(t *testing.T) *world {
	t.Helper()
	f, err := secretfake.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	c, err := f.NewClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &world{fake: f, client: c}
}

// terraform creates every container of the table, as `terraform apply` does.
func (w *world) terraform(t *testing.T) {
	t.Helper()
	table, err := All(workers)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range table {
		w.fake.Create(project, s.Name)
	}
}

func (w *world) init(t *testing.T, o InitOptions) (*InitResult, error) {
	t.Helper()
	if o.Project == "" {
		o.Project = project
	}
	if o.Workers == nil {
		o.Workers = workers
	}
	if o.ResolverDir == "" {
		o.ResolverDir = filepath.Join(t.TempDir(), "accounts")
	}
	return Init(t.Context(), w.client, o)
}

func actions(steps []Step) map[Action]int {
	m := map[Action]int{}
	for _, s := range steps {
		m[s.Action]++
	}
	return m
}

// An empty project gets one version per secret; Load then gives a trust
// chain whose users the NATS servers, configured by the fragment in the
// same secrets, accept; and each worker's creds connect.
func TestInitThenLoad(t *testing.T) {
	w := newWorld(t)
	w.terraform(t)
	var progress []string
	dir := filepath.Join(t.TempDir(), "accounts")
	res, err := w.init(t, InitOptions{MeshName: "acme", ResolverDir: dir, Progress: func(s Step) { progress = append(progress, s.String()) }})
	if err != nil {
		t.Fatal(err)
	}
	n := len(Secrets) + len(workers)
	if got := actions(res.Steps); got[Added] != n || len(res.Steps) != n {
		t.Fatalf("steps %v, want %d added", res.Steps, n)
	}
	if len(progress) != n || progress[0] != OperatorSeed+": added version 1" {
		t.Fatalf("progress %q", progress)
	}
	for _, s := range res.Steps {
		if w.fake.Versions(project, s.Secret) != 1 {
			t.Fatalf("%s has %d versions", s.Secret, w.fake.Versions(project, s.Secret))
		}
	}

	k, err := Load(t.Context(), w.client, project)
	if err != nil {
		t.Fatal(err)
	}
	if k.Trust.PublicKeys() != *res.Trust {
		t.Fatalf("loaded %v, init made %v", k.Trust.PublicKeys(), *res.Trust)
	}
	if k.Registrar == nil || k.Services == nil || k.Export == nil {
		t.Fatal("registrar, services or export key missing")
	}
	// The rooms worker reads the trust chain alone.
	if tr, err := LoadTrust(t.Context(), w.client, project); err != nil || tr.PublicKeys() != *res.Trust {
		t.Fatalf("LoadTrust: %v, %v", tr, err)
	}
	if _, err := LoadTrust(t.Context(), w.client, ""); err == nil {
		t.Fatal("LoadTrust without a project")
	}
	// The seeds are stored as seed files hold them.
	if seed, _ := w.fake.Latest(project, ServicesSeed); !strings.HasPrefix(string(seed), "SU") || !strings.HasSuffix(string(seed), "\n") {
		t.Fatal("the services seed is not stored as a seed line")
	}

	// A server configured by the fragment trusts the loaded operator.
	s, opts := natsServer(t, w, dir)
	if len(opts.TrustedOperators) != 1 || opts.TrustedOperators[0].Subject != res.Trust.Operator || opts.SystemAccount != res.Trust.SystemAccount {
		t.Fatalf("the fragment names operator %v, system %s; init made %+v", opts.TrustedOperators, opts.SystemAccount, *res.Trust)
	}
	// A user minted by the loaded chain connects; one minted by another chain does not.
	u, err := k.Trust.MintServiceUser("probe")
	if err != nil {
		t.Fatal(err)
	}
	connect(t, s.ClientURL(), u)
	other, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.MintServiceUser("stranger")
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.ClientURL(), stranger.NATSOption(), creds.ServiceInbox()); err == nil {
		nc.Close()
		t.Fatal("a user of another operator connected")
	}
	// Each worker's creds, read as the worker reads them, connect too.
	for _, name := range workers {
		wk, err := LoadWorker(t.Context(), w.client, project, name)
		if err != nil {
			t.Fatal(err)
		}
		if wk.Services.Public() != k.Services.Public() {
			t.Fatalf("%s: services key %s, control plane has %s", name, wk.Services.Public(), k.Services.Public())
		}
		uc, err := jwt.DecodeUserClaims(wk.Creds.JWT)
		if err != nil {
			t.Fatal(err)
		}
		if uc.Name != WorkerUser(name) || uc.IssuerAccount != res.Trust.MeshAccount {
			t.Fatalf("%s: user %q of %s", name, uc.Name, uc.IssuerAccount)
		}
		connect(t, s.ClientURL(), wk.Creds)
	}
}

// natsServer starts a nats-server whose configuration includes the
// mesh-nats-config fragment as stored, on a free loopback port.
func natsServer(t *testing.T, w *world, resolverDir string) (*server.Server, *server.Options) {
	t.Helper()
	frag, ok := w.fake.Latest(project, NATSConfig)
	if !ok {
		t.Fatal("no nats config")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mesh-trust.conf"), frag, 0o600); err != nil {
		t.Fatal(err)
	}
	main := "listen: 127.0.0.1:-1\ninclude ./mesh-trust.conf\n"
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("the fragment does not parse: %v", err)
	}
	if opts.AccountResolver == nil {
		t.Fatal("the fragment sets no resolver")
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	// The preloaded account JWTs were stored in the resolver directory.
	if entries, err := os.ReadDir(resolverDir); err != nil || len(entries) == 0 {
		t.Fatalf("resolver dir %s: %v %v", resolverDir, entries, err)
	}
	return s, opts
}

func connect(t *testing.T, url string, u creds.UserCreds) {
	t.Helper()
	nc, err := nats.Connect(url, u.NATSOption(), creds.ServiceInbox())
	if err != nil {
		t.Fatalf("connect as %s: %v", u.Key.Public(), err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// The second run adds nothing and says so for every secret.
func TestInitTwiceChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.terraform(t)
	first, err := w.init(t, InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	adds := w.fake.CountCalls("AddSecretVersion")
	second, err := w.init(t, InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if second.Changed() || actions(second.Steps)[Kept] != len(first.Steps) {
		t.Fatalf("second run: %v", second.Steps)
	}
	if w.fake.CountCalls("AddSecretVersion") != adds || w.fake.CountCalls("CreateSecret") != 0 {
		t.Fatalf("second run wrote: %v", w.fake.Calls())
	}
	if got := second.Steps[0].String(); got != OperatorSeed+": already has version 1; left as is" {
		t.Fatalf("step says %q", got)
	}
	if *second.Trust != *first.Trust {
		t.Fatal("the second run reports another chain")
	}

	// A worker added later gets its creds from the same chain; the rest is kept.
	third, err := w.init(t, InitOptions{Workers: append(slices.Clone(workers), "rooms")})
	if err == nil || !errors.Is(err, ErrNoSecret) || !strings.Contains(err.Error(), WorkerCredsSecret("rooms")) {
		t.Fatalf("a new worker without its container: %v", err)
	}
	third, err = w.init(t, InitOptions{Workers: append(slices.Clone(workers), "rooms"), CreateMissing: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(third.Steps); got[Created] != 1 || got[Added] != 1 || got[Kept] != len(first.Steps) {
		t.Fatalf("new worker: %v", third.Steps)
	}
	wk, err := LoadWorker(t.Context(), w.client, project, "rooms")
	if err != nil {
		t.Fatal(err)
	}
	if uc, _ := jwt.DecodeUserClaims(wk.Creds.JWT); uc.IssuerAccount != first.Trust.MeshAccount {
		t.Fatal("the new worker's creds are of another account")
	}
}

// Some trust seeds present and others not is refused before any write.
func TestHalfInitializedRefused(t *testing.T) {
	t.Run("one seed of another run", func(t *testing.T) {
		w := newWorld(t)
		w.terraform(t)
		op, _ := keys.Generate[keys.OperatorRole]()
		w.fake.Put(project, OperatorSeed, op.Seed())
		_, err := w.init(t, InitOptions{})
		if !errors.Is(err, ErrHalfInitialized) {
			t.Fatalf("err = %v", err)
		}
		for _, name := range []string{OperatorSeed, SystemAccountSeed, AccountSeed, AccountSigningSeed} {
			if !strings.Contains(err.Error(), name) {
				t.Errorf("the error does not name %s: %v", name, err)
			}
		}
		if n := w.fake.CountCalls("AddSecretVersion"); n != 0 {
			t.Fatalf("%d versions added", n)
		}
	})
	t.Run("a seed disabled", func(t *testing.T) {
		w := newWorld(t)
		w.terraform(t)
		if _, err := w.init(t, InitOptions{}); err != nil {
			t.Fatal(err)
		}
		w.fake.SetState(project, AccountSigningSeed, 1, secretmanagerpb.SecretVersion_DISABLED)
		adds := w.fake.CountCalls("AddSecretVersion")
		if _, err := w.init(t, InitOptions{}); !errors.Is(err, ErrHalfInitialized) || !strings.Contains(err.Error(), "enable it again") {
			t.Fatalf("err = %v", err)
		}
		if w.fake.CountCalls("AddSecretVersion") != adds {
			t.Fatal("a version was added")
		}
		// Load says which version to enable.
		if _, err := Load(t.Context(), w.client, project); !errors.Is(err, ErrNotEnabled) || !strings.Contains(err.Error(), AccountSigningSeed) {
			t.Fatalf("load: %v", err)
		}
	})
	t.Run("creds without their chain", func(t *testing.T) {
		w := newWorld(t)
		w.terraform(t)
		other, _ := creds.Generate()
		u, _ := other.MintServiceUser("worker-registry")
		cf, _ := jwt.FormatUserConfig(u.JWT, u.Key.Seed())
		w.fake.Put(project, WorkerCredsSecret("registry"), cf)
		if _, err := w.init(t, InitOptions{}); !errors.Is(err, ErrForeign) || !strings.Contains(err.Error(), WorkerCredsSecret("registry")) {
			t.Fatalf("err = %v", err)
		}
		if n := w.fake.CountCalls("AddSecretVersion"); n != 0 {
			t.Fatalf("%d versions added", n)
		}
	})
}

// What was made from another chain is named, not kept silently.
func TestForeignVersionsRefused(t *testing.T) {
	for _, c := range []struct {
		secret  string
		payload func(t *testing.T, other *creds.Trust) []byte
	}{
		{WorkerCredsSecret("tasks"), func(t *testing.T, other *creds.Trust) []byte {
			u, err := other.MintServiceUser("worker-tasks")
			if err != nil {
				t.Fatal(err)
			}
			cf, err := jwt.FormatUserConfig(u.JWT, u.Key.Seed())
			if err != nil {
				t.Fatal(err)
			}
			return cf
		}},
		{NATSConfig, func(t *testing.T, other *creds.Trust) []byte {
			b, err := ServerConfig(other, DefaultResolverDir, "other")
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
	} {
		t.Run(c.secret, func(t *testing.T) {
			w := newWorld(t)
			w.terraform(t)
			if _, err := w.init(t, InitOptions{}); err != nil {
				t.Fatal(err)
			}
			other, err := creds.Generate()
			if err != nil {
				t.Fatal(err)
			}
			w.fake.Put(project, c.secret, c.payload(t, other))
			if _, err := w.init(t, InitOptions{}); !errors.Is(err, ErrForeign) || !strings.Contains(err.Error(), c.secret) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// A payload that fails its checksum is refused by Load and by Init.
func TestCorruptedChecksumRefused(t *testing.T) {
	w := newWorld(t)
	w.terraform(t)
	if _, err := w.init(t, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	w.fake.Corrupt(project, AccountSigningSeed)
	_, err := Load(t.Context(), w.client, project)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), AccountSigningSeed) {
		t.Fatalf("load: %v", err)
	}
	if _, err := w.init(t, InitOptions{}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("init: %v", err)
	}
	// A worker's creds likewise.
	w.fake.Corrupt(project, WorkerCredsSecret("feeds"))
	if _, err := LoadWorker(t.Context(), w.client, project, "feeds"); !errors.Is(err, ErrChecksum) {
		t.Fatalf("load worker: %v", err)
	}
}

// Each way a secret can be unreadable has its own error naming the secret
// and the remedy.
func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name    string
		arrange func(t *testing.T, w *world)
		kind    error
		says    string
	}{
		{"no container", func(*testing.T, *world) {}, ErrNoSecret, "secret mesh-operator-seed does not exist in project acme-mesh: `terraform apply` creates it"},
		{"no version", func(t *testing.T, w *world) { w.terraform(t) }, ErrNoVersion, "secret mesh-operator-seed has no version: run `meshd cloud init --project acme-mesh`"},
		{"denied", func(t *testing.T, w *world) {
			initialized(t, w)
			w.fake.Deny(project, RegistrarSeed)
		}, ErrDenied, "roles/secretmanager.secretAccessor"},
		{"wrong kind of seed", func(t *testing.T, w *world) {
			initialized(t, w)
			k, _ := keys.Generate[keys.AccountRole]()
			w.fake.Put(project, RegistrarSeed, k.Seed())
		}, ErrBadPayload, "secret mesh-registrar-seed (projects/acme-mesh/secrets/mesh-registrar-seed/versions/2) does not hold the seed it should"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t)
			c.arrange(t, w)
			_, err := Load(t.Context(), w.client, project)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v\nwant %v saying %q", err, c.kind, c.says)
			}
		})
	}
}

// A mesh made before the export seed existed loads without it: only the
// audit export goes without a key until init adds one.
func TestLoadWithoutExportSeed(t *testing.T) {
	made := newWorld(t)
	initialized(t, made)
	for _, withContainer := range []bool{false, true} {
		w := newWorld(t)
		table, err := All(workers)
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range table {
			if sec.Name == ExportSeed {
				if withContainer {
					w.fake.Create(project, sec.Name)
				}
				continue
			}
			data, _ := made.fake.Latest(project, sec.Name)
			w.fake.Create(project, sec.Name)
			w.fake.Put(project, sec.Name, data)
		}
		k, err := Load(t.Context(), w.client, project)
		if err != nil || k.Export != nil || k.Services == nil {
			t.Fatalf("container %v: %+v, %v", withContainer, k, err)
		}
	}
}

// initialized is a project after terraform apply and cloud init.
func initialized(t *testing.T, w *world) {
	t.Helper()
	w.terraform(t)
	if _, err := w.init(t, InitOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A caller without valid credentials is told how to get them.
func TestUnauthenticated(t *testing.T) {
	w := newWorld(t)
	c, err := secretmanager.NewClient(t.Context(), w.fake.ClientOptions("expired")...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = Open(t.Context(), project, w.fake.ClientOptions("expired")...)
	if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "gcloud auth application-default login") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Init(t.Context(), c, InitOptions{Project: project, Workers: workers}); !errors.Is(err, ErrDenied) {
		t.Fatalf("init: %v", err)
	}
}

// Missing containers are named and refused, or created with CreateMissing
// and labelled with the mesh's name; a dry run writes nothing.
func TestMissingContainers(t *testing.T) {
	w := newWorld(t)
	w.fake.Create(project, OperatorSeed)
	_, err := w.init(t, InitOptions{})
	if !errors.Is(err, ErrNoSecret) || !strings.Contains(err.Error(), SystemAccountSeed+", ") || !strings.Contains(err.Error(), "terraform apply") ||
		strings.Contains(err.Error(), OperatorSeed) {
		t.Fatalf("err = %v", err)
	}

	dry, err := w.init(t, InitOptions{DryRun: true, CreateMissing: true})
	if err != nil {
		t.Fatal(err)
	}
	n := len(Secrets) + len(workers)
	if got := actions(dry.Steps); got[WouldCreate] != n-1 || got[WouldAdd] != n || !dry.Changed() || dry.Trust != nil {
		t.Fatalf("dry run: %v", dry.Steps)
	}
	for _, m := range []string{"AddSecretVersion", "CreateSecret", "AccessSecretVersion"} {
		if w.fake.CountCalls(m) != 0 {
			t.Fatalf("the dry run called %s", m)
		}
	}

	res, err := w.init(t, InitOptions{CreateMissing: true, MeshName: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if got := actions(res.Steps); got[Created] != n-1 || got[Added] != n {
		t.Fatalf("steps: %v", res.Steps)
	}
	if got := w.fake.Labels(project, ServicesSeed)["mesh"]; got != "acme" {
		t.Fatalf("label mesh = %q", got)
	}
	if _, err := Load(t.Context(), w.client, project); err != nil {
		t.Fatal(err)
	}
}

// A dry run over an initialized project reads and checks, and writes nothing.
func TestDryRunChecks(t *testing.T) {
	w := newWorld(t)
	w.terraform(t)
	if _, err := w.init(t, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	w.fake.Corrupt(project, RegistrarSeed)
	adds := w.fake.CountCalls("AddSecretVersion")
	if _, err := w.init(t, InitOptions{DryRun: true}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("dry run: %v", err)
	}
	if w.fake.CountCalls("AddSecretVersion") != adds {
		t.Fatal("the dry run wrote")
	}
}

// No step, progress line or error carries a seed.
func TestNoSeedInOutput(t *testing.T) {
	w := newWorld(t)
	w.terraform(t)
	var out []string
	res, err := w.init(t, InitOptions{Progress: func(s Step) { out = append(out, s.String()) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Steps {
		out = append(out, s.String())
	}
	k, err := Load(t.Context(), w.client, project)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, k.Trust.String(), k.Registrar.String(), k.Services.String())
	// Errors about a payload: the wrong kind of seed.
	op, _ := w.fake.Latest(project, OperatorSeed)
	w.fake.Put(project, RegistrarSeed, op)
	_, err = Load(t.Context(), w.client, project)
	if err == nil {
		t.Fatal("the operator seed was accepted as the registrar's")
	}
	out = append(out, err.Error())
	table, _ := All(workers)
	for _, s := range table {
		data, _ := w.fake.Latest(project, s.Name)
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "S") || len(line) < 50 {
				continue
			}
			for _, o := range out {
				if strings.Contains(o, line) {
					t.Fatalf("output carries the seed of %s: %q", s.Name, o)
				}
			}
		}
	}
}

func TestAllRefusesBadWorkerNames(t *testing.T) {
	for _, bad := range [][]string{{"Reg"}, {"a/b"}, {""}, {"feeds", "feeds"}, {strings.Repeat("x", 65)}} {
		if _, err := All(bad); err == nil {
			t.Errorf("All(%q) accepted", bad)
		}
	}
	table, err := All([]string{"registry"})
	if err != nil {
		t.Fatal(err)
	}
	if last := table[len(table)-1]; last.Name != "mesh-worker-registry-creds" || last.Kind != WorkerCreds {
		t.Fatalf("worker row %+v", last)
	}
}

func FuzzParseCreds(f *testing.F) {
	tr, _ := creds.Generate()
	u, _ := tr.MintServiceUser("worker-x")
	cf, _ := jwt.FormatUserConfig(u.JWT, u.Key.Seed())
	f.Add(cf)
	f.Add([]byte("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		uc, err := parseCreds(data)
		if err == nil && (uc.Key == nil || uc.JWT == "") {
			t.Fatal("accepted without a key or a JWT")
		}
	})
}

func FuzzConfigOperator(f *testing.F) {
	tr, _ := creds.Generate()
	b, _ := ServerConfig(tr, DefaultResolverDir, "m")
	f.Add(b)
	f.Add([]byte("operator: \"eyJ\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if op, err := configOperator(data); err == nil && !nkeys.IsValidPublicOperatorKey(op) {
			t.Fatalf("operator %q", op)
		}
	})
}

// docs/secrets.md describes every secret of the table.
func TestDocsNameEverySecret(t *testing.T) {
	doc, err := os.ReadFile("../../docs/secrets.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Secrets {
		if !strings.Contains(string(doc), "| `"+s.Name+"` |") {
			t.Errorf("docs/secrets.md has no row for %s", s.Name)
		}
	}
	if !strings.Contains(string(doc), "| `"+WorkerCredsSecret("<name>")+"` |") {
		t.Error("docs/secrets.md has no row for the worker creds")
	}
}

// The emulator variable reaches only a loopback address: set by mistake in
// a deployment it must not let another host hand out the keys.
func TestEmulatorOptionsLoopbackOnly(t *testing.T) {
	for host, ok := range map[string]bool{"": true, "127.0.0.1:9": true, "localhost:9": true, "[::1]:9": true,
		"10.0.0.2:443": false, "secrets.example.org:443": false, "127.0.0.1": false} {
		_, err := EmulatorOptions(host)
		if (err == nil) != ok {
			t.Errorf("%q: %v", host, err)
		}
	}
}
