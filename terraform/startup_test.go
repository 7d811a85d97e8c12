package terraform

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"agentmesh.dev/mesh/shared/creds"
)

// The fake commands the startup script meets on a Container-Optimized OS
// VM: the metadata server and Secret Manager behind curl, and the disk,
// firewall and container tools. Each records how it was called.
var fakeCommands = map[string]string{
	"curl": `#!/bin/bash
echo "$*" >>"$FAKE_DIR/curl.log"
url="${@: -1}"
case "$url" in
  http://metadata.google.internal/computeMetadata/v1/project/project-id) printf 'proj-1' ;;
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/*) cat "$FAKE_DIR/attr/${url##*/}" ;;
  http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token)
    printf '{"access_token":"tok-123","expires_in":3599,"token_type":"Bearer"}' ;;
  https://secretmanager.googleapis.com/v1/projects/proj-1/secrets/*/versions/latest:access)
    name="${url#*/secrets/}"; name="${name%%/*}"
    if [ -f "$FAKE_DIR/secrets/$name.later" ]; then rm "$FAKE_DIR/secrets/$name.later"; exit 22; fi
    [ -f "$FAKE_DIR/secrets/$name" ] || exit 22
    printf '{\n  "name": "projects/123/secrets/%s/versions/1",\n  "payload": {\n    "data": "%s",\n    "dataCrc32c": "42"\n  }\n}\n' "$name" "$(base64 -w0 "$FAKE_DIR/secrets/$name")" ;;
  *) echo "unexpected curl $url" >&2; exit 2 ;;
esac
`,
	"blkid":      "#!/bin/bash\nexit 2\n", // a new, unformatted disk
	"mkfs.ext4":  "#!/bin/bash\necho \"mkfs.ext4 $*\" >>\"$FAKE_DIR/cmd.log\"\n",
	"mountpoint": "#!/bin/bash\nexit 0\n",
	"mount":      "#!/bin/bash\necho \"mount $*\" >>\"$FAKE_DIR/cmd.log\"\n",
	"iptables":   "#!/bin/bash\ncase \" $* \" in *\" -C \"*) exit 1 ;; esac\necho \"iptables $*\" >>\"$FAKE_DIR/cmd.log\"\n",
	"docker":     "#!/bin/bash\necho \"docker $*\" >>\"$FAKE_DIR/cmd.log\"\n",
	"sleep":      "#!/bin/bash\necho \"sleep $*\" >>\"$FAKE_DIR/cmd.log\"\n",
}

// runStartup runs nats-startup.sh against the fakes with the given
// instance attributes and secrets, and returns the data directory.
func runStartup(t *testing.T, attrs, secrets map[string]string) (data, fake string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	dir := t.TempDir()
	fake, data = filepath.Join(dir, "fake"), filepath.Join(dir, "disk")
	for _, d := range []string{"bin", "attr", "secrets"} {
		if err := os.MkdirAll(filepath.Join(fake, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, s string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	for name, src := range fakeCommands {
		write(filepath.Join(fake, "bin", name), src, 0o755)
	}
	for k, v := range attrs {
		write(filepath.Join(fake, "attr", k), v, 0o644)
	}
	for k, v := range secrets {
		write(filepath.Join(fake, "secrets", k), v, 0o644)
	}
	cmd := exec.Command("bash", "nats-startup.sh")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(fake, "bin")+":"+os.Getenv("PATH"), "FAKE_DIR="+fake,
		"NATS_DATA_DIR="+data, "NATS_DATA_DEVICE=/dev/fake-nats-data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nats-startup.sh: %v\n%s", err, out)
	}
	return data, fake
}

// meshFragment is a mesh-nats-config as meshd cloud init makes it: the
// operator, the system account and the full resolver with its preload.
func meshFragment(t *testing.T) (string, creds.PublicKeys) {
	t.Helper()
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	op, err := trust.OperatorJWT()
	if err != nil {
		t.Fatal(err)
	}
	sys, err := trust.SystemAccountJWT()
	if err != nil {
		t.Fatal(err)
	}
	mesh, err := trust.MeshAccountJWT()
	if err != nil {
		t.Fatal(err)
	}
	pk := trust.PublicKeys()
	return fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: {\n  type: full\n  dir: \"/data/jwt\"\n}\nresolver_preload: {\n  %s: %s\n  %s: %s\n}\n",
		op, pk.SystemAccount, pk.SystemAccount, sys, pk.MeshAccount, mesh), pk
}

func selfSigned(t *testing.T, host string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// loadConfig reads the written configuration with the NATS server's own
// parser, the container's /data mapped to the data directory.
func loadConfig(t *testing.T, data string) *server.Options {
	t.Helper()
	for _, name := range []string{"nats.conf", "mesh.conf"} {
		src, err := os.ReadFile(filepath.Join(data, "conf", name))
		if err != nil {
			t.Fatal(err)
		}
		local := strings.ReplaceAll(string(src), `"/data/`, `"`+data+`/`)
		if err := os.WriteFile(filepath.Join(data, "conf", "local-"+name), []byte(strings.ReplaceAll(local, `include "mesh.conf"`, `include "local-mesh.conf"`)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join(data, "conf", "local-nats.conf"))
	if err != nil {
		t.Fatalf("the NATS server refuses the written configuration: %v", err)
	}
	return opts
}

var baseAttrs = map[string]string{
	"nats-server-name":  "mesh-nats-1",
	"nats-cluster-name": "mesh",
	"nats-routes":       "nats-route://10.10.0.10:6222,nats-route://10.10.0.11:6222,nats-route://10.10.0.12:6222",
	"nats-image":        "nats:2.15.2",
	"nats-max-file":     "15G",
}

// The startup script waits for mesh-nats-config, then writes a
// configuration the NATS server accepts: this server's name, the three
// routes, JetStream on the data disk, WebSocket, TLS for agents with plain
// connections allowed inside the VPC, the operator and the full resolver;
// and starts the image on it.
func TestStartupScriptWithTLS(t *testing.T) {
	frag, pk := meshFragment(t)
	attrs := map[string]string{"nats-tls": "true"}
	for k, v := range baseAttrs {
		attrs[k] = v
	}
	data, fake := runStartup(t, attrs, map[string]string{
		"mesh-nats-config": frag, "mesh-nats-config.later": "", "mesh-nats-tls": selfSigned(t, "nats.example.org"),
	})
	opts := loadConfig(t, data)
	switch {
	case opts.ServerName != "mesh-nats-1":
		t.Errorf("server name %q", opts.ServerName)
	case opts.Cluster.Name != "mesh" || opts.Cluster.Port != 6222 || !opts.Cluster.NoAdvertise:
		t.Errorf("cluster %+v", opts.Cluster)
	case len(opts.Routes) != 3:
		t.Errorf("routes %v", opts.Routes)
	case !opts.JetStream || opts.StoreDir != filepath.Join(data, "jetstream"):
		t.Errorf("JetStream %v in %q", opts.JetStream, opts.StoreDir)
	case opts.Websocket.Port != 4443 || opts.Websocket.TLSConfig == nil:
		t.Errorf("websocket port %d, TLS %v", opts.Websocket.Port, opts.Websocket.TLSConfig != nil)
	case opts.Port != 4222 || opts.TLSConfig == nil || !opts.AllowNonTLS:
		t.Errorf("client port %d, TLS %v, non-TLS allowed %v", opts.Port, opts.TLSConfig != nil, opts.AllowNonTLS)
	case len(opts.TrustedOperators) != 1 || opts.SystemAccount != pk.SystemAccount:
		t.Errorf("operators %d, system account %q", len(opts.TrustedOperators), opts.SystemAccount)
	case opts.AccountResolver == nil:
		t.Error("no account resolver")
	}
	if _, ok := opts.AccountResolver.(*server.DirAccResolver); !ok {
		t.Errorf("resolver %T, want the directory (full) resolver", opts.AccountResolver)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("the NATS server refuses the options: %v", err)
	}
	s.Shutdown()

	for _, name := range []string{"mesh.conf", "tls.pem"} {
		if fi, err := os.Stat(filepath.Join(data, "conf", name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode().Perm())
		}
	}
	cmds, _ := os.ReadFile(filepath.Join(fake, "cmd.log"))
	log := string(cmds)
	for _, want := range []string{
		"mkfs.ext4 -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard /dev/fake-nats-data",
		"sleep 30", // mesh-nats-config had no version on the first try
		"iptables -w -A INPUT -p tcp --dport 4222 -j ACCEPT",
		"iptables -w -A INPUT -p tcp --dport 6222 -j ACCEPT",
		"docker run -d --name nats --restart unless-stopped --network host -v " + data + ":/data -w /data nats:2.15.2 --config /data/conf/nats.conf",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the script did not run %q; it ran:\n%s", want, log)
		}
	}
	curls, _ := os.ReadFile(filepath.Join(fake, "curl.log"))
	for _, line := range strings.Split(string(curls), "\n") {
		if strings.Contains(line, "secretmanager.googleapis.com") && !strings.Contains(line, "Authorization: Bearer tok-123") {
			t.Errorf("Secret Manager called without the VM account's token: %s", line)
		}
	}
}

func TestStartupScriptWithoutTLS(t *testing.T) {
	frag, _ := meshFragment(t)
	attrs := map[string]string{"nats-tls": "false"}
	for k, v := range baseAttrs {
		attrs[k] = v
	}
	data, _ := runStartup(t, attrs, map[string]string{"mesh-nats-config": frag})
	opts := loadConfig(t, data)
	if opts.TLSConfig != nil || opts.Websocket.TLSConfig != nil || !opts.Websocket.NoTLS {
		t.Errorf("TLS is off, yet client TLS %v, websocket TLS %v / no_tls %v", opts.TLSConfig != nil, opts.Websocket.TLSConfig != nil, opts.Websocket.NoTLS)
	}
	if _, err := os.Stat(filepath.Join(data, "conf", "tls.pem")); err == nil {
		t.Error("the script fetched a certificate it does not use")
	}
}
