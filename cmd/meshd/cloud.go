package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"

	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/workers"
)

const cloudUsage = `Usage: meshd cloud init --project P [--mesh-name N] [--create-missing] [--dry-run]

Adds the first version of every secret of the mesh's Google Cloud deployment
(docs/secrets.md lists them): the NATS operator and account seeds, the
registrar and services seeds, one NATS creds file per bus worker, and the NATS
servers' configuration fragment. A secret that already has an enabled version
is read back, checked and left as is, so running it again changes nothing.
The seeds are generated here and go to Secret Manager only: nothing prints them.

Terraform creates the secrets (containers only); this adds their versions. It
uses Application Default Credentials (gcloud auth application-default login);
the caller needs roles/secretmanager.admin on the project (or viewer, accessor
and version adder on the secrets).

Flags (anywhere on the line):
  --project P               the Google Cloud project (required)
  --mesh-name N             the mesh's name, written in the NATS configuration and
                            on the secrets --create-missing creates (default P)
  --nats-resolver-dir DIR   where the NATS servers keep account JWTs, on their
                            persistent disk (default %s)
  --create-missing          create the secrets that do not exist (automatic
                            replication) instead of refusing; for a project not
                            set up with terraform/
  --dry-run                 read and check everything, say what would be done,
                            write nothing

Example:
  meshd cloud init --project acme-mesh --dry-run
  meshd cloud init --project acme-mesh
`

// cloudWorkers are the bus workers deployed on their own, one creds secret
// each: the worker table's names.
func cloudWorkers() []string {
	var names []string
	for _, w := range workers.Table() {
		names = append(names, w.Name)
	}
	return names
}

// dialSecrets makes the Secret Manager client. meshd's is the real one with
// Application Default Credentials; tests pass one reaching a fake, so no
// flag or variable can point meshd at another endpoint.
type dialSecrets func(ctx context.Context) (*secretmanager.Client, error)

// adcSecrets is the real client, authenticated by Application Default
// Credentials.
func adcSecrets(ctx context.Context) (*secretmanager.Client, error) {
	c, err := secretmanager.NewClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("Secret Manager client: %w (on a workstation, run `gcloud auth application-default login`)", err)
	}
	return c, nil
}

func cloudUsageText() string { return fmt.Sprintf(cloudUsage, cloudsecrets.DefaultResolverDir) }

// cloud runs `meshd cloud init`.
func cloud(ctx context.Context, args []string, stdout, stderr io.Writer, dial dialSecrets) error {
	fs := flag.NewFlagSet("meshd cloud", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o cloudsecrets.InitOptions
	fs.StringVar(&o.Project, "project", "", "")
	fs.StringVar(&o.MeshName, "mesh-name", "", "")
	fs.StringVar(&o.ResolverDir, "nats-resolver-dir", cloudsecrets.DefaultResolverDir, "")
	fs.BoolVar(&o.CreateMissing, "create-missing", false, "")
	fs.BoolVar(&o.DryRun, "dry-run", false, "")
	help := fs.Bool("help", false, "")
	fs.BoolVar(help, "h", false, "")
	words, err := parseAnywhere(fs, args)
	if err != nil {
		return cloudUsageErr(stderr, err.Error())
	}
	if *help || slices.Contains(words, "help") {
		fmt.Fprint(stdout, cloudUsageText())
		return flag.ErrHelp
	}
	switch {
	case len(words) == 0:
		return cloudUsageErr(stderr, "which command? (init)")
	case words[0] != "init":
		return cloudUsageErr(stderr, fmt.Sprintf("unknown cloud command %q", words[0]))
	case len(words) > 1:
		return cloudUsageErr(stderr, "unexpected arguments after init: "+strings.Join(words[1:], " "))
	case strings.TrimSpace(o.Project) == "":
		return cloudUsageErr(stderr, "init needs --project P")
	}
	o.Workers = cloudWorkers()
	o.Progress = func(s cloudsecrets.Step) { fmt.Fprintln(stdout, s) }

	c, err := dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := cloudsecrets.Init(ctx, c, o)
	if err != nil {
		return err
	}
	switch {
	case o.DryRun:
		fmt.Fprintf(stdout, "dry run: nothing was written to project %s\n", o.Project)
	case !res.Changed():
		fmt.Fprintf(stdout, "nothing to do: every secret of project %s already has a version\n", o.Project)
	default:
		added := 0
		for _, s := range res.Steps {
			if s.Action == cloudsecrets.Added {
				added++
			}
		}
		fmt.Fprintf(stdout, "project %s: %d versions added\n", o.Project, added)
	}
	if res.Trust != nil {
		fmt.Fprintf(stdout, "operator %s, mesh account %s\n", res.Trust.Operator, res.Trust.MeshAccount)
	}
	return nil
}

func cloudUsageErr(stderr io.Writer, msg string) error {
	fmt.Fprintf(stderr, "meshd cloud: %s\n\n%s", msg, cloudUsageText())
	return errUsage
}
