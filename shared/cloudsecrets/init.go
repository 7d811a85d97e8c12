package cloudsecrets

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/nats-io/jwt/v2"
	"google.golang.org/protobuf/proto"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// InitOptions configure Init.
type InitOptions struct {
	Project string
	// MeshName names the mesh in the NATS configuration fragment and in
	// the "mesh" label of secrets Init creates; the project when empty.
	MeshName string
	// Workers are the bus workers, one creds secret each.
	Workers []string
	// ResolverDir is the NATS servers' resolver directory
	// (DefaultResolverDir when empty).
	ResolverDir string
	// CreateMissing creates missing secret containers (automatic
	// replication) instead of refusing; for projects not run by Terraform.
	CreateMissing bool
	// DryRun reads and checks everything and writes nothing.
	DryRun bool
	// Progress, when set, is told each step as it happens.
	Progress func(Step)
}

// Action is what Init did, or would do, to one secret.
type Action int

const (
	Kept        Action = iota + 1 // it had an enabled version, checked and left as is
	Created                       // its container was created (CreateMissing)
	Added                         // a version was added
	WouldCreate                   // DryRun: its container would be created
	WouldAdd                      // DryRun: a version would be added
)

// Step is one thing done to one secret. It names versions, never payloads.
type Step struct {
	Secret  string
	Action  Action
	Version string // the version kept or added ("3"); empty otherwise
}

func (s Step) String() string {
	switch s.Action {
	case Kept:
		return fmt.Sprintf("%s: already has version %s; left as is", s.Secret, s.Version)
	case Created:
		return fmt.Sprintf("%s: created the secret (automatic replication)", s.Secret)
	case Added:
		return fmt.Sprintf("%s: added version %s", s.Secret, s.Version)
	case WouldCreate:
		return fmt.Sprintf("%s: would create the secret (automatic replication)", s.Secret)
	case WouldAdd:
		return fmt.Sprintf("%s: would add a version", s.Secret)
	}
	return s.Secret + ": ?"
}

// InitResult is what Init did.
type InitResult struct {
	Steps []Step
	// Trust are the public keys of the chain in the secrets, once it
	// exists (not on a dry run over an empty project).
	Trust *creds.PublicKeys
}

// Changed reports whether Init wrote anything (or would have, on a dry run).
func (r *InitResult) Changed() bool {
	for _, s := range r.Steps {
		if s.Action != Kept {
			return true
		}
	}
	return false
}

// labelValue is what a Secret Manager label value may be.
var labelValue = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)

// Init adds one version to every secret of the mesh that has no enabled
// version, and never touches one that has: run twice, the second run
// changes nothing. It reads and checks everything before it writes:
//
//   - every container must exist (Terraform creates them; CreateMissing
//     creates the missing ones instead);
//   - the four trust seeds are made together: some present and others not
//     is refused, since a fresh seed beside old ones is not a chain;
//   - every existing version is read back and checked (checksum, kind of
//     seed; worker creds and the NATS fragment must come from the trust
//     chain in the secrets), so a stale or foreign one is named, not kept
//     silently.
//
// Seeds are generated only when they are written, and are never printed.
func Init(ctx context.Context, c *secretmanager.Client, o InitOptions) (*InitResult, error) {
	if o.Project == "" {
		return nil, errors.New("cloud init: no project")
	}
	if o.MeshName == "" {
		o.MeshName = o.Project
	}
	if !labelValue.MatchString(o.MeshName) {
		return nil, fmt.Errorf("mesh name %q: want at most 63 lower-case letters, digits, '-' or '_' (it labels the secrets)", o.MeshName)
	}
	if o.ResolverDir == "" {
		o.ResolverDir = DefaultResolverDir
	}
	table, err := All(o.Workers)
	if err != nil {
		return nil, err
	}
	r := reader{c: c, project: o.Project}

	// What is there: each container and its newest enabled version.
	type slot struct {
		Secret
		exists  bool
		version string // newest enabled version, "" if none
	}
	slots := make([]slot, len(table))
	var missing []string
	for i, s := range table {
		slots[i].Secret = s
		if slots[i].exists, err = r.exists(ctx, s.Name); err != nil {
			return nil, err
		}
		if !slots[i].exists {
			missing = append(missing, s.Name)
			continue
		}
		if slots[i].version, err = r.enabledVersion(ctx, s.Name); err != nil {
			return nil, err
		}
	}
	if len(missing) > 0 && !o.CreateMissing {
		return nil, errorf(ErrNoSecret, nil, "%s %s %s not exist in project %s: `terraform apply` creates %s (or rerun with --create-missing to create %s here)",
			plural(missing, "secret", "secrets"), strings.Join(missing, ", "), plural(missing, "does", "do"), o.Project,
			plural(missing, "it", "them"), plural(missing, "it", "them"))
	}

	// The trust chain: all four seeds, or none.
	var have, lack, derived []string
	for _, s := range slots {
		switch {
		case s.Kind == TrustSeed && s.version != "":
			have = append(have, s.Name)
		case s.Kind == TrustSeed:
			lack = append(lack, s.Name)
		case (s.Kind == WorkerCreds || s.Kind == ConfigFragment) && s.version != "":
			derived = append(derived, s.Name)
		}
	}
	if len(have) > 0 && len(lack) > 0 {
		return nil, errorf(ErrHalfInitialized, nil,
			"the trust chain is half initialized: %s %s a version but %s %s none, and new seeds beside old ones would not be a chain. If a version was disabled by mistake, enable it again; if an earlier init stopped half way and no mesh ever ran on these seeds, disable their versions (gcloud secrets versions disable) and run init again",
			strings.Join(have, ", "), plural(have, "has", "have"), strings.Join(lack, ", "), plural(lack, "has", "have"))
	}
	var trust *creds.Trust
	if len(have) > 0 {
		k, err := loadTrust(ctx, r)
		if err != nil {
			return nil, err
		}
		trust = k
	} else if len(derived) > 0 {
		return nil, errorf(ErrForeign, nil,
			"%s %s a version but the trust seeds have none, so %s made from another chain: disable %s versions (gcloud secrets versions disable) and run init again",
			strings.Join(derived, ", "), plural(derived, "has", "have"), plural(derived, "it was", "they were"), plural(derived, "its", "their"))
	}

	// Read back and check every version that stays.
	for _, s := range slots {
		if s.version == "" || s.Kind == TrustSeed {
			continue
		}
		if err := checkKept(ctx, r, s.Secret, trust); err != nil {
			return nil, err
		}
	}

	// Write, in table order: the trust seeds first.
	res := &InitResult{}
	step := func(s Step) {
		res.Steps = append(res.Steps, s)
		if o.Progress != nil {
			o.Progress(s)
		}
	}
	var fresh *freshTrust
	if trust == nil && !o.DryRun {
		if fresh, err = newTrust(); err != nil {
			return nil, err
		}
		trust = fresh.trust
	}
	if trust != nil {
		pk := trust.PublicKeys()
		res.Trust = &pk
	}
	w := writer{reader: r, meshName: o.MeshName}
	for _, s := range slots {
		if !s.exists {
			if o.DryRun {
				step(Step{Secret: s.Name, Action: WouldCreate})
			} else {
				if err := w.create(ctx, s.Name); err != nil {
					return res, err
				}
				step(Step{Secret: s.Name, Action: Created})
			}
		}
		switch {
		case s.version != "":
			step(Step{Secret: s.Name, Action: Kept, Version: s.version})
			continue
		case o.DryRun:
			step(Step{Secret: s.Name, Action: WouldAdd})
			continue
		}
		data, err := payload(s.Secret, fresh, trust, o)
		if err != nil {
			return res, err
		}
		v, err := w.add(ctx, s.Name, data)
		clear(data)
		if err != nil {
			return res, err
		}
		step(Step{Secret: s.Name, Action: Added, Version: v})
	}
	return res, nil
}

// freshTrust is a newly generated chain with its keys, whose seeds Init
// writes.
type freshTrust struct {
	trust              *creds.Trust
	operator           *keys.Operator
	system, mesh, sign *keys.Account
}

func newTrust() (*freshTrust, error) {
	var f freshTrust
	var err error
	if f.operator, err = keys.Generate[keys.OperatorRole](); err != nil {
		return nil, err
	}
	for _, k := range []**keys.Account{&f.system, &f.mesh, &f.sign} {
		if *k, err = keys.Generate[keys.AccountRole](); err != nil {
			return nil, err
		}
	}
	if f.trust, err = creds.FromKeys(f.operator, f.system, f.mesh, f.sign); err != nil {
		return nil, err
	}
	return &f, nil
}

// payload makes the first version of s. Seeds are written as a seed file
// holds them (the seed and a newline), so a secret mounted as a file reads
// like one.
func payload(s Secret, fresh *freshTrust, t *creds.Trust, o InitOptions) ([]byte, error) {
	seedLine := func(seed []byte) []byte {
		defer clear(seed)
		return append(append(make([]byte, 0, len(seed)+1), seed...), '\n')
	}
	generate := func(gen func() ([]byte, error)) ([]byte, error) {
		seed, err := gen()
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.Name, err)
		}
		return seedLine(seed), nil
	}
	switch s.Name {
	case OperatorSeed:
		return seedLine(fresh.operator.Seed()), nil
	case SystemAccountSeed:
		return seedLine(fresh.system.Seed()), nil
	case AccountSeed:
		return seedLine(fresh.mesh.Seed()), nil
	case AccountSigningSeed:
		return seedLine(fresh.sign.Seed()), nil
	case RegistrarSeed:
		return generate(func() ([]byte, error) {
			k, err := keys.Generate[keys.RegistrarRole]()
			if err != nil {
				return nil, err
			}
			return k.Seed(), nil
		})
	case ServicesSeed, ExportSeed:
		return generate(func() ([]byte, error) {
			k, err := keys.Generate[keys.AgentRole]()
			if err != nil {
				return nil, err
			}
			return k.Seed(), nil
		})
	case NATSConfig:
		return ServerConfig(t, o.ResolverDir, o.MeshName)
	}
	if s.Kind == WorkerCreds {
		u, err := t.MintServiceUser(WorkerUser(s.Worker))
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", s.Name, err)
		}
		seed := u.Key.Seed()
		defer clear(seed)
		return jwt.FormatUserConfig(u.JWT, seed)
	}
	return nil, fmt.Errorf("secret %s: no payload for it", s.Name)
}

// loadTrust reads the four trust seeds.
func loadTrust(ctx context.Context, r reader) (*creds.Trust, error) {
	op, err := readSeed[keys.OperatorRole](ctx, r, OperatorSeed)
	if err != nil {
		return nil, err
	}
	var accts [3]*keys.Account
	for i, id := range []string{SystemAccountSeed, AccountSeed, AccountSigningSeed} {
		if accts[i], err = readSeed[keys.AccountRole](ctx, r, id); err != nil {
			return nil, err
		}
	}
	t, err := creds.FromKeys(op, accts[0], accts[1], accts[2])
	if err != nil {
		return nil, errorf(ErrBadPayload, err, "the trust seeds: %v", err)
	}
	return t, nil
}

// checkKept reads back a version Init keeps and checks it is what s holds,
// and, for what is made from the trust chain, that it was made from t.
func checkKept(ctx context.Context, r reader, s Secret, t *creds.Trust) error {
	switch s.Kind {
	case KeySeed:
		var err error
		if s.Name == RegistrarSeed {
			_, err = readSeed[keys.RegistrarRole](ctx, r, s.Name)
		} else {
			_, err = readSeed[keys.AgentRole](ctx, r, s.Name)
		}
		return err
	case WorkerCreds:
		_, err := r.workerCreds(ctx, s.Name, t)
		return err
	case ConfigFragment:
		data, version, err := r.access(ctx, s.Name)
		if err != nil {
			return err
		}
		op, err := configOperator(data)
		if err != nil {
			return errorf(ErrBadPayload, err, "secret %s (%s) is not a NATS configuration written by init: %v", s.Name, version, err)
		}
		if want := t.PublicKeys().Operator; op != want {
			return errorf(ErrForeign, nil, "secret %s (%s) names operator %s, but this mesh's is %s: disable its versions and run init again",
				s.Name, version, op, want)
		}
	}
	return nil
}

// enabledVersion is the number of id's newest enabled version, "" if it
// has none.
func (r reader) enabledVersion(ctx context.Context, id string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	it := r.c.ListSecretVersions(cctx, &secretmanagerpb.ListSecretVersionsRequest{Parent: secretName(r.project, id), Filter: "state:ENABLED"})
	best, bestN := "", 0
	for v, err := range it.All() {
		if err != nil {
			return "", r.explain(ctx, "look", id, err)
		}
		if v.GetState() != secretmanagerpb.SecretVersion_ENABLED {
			continue // the filter already says so; not trusted blindly
		}
		num := v.GetName()[strings.LastIndexByte(v.GetName(), '/')+1:]
		if n, err := strconv.Atoi(num); err == nil && n > bestN {
			best, bestN = num, n
		}
	}
	return best, nil
}

// writer adds what Init makes.
type writer struct {
	reader
	meshName string
}

// create makes the container id with automatic replication.
func (w writer) create(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	_, err := w.c.CreateSecret(cctx, &secretmanagerpb.CreateSecretRequest{Parent: projectName(w.project), SecretId: id,
		Secret: &secretmanagerpb.Secret{
			Replication: &secretmanagerpb.Replication{Replication: &secretmanagerpb.Replication_Automatic_{Automatic: &secretmanagerpb.Replication_Automatic{}}},
			Labels:      map[string]string{"mesh": w.meshName},
		}})
	if err != nil {
		return w.explain(ctx, "create", id, err)
	}
	return nil
}

// add stores data as id's next version, with its CRC32C so the service
// refuses a payload damaged on the way, and returns the version's number.
func (w writer) add(ctx context.Context, id string, data []byte) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	v, err := w.c.AddSecretVersion(cctx, &secretmanagerpb.AddSecretVersionRequest{Parent: secretName(w.project, id),
		Payload: &secretmanagerpb.SecretPayload{Data: data, DataCrc32C: proto.Int64(checksum(data))}})
	if err != nil {
		return "", w.explain(ctx, "add", id, err)
	}
	return v.GetName()[strings.LastIndexByte(v.GetName(), '/')+1:], nil
}

// plural picks one or many by the length of names.
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return one
	}
	return many
}
