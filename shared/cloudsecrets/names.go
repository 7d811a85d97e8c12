// Package cloudsecrets keeps the mesh's keys in Google Secret Manager: the
// one table of secret names, Load (what a Cloud Function reads at cold
// start), LoadWorker (what a bus worker reads at start), and Init (what
// `meshd cloud init` runs to add the first versions). On one machine meshd
// keeps the same keys as files under its data directory instead
// (creds.LoadOrCreate); this package is the cloud's counterpart.
//
// Terraform creates the secret containers and never a version, so no seed
// ever reaches its state; Init adds the versions, never overwriting one.
// Payloads are written and read with their CRC32C checksum. Nothing here
// prints or logs a seed: keys are held as keys.Key values, which render as
// their public half.
//
// The package links the Secret Manager client and nothing else of the cloud
// stack (no Firestore, no functions framework, no nats-server), so meshd,
// the functions and the worker binaries can all use it.
package cloudsecrets

import (
	"fmt"
	"regexp"
	"slices"
)

// Kind says how a secret's payload is made, and so which secrets must be
// made together.
type Kind int

const (
	// TrustSeed is one of the four seeds of the creds.Trust chain. They are
	// made together or not at all: a seed from one run beside seeds from
	// another is not a chain.
	TrustSeed Kind = iota + 1
	// KeySeed is a key of its own (registrar, services), made independently.
	KeySeed
	// WorkerCreds is a bus worker's NATS creds file, minted from the trust
	// chain: it works only with the seeds it was minted from.
	WorkerCreds
	// ConfigFragment is the NATS servers' configuration fragment, made from
	// the trust chain.
	ConfigFragment
)

// The secret IDs. Terraform declares a container for each (the worker ones
// through WorkerCredsSecret), and the deployed code reads them by these
// names; docs/secrets.md describes each.
const (
	OperatorSeed       = "mesh-operator-seed"
	SystemAccountSeed  = "mesh-system-account-seed"
	AccountSeed        = "mesh-account-seed"
	AccountSigningSeed = "mesh-account-signing-seed"
	RegistrarSeed      = "mesh-registrar-seed"
	ServicesSeed       = "mesh-services-seed"
	ExportSeed         = "mesh-export-seed"
	NATSConfig         = "mesh-nats-config"
)

// WorkerCredsSecret is the ID of the secret holding worker's NATS creds
// file: "mesh-worker-<worker>-creds".
func WorkerCredsSecret(worker string) string { return "mesh-worker-" + worker + "-creds" }

// WorkerUser is the name minted into worker's service credential.
func WorkerUser(worker string) string { return "worker-" + worker }

// Secret is one row of the table.
type Secret struct {
	Name   string // the secret ID in the project
	Kind   Kind
	Holds  string // what its payload is
	ReadBy string // who reads it
	Worker string // the worker whose creds it holds (WorkerCreds only)
}

// Secrets is the table of the mesh's secrets, in the order Init makes
// them, without the per-worker rows (see All). The trust seeds come first.
var Secrets = []Secret{
	{Name: OperatorSeed, Kind: TrustSeed, Holds: "the NATS operator's nkeys seed (SO…): signs both account JWTs", ReadBy: "control plane (functions), the rooms worker"},
	{Name: SystemAccountSeed, Kind: TrustSeed, Holds: "the NATS system account's seed (SA…): signs the system users that push account updates", ReadBy: "control plane (functions), the rooms worker"},
	{Name: AccountSeed, Kind: TrustSeed, Holds: "the mesh account's identity seed (SA…): names the account; signs nothing day to day", ReadBy: "control plane (functions), the rooms worker"},
	{Name: AccountSigningSeed, Kind: TrustSeed, Holds: "the mesh account's signing seed (SA…): signs every user JWT the control plane and the rooms worker mint", ReadBy: "control plane (functions), the rooms worker"},
	{Name: RegistrarSeed, Kind: KeySeed, Holds: "the registrar's card-signing seed (SU…)", ReadBy: "control plane (functions)"},
	{Name: ServicesSeed, Kind: KeySeed, Holds: "the services key's seed (SU…): the bus workers sign their answers with it, the account views their calls", ReadBy: "control plane (functions), every bus worker"},
	{Name: ExportSeed, Kind: KeySeed, Holds: "the export key's seed (SU…): signs the manifests of audit exports (docs/audit.md); its public half is in /v1/capabilities", ReadBy: "control plane (functions)"},
	{Name: NATSConfig, Kind: ConfigFragment, Holds: "a NATS server configuration fragment: the operator JWT inline, the system account, the directory resolver and the two account JWTs preloaded", ReadBy: "the NATS servers, at boot (include it)"},
}

// workerName is what a worker name may be: it becomes part of a secret ID
// (letters, digits, '-' and '_', at most 255 in all).
var workerName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// All is the table with one WorkerCreds row per worker, in the order given.
// It refuses a name that cannot be part of a secret ID, and duplicates.
func All(workers []string) ([]Secret, error) {
	out := slices.Clone(Secrets)
	for i, w := range workers {
		if !workerName.MatchString(w) {
			return nil, fmt.Errorf("worker name %q: want lower-case letters, digits, '-' or '_' (it is part of a secret ID)", w)
		}
		if slices.Contains(workers[:i], w) {
			return nil, fmt.Errorf("worker %q is listed twice", w)
		}
		out = append(out, Secret{Name: WorkerCredsSecret(w), Kind: WorkerCreds, Worker: w,
			Holds:  fmt.Sprintf("a NATS creds file (user JWT and seed) for %s, minted by the account signing key with the service permissions", WorkerUser(w)),
			ReadBy: "the " + w + " worker"})
	}
	return out, nil
}

// resource names of the Secret Manager API.
func projectName(project string) string       { return "projects/" + project }
func secretName(project, id string) string    { return projectName(project) + "/secrets/" + id }
func latestVersion(project, id string) string { return secretName(project, id) + "/versions/latest" }
