// Package creds holds the NATS operator-mode trust chain of the mesh: the
// operator, the system account and the mesh account (with its signing key),
// and mints the JWTs the broker trusts.
//
// Seeds are the only secrets here. They live inside keys.Key values, which
// print, log and marshal as their public key only (see package keys).
package creds

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/keys"
)

// Names written into the JWTs; they only help people reading server logs and
// account listings, the broker trusts keys, not names.
const (
	OperatorName      = "agentmesh"
	SystemAccountName = "SYS"
	MeshAccountName   = "MESH"
)

// Seed file names inside a trust directory.
const (
	operatorFile    = "operator.nk"
	systemFile      = "system-account.nk"
	meshFile        = "mesh-account.nk"
	meshSigningFile = "mesh-signing.nk"
)

// Trust is the root of the broker's trust chain: the operator key, the system
// account key and the mesh account key with the signing key that mints every
// mesh user. The operator signs both account JWTs; the mesh account identity
// key signs nothing day to day, which is what lets the signing key be rotated
// later without changing the account.
type Trust struct {
	operator    *keys.Operator
	system      *keys.Account
	mesh        *keys.Account
	meshSigning *keys.Account
}

// PublicKeys lists the public halves of a Trust; it is safe to log and store.
type PublicKeys struct {
	Operator       string `json:"operator"`
	SystemAccount  string `json:"system_account"`
	MeshAccount    string `json:"mesh_account"`
	MeshSigningKey string `json:"mesh_signing_key"`
}

// trustFile ties one key of a Trust to its file; the key's type fixes the
// kind of seed the file must hold.
type trustFile struct {
	name     string
	generate func() error
	load     func(path string) error
	save     func(path string) error
}

// slot makes the trustFile of the key *k, of role R.
func slot[R keys.Role](name string, k **keys.Key[R]) trustFile {
	return trustFile{
		name: name,
		generate: func() (err error) {
			*k, err = keys.Generate[R]()
			return err
		},
		load: func(path string) (err error) {
			*k, err = keys.ReadSeedFile[R](path)
			return err
		},
		save: func(path string) error { return (*k).WriteSeedFile(path) },
	}
}

func (t *Trust) files() []trustFile {
	return []trustFile{
		slot(operatorFile, &t.operator),
		slot(systemFile, &t.system),
		slot(meshFile, &t.mesh),
		slot(meshSigningFile, &t.meshSigning),
	}
}

// Generate makes a fresh trust chain in memory.
func Generate() (*Trust, error) {
	t := &Trust{}
	for _, f := range t.files() {
		if err := f.generate(); err != nil {
			return nil, fmt.Errorf("generate %s: %w", f.name, err)
		}
	}
	return t, nil
}

// FromKeys builds a trust chain from its four keys held in memory, as a
// caller reading them from a secret store has them (the seeds decoded with
// keys.FromSeed, which checks each seed's kind). The two account keys and
// the signing key must be three different keys: a signing key equal to its
// account, or the system account doubling as the mesh account, is a
// misplaced seed, not a chain.
func FromKeys(operator *keys.Operator, system, mesh, meshSigning *keys.Account) (*Trust, error) {
	if operator == nil || system == nil || mesh == nil || meshSigning == nil {
		return nil, errors.New("trust: all four keys are needed (operator, system account, mesh account, mesh signing key)")
	}
	if system.Public() == mesh.Public() || system.Public() == meshSigning.Public() || mesh.Public() == meshSigning.Public() {
		return nil, errors.New("trust: the system account, mesh account and mesh signing key must be three different keys")
	}
	return &Trust{operator: operator, system: system, mesh: mesh, meshSigning: meshSigning}, nil
}

// Load reads a trust chain written by Save. It refuses seed files readable by
// group or others (as ssh does), since a leaked operator or signing seed lets
// anyone mint credentials for the mesh.
func Load(dir string) (*Trust, error) {
	t := &Trust{}
	for _, f := range t.files() {
		// keys.ReadSeedFile refuses over-permissive files and seeds of the
		// wrong kind, and names the file in its errors.
		if err := f.load(filepath.Join(dir, f.name)); err != nil {
			return nil, fmt.Errorf("load trust: %w", err)
		}
	}
	return t, nil
}

// Save writes the seeds to dir, all or nothing: the files are written to a
// temporary sibling directory (mode 0700, files 0600), flushed, and the
// directory is renamed into place. It fails if dir already holds files, so an
// existing trust chain is never overwritten.
func (t *Trust) Save(dir string) error {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("save trust: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+"-*")
	if err != nil {
		return fmt.Errorf("save trust: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once the rename has happened
	for _, f := range t.files() {
		// Each file is written 0600 and flushed; tmp is fresh, so nothing is
		// replaced.
		if err := f.save(filepath.Join(tmp, f.name)); err != nil {
			return fmt.Errorf("save trust: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return fmt.Errorf("save trust: %w", err)
	}
	// rename(2) replaces an empty directory but refuses a non-empty one,
	// which is exactly the "never overwrite keys" rule.
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("save trust: %s is not empty or not writable: %w", dir, err)
	}
	if err := syncDir(parent); err != nil {
		return fmt.Errorf("save trust: %w", err)
	}
	return nil
}

// LoadOrCreate loads the trust chain in dir, or generates and saves one when
// dir holds none of its files (first run). A directory holding only some of
// the files is an error: regenerating the missing keys would silently create a
// different mesh account and orphan its JetStream state.
func LoadOrCreate(dir string) (t *Trust, created bool, err error) {
	want := len((&Trust{}).files())
	present := 0
	for _, f := range (&Trust{}).files() {
		_, err := os.Stat(filepath.Join(dir, f.name))
		switch {
		case err == nil:
			present++
		case !errors.Is(err, fs.ErrNotExist):
			return nil, false, fmt.Errorf("load trust: %w", err)
		}
	}
	switch present {
	case want:
		t, err := Load(dir)
		return t, false, err
	case 0:
		t, err := Generate()
		if err != nil {
			return nil, false, err
		}
		if err := t.Save(dir); err != nil {
			return nil, false, err
		}
		return t, true, nil
	default:
		return nil, false, fmt.Errorf("load trust: %s holds only %d of %d key files; restore the missing ones or remove the directory to start a new mesh",
			dir, present, want)
	}
}

// syncDir makes a rename durable; it is best effort where directories cannot
// be opened for sync (Windows).
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// PublicKeys returns the public halves of the chain.
func (t *Trust) PublicKeys() PublicKeys {
	return PublicKeys{
		Operator:       t.operator.Public(),
		SystemAccount:  t.system.Public(),
		MeshAccount:    t.mesh.Public(),
		MeshSigningKey: t.meshSigning.Public(),
	}
}

// String lists the public keys; a Trust printed or logged shows no seed.
func (t *Trust) String() string {
	pk := t.PublicKeys()
	return fmt.Sprintf("operator=%s system_account=%s mesh_account=%s mesh_signing_key=%s",
		pk.Operator, pk.SystemAccount, pk.MeshAccount, pk.MeshSigningKey)
}

// GoString covers %#v.
func (t *Trust) GoString() string { return "creds.Trust{" + t.String() + "}" }

// LogValue makes slog record the public keys only.
func (t *Trust) LogValue() slog.Value {
	pk := t.PublicKeys()
	return slog.GroupValue(
		slog.String("operator", pk.Operator),
		slog.String("system_account", pk.SystemAccount),
		slog.String("mesh_account", pk.MeshAccount),
		slog.String("mesh_signing_key", pk.MeshSigningKey),
	)
}

// OperatorJWT returns a freshly signed, self-issued operator JWT naming the
// system account. The broker is given its decoded claims as trusted operator.
func (t *Trust) OperatorJWT() (string, error) {
	oc := jwt.NewOperatorClaims(t.operator.Public())
	oc.Name = OperatorName
	oc.SystemAccount = t.system.Public()
	s, err := oc.Encode(t.operator.NKey())
	if err != nil {
		return "", fmt.Errorf("encode operator jwt: %w", err)
	}
	return s, nil
}

// SystemAccountJWT returns the system account's JWT signed by the operator.
// The system account has no JetStream (the broker forbids it) and default limits.
func (t *Trust) SystemAccountJWT() (string, error) {
	ac := jwt.NewAccountClaims(t.system.Public())
	ac.Name = SystemAccountName
	return t.EncodeAccount(ac)
}

// MeshAccountClaims returns the mesh account's claims as this code defines
// them: JetStream enabled without limits, the signing key listed, and bearer
// tokens refused so every connection must prove possession of its key.
// Callers that keep state in the claims (revocations) merge it in before
// calling EncodeAccount.
func (t *Trust) MeshAccountClaims() *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(t.mesh.Public())
	ac.Name = MeshAccountName
	ac.SigningKeys.Add(t.meshSigning.Public())
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit,
		DiskStorage:   jwt.NoLimit,
		Streams:       jwt.NoLimit,
		Consumer:      jwt.NoLimit,
	}
	ac.Limits.DisallowBearer = true
	return ac
}

// MeshAccountJWT returns MeshAccountClaims signed by the operator.
func (t *Trust) MeshAccountJWT() (string, error) {
	return t.EncodeAccount(t.MeshAccountClaims())
}

// EncodeAccount validates and signs account claims with the operator key. It
// only signs the two accounts of this chain, so a bug elsewhere cannot make the
// operator vouch for a stranger's account.
func (t *Trust) EncodeAccount(ac *jwt.AccountClaims) (string, error) {
	if ac == nil {
		return "", errors.New("encode account jwt: nil claims")
	}
	if ac.Subject != t.system.Public() && ac.Subject != t.mesh.Public() {
		return "", fmt.Errorf("encode account jwt: %s is not an account of this operator", ac.Subject)
	}
	vr := jwt.CreateValidationResults()
	ac.Validate(vr)
	if vr.IsBlocking(true) {
		return "", fmt.Errorf("encode account jwt: invalid claims: %v", vr.Errors())
	}
	s, err := ac.Encode(t.operator.NKey())
	if err != nil {
		return "", fmt.Errorf("encode account jwt: %w", err)
	}
	return s, nil
}
