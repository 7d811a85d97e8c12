package mesh

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/routes"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/cloudsecrets/secretfake"
	"agentmesh.dev/mesh/workers"
)

// functionServerEnv makes the test binary a function instance: it serves
// the Functions Framework the way Cloud Functions runs this package, with
// FUNCTION_TARGET naming the entry point, on $PORT.
const functionServerEnv = "MESH_TEST_FUNCTION_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(functionServerEnv) == "1" {
		err := funcframework.StartHostPort("127.0.0.1", os.Getenv("PORT"))
		fmt.Fprintln(os.Stderr, "function server:", err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// startFunction runs one function instance for entry (a child process,
// as Cloud Functions runs one instance per function) and returns its base
// URL.
func startFunction(t *testing.T, entry string, env ...string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), functionServerEnv+"=1", "FUNCTION_TARGET="+entry, "PORT="+port)
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	base := "http://127.0.0.1:" + port
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("function %s exited: %v\n%s", entry, err, stderr.String())
		default:
		}
		if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			c.Close()
			return base
		}
		if time.Now().After(deadline) {
			t.Fatalf("function %s did not listen within 20 s\n%s", entry, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cloudEnv is a function instance's configuration with nothing behind it
// that a test cannot provide: Firestore points at a closed port (the
// routes exercised here never reach the store), SMTP is never dialled, and
// there are no keys (MESH_KEYS=none), so the minting doors answer 501.
func cloudEnv() []string {
	return []string{"GOOGLE_CLOUD_PROJECT=mesh-test", "FIRESTORE_EMULATOR_HOST=127.0.0.1:9", "MESH_NAME=functest",
		"MESH_CONTROL_URL=https://mesh.example.org", "MESH_CONSOLE_URL=https://mesh.example.org/console/",
		"SMTP_ADDR=127.0.0.1:25", "SMTP_FROM=mesh@example.org", "MESH_NATS_URLS=nats://127.0.0.1:9",
		"MESH_KEYS=none", "MESH_SECRETS_PROJECT=", "MESH_SECRETMANAGER_EMULATOR_HOST=",
		"MESH_DEPLOYER_SA=mesh-deployer@mesh-test.iam.gserviceaccount.com"}
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every row is registered under its entry point, and the instance started
// for that entry point serves exactly that row: another method on its path
// is the row's 405, another route's path is a 404, both as JSON errors
// from the row's own mux (a wrong mapping would answer the other way
// round). The function instance is the Functions Framework itself, started
// as Cloud Functions starts it (FUNCTION_TARGET).
func TestFunctionsFrameworkServesEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts one process per route")
	}
	table := routes.All()
	if err := api.Check(table); err != nil {
		t.Fatal(err)
	}
	for _, rt := range table {
		t.Run(rt.EntryPoint, func(t *testing.T) {
			base := startFunction(t, rt.EntryPoint, cloudEnv()...)
			path := strings.NewReplacer("{id}", "acct_x", "{kind}", "register", "{token}", "t", "{key}", "k", "{app}", "a",
				"{agent}", "g", "{handle...}", "nobody.x@example.org").Replace(rt.Path)
			if rt.Method != "" {
				other := http.MethodPut
				if st, body := do(t, other, base+path); st != http.StatusMethodNotAllowed || !strings.Contains(body, `"code"`) {
					t.Errorf("%s %s on %s's instance: %d %s, want its JSON 405", other, path, rt.EntryPoint, st, body)
				}
			}
			if st, body := do(t, http.MethodGet, base+"/no/such/route"); st != http.StatusNotFound || !strings.Contains(body, "there is no route") {
				t.Errorf("GET /no/such/route on %s's instance: %d %s, want the JSON 404 of a single-route mux", rt.EntryPoint, st, body)
			}
		})
	}
}

// Routes answer through the Functions Framework end to end, the way a
// cold start runs in the cloud: `meshd cloud init`'s Init writes the keys
// to Secret Manager (the real client against an in-process fake), the
// broker trusts the operator they hold, and a function instance reads the
// keys at its first request (functions/cloud, api.NewDeps), connects to
// the broker and answers: the capabilities say it mints, and the
// registrar's key set is the key from Secret Manager.
func TestFunctionAnswersEndToEnd(t *testing.T) {
	fake, err := secretfake.Start(cloudsecrets.EmulatorToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	sm, err := fake.NewClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	names := make([]string, 0, len(workers.Table()))
	for _, w := range workers.Table() {
		names = append(names, w.Name)
	}
	if _, err := cloudsecrets.Init(t.Context(), sm, cloudsecrets.InitOptions{Project: "keys-project", Workers: names, CreateMissing: true}); err != nil {
		t.Fatal(err)
	}
	ks, err := cloudsecrets.Load(t.Context(), sm, "keys-project")
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.Start(t.Context(), broker.Config{DataDir: t.TempDir(), Trust: ks.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)

	env := append(cloudEnv(), "MESH_KEYS=secret-manager", "MESH_SECRETS_PROJECT=keys-project",
		"MESH_SECRETMANAGER_EMULATOR_HOST="+fake.Addr, "MESH_NATS_URLS="+b.ClientURL())
	caps := startFunction(t, "Capabilities", env...)
	st, body := do(t, http.MethodGet, caps+"/v1/capabilities")
	if st != http.StatusOK {
		t.Fatalf("GET /v1/capabilities: %d %s", st, body)
	}
	var c struct {
		OK       bool   `json:"ok"`
		Mesh     string `json:"mesh"`
		Protocol string `json:"protocol"`
		Node     struct {
			Minting bool `json:"minting"`
		} `json:"node_credential"`
		Guest *struct{} `json:"guest"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		t.Fatal(err)
	}
	if !c.OK || c.Mesh != "functest" || c.Protocol == "" || !c.Node.Minting || c.Guest == nil {
		t.Errorf("capabilities from the function: %s", body)
	}

	reg := startFunction(t, "RegistrarKey", env...)
	st, body = do(t, http.MethodGet, reg+"/api/registrar-key")
	if st != http.StatusOK || !strings.Contains(body, ks.Registrar.Public()) {
		t.Errorf("GET /api/registrar-key: %d %s, want the key from Secret Manager (%s)", st, body, ks.Registrar.Public())
	}

	// Without its keys the instance does not start serving: it answers
	// 503 and names what is missing in its log, and the next request
	// tries again.
	empty := startFunction(t, "Capabilities", append(env, "MESH_SECRETS_PROJECT=no-such-project")...)
	if st, body := do(t, http.MethodGet, empty+"/v1/capabilities"); st != http.StatusServiceUnavailable {
		t.Errorf("without keys: %d %s, want 503", st, body)
	}
	// Health needs nothing: it answers where the keys are missing.
	health := startFunction(t, "Health", append(env, "MESH_SECRETS_PROJECT=no-such-project")...)
	if st, body := do(t, http.MethodGet, health+"/v1/health"); st != http.StatusOK {
		t.Errorf("health without keys: %d %s, want 200", st, body)
	}
}
