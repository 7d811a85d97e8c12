package cloudsecrets

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/nats-io/jwt/v2"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// CallTimeout bounds every call to Secret Manager. Without a deadline of
// its own the client retries Unavailable for up to 60 s (DESIGN §7), which
// would hold a cold start for a minute before saying anything.
const CallTimeout = 10 * time.Second

// What went wrong, for errors.Is. Every error of this package names the
// secret and says what to do; these only classify it.
var (
	ErrNoSecret        = errors.New("secret does not exist")
	ErrNoVersion       = errors.New("secret has no version")
	ErrNotEnabled      = errors.New("secret's latest version is not enabled")
	ErrDenied          = errors.New("permission denied")
	ErrChecksum        = errors.New("secret payload does not match its checksum")
	ErrBadPayload      = errors.New("secret payload is not what the secret holds")
	ErrHalfInitialized = errors.New("trust chain is half initialized")
	ErrForeign         = errors.New("secret was made from another trust chain")
)

// secretError is an error whose message is written for a person and whose
// kind and cause stay reachable through errors.Is and errors.As.
type secretError struct {
	kind  error
	msg   string
	cause error
}

func (e *secretError) Error() string   { return e.msg }
func (e *secretError) Unwrap() []error { return []error{e.kind, e.cause} }

func errorf(kind, cause error, format string, args ...any) error {
	return &secretError{kind: kind, msg: fmt.Sprintf(format, args...), cause: cause}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(data []byte) int64 { return int64(crc32.Checksum(data, castagnoli)) }

// Keys are what the control plane reads at cold start.
type Keys struct {
	Trust     *creds.Trust    // the operator, both accounts and the signing key
	Registrar *keys.Registrar // signs the registrar's cards
	Services  *keys.Agent     // signs the account views' bus calls
	// Export signs audit exports; nil when its secret has no version yet
	// (a mesh made before it: `meshd cloud init` adds it), and the export
	// answers 501 until then.
	Export *keys.Agent
}

// Open reads Keys from project's Secret Manager with a client of its own,
// built from opts (none: Application Default Credentials), and closes it:
// one call for a Cloud Function's lazy init.
func Open(ctx context.Context, project string, opts ...option.ClientOption) (*Keys, error) {
	c, err := secretmanager.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("secret manager client: %w", err)
	}
	defer c.Close()
	return Load(ctx, c, project)
}

// Load reads the latest version of the trust seeds, the registrar seed and
// the services seed of project, all at once, and checks each: its CRC32C
// checksum, and that it holds a seed of the right kind. The error names
// every secret that failed and what to do about it.
func Load(ctx context.Context, c *secretmanager.Client, project string) (*Keys, error) {
	if project == "" {
		return nil, errors.New("load secrets: no project")
	}
	r := reader{c: c, project: project}
	var (
		k                          Keys
		op                         *keys.Operator
		sys, mesh, signing         *keys.Account
		errOp, errSys, errMesh     error
		errSigning, errReg, errSvc error
		errExport                  error
		wg                         sync.WaitGroup
	)
	// Seven reads in parallel: a cold start waits for the slowest, not the sum.
	wg.Go(func() { op, errOp = readSeed[keys.OperatorRole](ctx, r, OperatorSeed) })
	wg.Go(func() { sys, errSys = readSeed[keys.AccountRole](ctx, r, SystemAccountSeed) })
	wg.Go(func() { mesh, errMesh = readSeed[keys.AccountRole](ctx, r, AccountSeed) })
	wg.Go(func() { signing, errSigning = readSeed[keys.AccountRole](ctx, r, AccountSigningSeed) })
	wg.Go(func() { k.Registrar, errReg = readSeed[keys.RegistrarRole](ctx, r, RegistrarSeed) })
	wg.Go(func() { k.Services, errSvc = readSeed[keys.AgentRole](ctx, r, ServicesSeed) })
	wg.Go(func() { k.Export, errExport = readSeed[keys.AgentRole](ctx, r, ExportSeed) })
	wg.Wait()
	if errors.Is(errExport, ErrNoSecret) || errors.Is(errExport, ErrNoVersion) {
		// Added after the first meshes were made: its absence costs the
		// export alone, not every route.
		errExport = nil
	}
	if err := errors.Join(errOp, errSys, errMesh, errSigning, errReg, errSvc, errExport); err != nil {
		return nil, err
	}
	t, err := creds.FromKeys(op, sys, mesh, signing)
	if err != nil {
		return nil, errorf(ErrBadPayload, err, "secrets %s, %s, %s, %s: %v", OperatorSeed, SystemAccountSeed, AccountSeed, AccountSigningSeed, err)
	}
	k.Trust = t
	return &k, nil
}

// WorkerKeys are what a bus worker reads at start.
type WorkerKeys struct {
	Creds    creds.UserCreds // its NATS user: creds.UserCreds.NATSOption connects with it
	Services *keys.Agent     // the key its answers are signed with
}

// LoadWorker reads worker's creds secret and the services seed. It needs
// access to those two secrets only, not to the trust seeds.
func LoadWorker(ctx context.Context, c *secretmanager.Client, project, worker string) (*WorkerKeys, error) {
	if !workerName.MatchString(worker) {
		return nil, fmt.Errorf("load worker secrets: %q is not a worker name", worker)
	}
	r := reader{c: c, project: project}
	var (
		w               WorkerKeys
		errCreds, errSv error
		wg              sync.WaitGroup
	)
	wg.Go(func() { w.Creds, errCreds = r.workerCreds(ctx, WorkerCredsSecret(worker), nil) })
	wg.Go(func() { w.Services, errSv = readSeed[keys.AgentRole](ctx, r, ServicesSeed) })
	wg.Wait()
	if err := errors.Join(errCreds, errSv); err != nil {
		return nil, err
	}
	return &w, nil
}

// LoadTrust reads the four trust seeds of project alone (no registrar or
// services seed): what the rooms worker needs to mint acl room credentials
// and revoke them (it re-signs the mesh account JWT with the operator key).
func LoadTrust(ctx context.Context, c *secretmanager.Client, project string) (*creds.Trust, error) {
	if project == "" {
		return nil, errors.New("load trust: no project")
	}
	return loadTrust(ctx, reader{c: c, project: project})
}

// OpenTrust reads the trust chain (LoadTrust) with a client of its own.
func OpenTrust(ctx context.Context, project string, opts ...option.ClientOption) (*creds.Trust, error) {
	c, err := secretmanager.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("secret manager client: %w", err)
	}
	defer c.Close()
	return LoadTrust(ctx, c, project)
}

// reader reads one project's secrets.
type reader struct {
	c       *secretmanager.Client
	project string
}

// access returns the payload of id's latest version and that version's
// name, after checking the payload against its CRC32C when the service
// sent one.
func (r reader) access(ctx context.Context, id string) ([]byte, string, error) {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	res, err := r.c.AccessSecretVersion(cctx, &secretmanagerpb.AccessSecretVersionRequest{Name: latestVersion(r.project, id)})
	if err != nil {
		return nil, "", r.explain(ctx, "read", id, err)
	}
	p := res.GetPayload()
	if p.DataCrc32C != nil && *p.DataCrc32C != checksum(p.GetData()) {
		clear(p.Data)
		return nil, "", errorf(ErrChecksum, nil, "secret %s (%s): the payload does not match its CRC32C checksum, so it was damaged in transit or storage: retry, and if it persists the stored version is damaged",
			id, res.GetName())
	}
	return p.GetData(), res.GetName(), nil
}

// readSeed reads id's latest version as a seed of role R.
func readSeed[R keys.Role](ctx context.Context, r reader, id string) (*keys.Key[R], error) {
	data, version, err := r.access(ctx, id)
	if err != nil {
		return nil, err
	}
	defer clear(data)
	k, err := keys.FromSeed[R](data) // its errors never echo the seed
	if err != nil {
		return nil, errorf(ErrBadPayload, err, "secret %s (%s) does not hold the seed it should: %v", id, version, err)
	}
	return k, nil
}

// workerCreds reads id's latest version as a NATS creds file. With a trust
// chain, it also checks the user was minted by that chain's signing key for
// its mesh account.
func (r reader) workerCreds(ctx context.Context, id string, t *creds.Trust) (creds.UserCreds, error) {
	data, version, err := r.access(ctx, id)
	if err != nil {
		return creds.UserCreds{}, err
	}
	defer clear(data)
	uc, err := parseCreds(data)
	if err != nil {
		return creds.UserCreds{}, errorf(ErrBadPayload, err, "secret %s (%s) is not a NATS creds file: %v", id, version, err)
	}
	if t != nil {
		claims, err := jwt.DecodeUserClaims(uc.JWT)
		if err != nil {
			return creds.UserCreds{}, errorf(ErrBadPayload, err, "secret %s (%s): %v", id, version, err)
		}
		pk := t.PublicKeys()
		if claims.Issuer != pk.MeshSigningKey || claims.IssuerAccount != pk.MeshAccount {
			return creds.UserCreds{}, errorf(ErrForeign, nil,
				"secret %s (%s) was minted by another trust chain (signing key %s for account %s, this mesh's are %s and %s): disable its versions and run meshd cloud init again",
				id, version, claims.Issuer, claims.IssuerAccount, pk.MeshSigningKey, pk.MeshAccount)
		}
	}
	return uc, nil
}

// parseCreds reads a creds file's user JWT and seed.
func parseCreds(data []byte) (creds.UserCreds, error) {
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return creds.UserCreds{}, err
	}
	kp, err := jwt.ParseDecoratedNKey(data)
	if err != nil {
		return creds.UserCreds{}, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return creds.UserCreds{}, err
	}
	defer clear(seed)
	key, err := keys.FromSeed[keys.CredentialRole](seed)
	if err != nil {
		return creds.UserCreds{}, err
	}
	claims, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return creds.UserCreds{}, err
	}
	if claims.Subject != key.Public() {
		return creds.UserCreds{}, fmt.Errorf("its JWT is for %s but its seed is %s's", claims.Subject, key.Public())
	}
	return creds.UserCreds{JWT: token, Key: key}, nil
}

// roles names the IAM role each operation needs, for PermissionDenied.
var roles = map[string]string{
	"read":   "roles/secretmanager.secretAccessor",
	"add":    "roles/secretmanager.secretVersionAdder",
	"look":   "roles/secretmanager.viewer",
	"create": "roles/secretmanager.admin",
}

// explain turns a failed call about secret id into an error that says what
// to do. It decides on the gRPC code only (the ErrorInfo reasons are not a
// documented contract). A NotFound from a read is asked once more, with
// GetSecret, whether the container or only its version is missing: the
// service answers the same code for both.
func (r reader) explain(ctx context.Context, op, id string, err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		if op == "read" {
			if exists, gerr := r.exists(ctx, id); gerr == nil && exists {
				return errorf(ErrNoVersion, err, "secret %s has no version: run `meshd cloud init --project %s`", id, r.project)
			}
		}
		return errorf(ErrNoSecret, err, "secret %s does not exist in project %s: `terraform apply` creates it, then run `meshd cloud init --project %s`",
			id, r.project, r.project)
	case codes.FailedPrecondition:
		return errorf(ErrNotEnabled, err, "secret %s: its latest version is disabled or destroyed: enable it again (gcloud secrets versions enable); a new version of one trust seed alone would break the chain", id)
	case codes.PermissionDenied:
		return errorf(ErrDenied, err, "secret %s in project %s: permission denied: the caller needs %s on it", id, r.project, roles[op])
	case codes.Unauthenticated:
		return errorf(ErrDenied, err, "secret %s: Secret Manager refused the caller's credentials: on a workstation run `gcloud auth application-default login`; elsewhere check the service account", id)
	case codes.DeadlineExceeded:
		if ctx.Err() == nil {
			return fmt.Errorf("secret %s: Secret Manager did not answer within %s: retry: %w", id, CallTimeout, err)
		}
	}
	return fmt.Errorf("secret %s: %s: %w", id, op, err)
}

// exists reports whether the container id exists.
func (r reader) exists(ctx context.Context, id string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	_, err := r.c.GetSecret(cctx, &secretmanagerpb.GetSecretRequest{Name: secretName(r.project, id)})
	switch {
	case err == nil:
		return true, nil
	case status.Code(err) == codes.NotFound:
		return false, nil
	}
	return false, r.explain(ctx, "look", id, err)
}

// EmulatorToken is the bearer token sent to a Secret Manager emulator.
const EmulatorToken = "mesh-secretmanager-emulator"

// EmulatorOptions reach a Secret Manager emulator at host (the value of
// MESH_SECRETMANAGER_EMULATOR_HOST, as FIRESTORE_EMULATOR_HOST is for
// Firestore): no TLS, the bearer token EmulatorToken. For tests of the
// function and worker binaries, which are separate processes; empty host
// means the real service with Application Default Credentials. Only a
// loopback address is taken: set by mistake in a deployment, the variable
// would otherwise let whoever answers at that host hand the instance its
// keys.
func EmulatorOptions(host string) ([]option.ClientOption, error) {
	if host == "" {
		return nil, nil
	}
	h, _, err := net.SplitHostPort(host)
	if ip := net.ParseIP(h); err != nil || (h != "localhost" && (ip == nil || !ip.IsLoopback())) {
		return nil, fmt.Errorf("MESH_SECRETMANAGER_EMULATOR_HOST %q: an emulator is reached on a loopback host:port only (tests); unset it to use Secret Manager", host)
	}
	return []option.ClientOption{option.WithEndpoint(host),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: EmulatorToken, TokenType: "Bearer"}))}, nil
}

// OpenWorker reads a worker's keys (LoadWorker) with a client of its own.
func OpenWorker(ctx context.Context, project, worker string, opts ...option.ClientOption) (*WorkerKeys, error) {
	c, err := secretmanager.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("secret manager client: %w", err)
	}
	defer c.Close()
	return LoadWorker(ctx, c, project, worker)
}
