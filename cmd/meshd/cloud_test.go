package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"

	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/cloudsecrets/secretfake"
)

// fakeSecrets is a fake Secret Manager and the dialer meshd cloud uses to reach it.
func fakeSecrets(t *testing.T) (*secretfake.Fake, dialSecrets) {
	t.Helper()
	f, err := secretfake.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f, func(ctx context.Context) (*secretmanager.Client, error) { return f.NewClient(ctx) }
}

// terraformApply creates every secret container, as terraform/ does.
func terraformApply(t *testing.T, f *secretfake.Fake, project string) {
	t.Helper()
	table, err := cloudsecrets.All(cloudWorkers())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range table {
		f.Create(project, s.Name)
	}
}

func runCloud(t *testing.T, dial dialSecrets, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd, rest := splitCommand(args)
	if cmd != "cloud" {
		t.Fatalf("splitCommand(%q) = %q", args, cmd)
	}
	err := cloud(t.Context(), rest, &out, &errOut, dial)
	return out.String(), errOut.String(), err
}

// cloud init on a project Terraform prepared adds one version per secret,
// says so per secret, and a second run changes nothing and says so; what
// it wrote loads.
func TestCloudInit(t *testing.T) {
	f, dial := fakeSecrets(t)
	terraformApply(t, f, "acme")
	n := len(cloudsecrets.Secrets) + len(cloudWorkers())

	out, errOut, err := runCloud(t, dial, "cloud", "init", "--project", "acme", "--nats-resolver-dir", "/srv/nats/jwt")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if got := strings.Count(out, ": added version 1\n"); got != n {
		t.Fatalf("%d secrets added, want %d:\n%s", got, n, out)
	}
	for _, want := range []string{"mesh-operator-seed: added version 1", "mesh-worker-mailbox-creds: added version 1",
		fmt.Sprintf("project acme: %d versions added", n), "operator O", "mesh account A"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if frag, _ := f.Latest("acme", cloudsecrets.NATSConfig); !bytes.Contains(frag, []byte(`dir: "/srv/nats/jwt"`)) || !bytes.Contains(frag, []byte(`"acme"`)) {
		t.Errorf("the NATS fragment does not carry the flags:\n%s", frag)
	}
	// No seed reaches the output.
	for _, s := range []string{cloudsecrets.OperatorSeed, cloudsecrets.AccountSigningSeed, cloudsecrets.ServicesSeed, cloudsecrets.WorkerCredsSecret("tasks")} {
		data, _ := f.Latest("acme", s)
		for _, line := range strings.Fields(string(data)) {
			if strings.HasPrefix(line, "S") && len(line) > 50 && strings.Contains(out+errOut, line) {
				t.Fatalf("the output carries the seed of %s", s)
			}
		}
	}

	adds := f.CountCalls("AddSecretVersion")
	dry, _, err := runCloud(t, dial, "--dry-run", "cloud", "init", "--project", "acme")
	if err != nil || !strings.Contains(dry, "dry run: nothing was written to project acme") {
		t.Fatalf("dry run: %v\n%s", err, dry)
	}
	again, _, err := runCloud(t, dial, "cloud", "init", "--project=acme")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(again, ": already has version 1; left as is\n"); got != n || !strings.Contains(again, "nothing to do") {
		t.Fatalf("second run:\n%s", again)
	}
	if f.CountCalls("AddSecretVersion") != adds {
		t.Fatal("the second run added versions")
	}

	c, err := dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := cloudsecrets.Load(t.Context(), c, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, k.Trust.PublicKeys().Operator) {
		t.Fatal("the printed operator is not the one stored")
	}
}

// What cloud init refuses, it refuses with one line saying what to do.
func TestCloudInitRefusals(t *testing.T) {
	t.Run("missing containers", func(t *testing.T) {
		f, dial := fakeSecrets(t)
		_, _, err := runCloud(t, dial, "cloud", "init", "--project", "acme")
		if err == nil || !strings.Contains(err.Error(), "`terraform apply` creates them") || !strings.Contains(err.Error(), "--create-missing") {
			t.Fatalf("err = %v", err)
		}
		out, _, err := runCloud(t, dial, "cloud", "init", "--project", "acme", "--dry-run", "--create-missing")
		if err != nil || !strings.Contains(out, "mesh-registrar-seed: would create the secret") || !strings.Contains(out, "dry run: nothing was written") {
			t.Fatalf("dry run: %v\n%s", err, out)
		}
		if f.Exists("acme", cloudsecrets.RegistrarSeed) {
			t.Fatal("the dry run created a secret")
		}
		out, _, err = runCloud(t, dial, "cloud", "init", "--create-missing", "--project", "acme", "--mesh-name", "prod")
		if err != nil || !strings.Contains(out, "mesh-registrar-seed: created the secret (automatic replication)\nmesh-registrar-seed: added version 1\n") {
			t.Fatalf("create missing: %v\n%s", err, out)
		}
		if f.Labels("acme", cloudsecrets.RegistrarSeed)["mesh"] != "prod" {
			t.Fatal("the created secret is not labelled with the mesh name")
		}
	})
	t.Run("half initialized", func(t *testing.T) {
		f, dial := fakeSecrets(t)
		terraformApply(t, f, "acme")
		if _, _, err := runCloud(t, dial, "cloud", "init", "--project", "acme"); err != nil {
			t.Fatal(err)
		}
		f.SetState("acme", cloudsecrets.OperatorSeed, 1, secretmanagerpb.SecretVersion_DISABLED)
		_, _, err := runCloud(t, dial, "cloud", "init", "--project", "acme")
		if !errors.Is(err, cloudsecrets.ErrHalfInitialized) || !strings.Contains(err.Error(), "mesh-operator-seed has none") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("bad mesh name", func(t *testing.T) {
		_, dial := fakeSecrets(t)
		if _, _, err := runCloud(t, dial, "cloud", "init", "--project", "acme", "--mesh-name", "Prod Mesh"); err == nil || !strings.Contains(err.Error(), "mesh name") {
			t.Fatalf("err = %v", err)
		}
	})
}

// Help and usage mistakes are answered before anything is dialled (the
// real dialer is what run passes, so reaching it would be a bug here).
func TestCloudUsage(t *testing.T) {
	for _, c := range []struct {
		args  []string
		help  bool
		wants string
	}{
		{[]string{"cloud", "--help"}, true, "Usage: meshd cloud init --project P"},
		{[]string{"help", "cloud"}, true, "--create-missing"},
		{[]string{"cloud", "init", "-h"}, true, "--dry-run"},
		{[]string{"help", "cloud", "init"}, true, "--nats-resolver-dir"},
		{[]string{"cloud"}, false, "which command"},
		{[]string{"cloud", "init"}, false, "init needs --project P"},
		{[]string{"cloud", "deploy", "--project", "p"}, false, `unknown cloud command "deploy"`},
		{[]string{"cloud", "init", "now", "--project", "p"}, false, "unexpected arguments after init: now"},
		{[]string{"cloud", "init", "--project", "p", "--data-dir", "x"}, false, "flag provided but not defined: -data-dir"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), c.args, noEnv, &stdout, &stderr)
		switch {
		case c.help && (!errors.Is(err, flag.ErrHelp) || !strings.Contains(stdout.String(), c.wants)):
			t.Errorf("meshd %s: %v\n%s", strings.Join(c.args, " "), err, &stdout)
		case !c.help && (!errors.Is(err, errUsage) || !strings.Contains(stderr.String(), c.wants)):
			t.Errorf("meshd %s: %v\n%s", strings.Join(c.args, " "), err, &stderr)
		}
	}
	var stdout bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, noEnv, &stdout, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stdout.String(), "meshd cloud init --project P") {
		t.Errorf("meshd --help does not list cloud init:\n%s", &stdout)
	}
}
