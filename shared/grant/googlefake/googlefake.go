// Package googlefake is Google Cloud as the cloud grants meet it, in
// process, for tests: one gRPC server on a loopback port that implements
// the IAM Credentials, Resource Manager (projects), Secret Manager and
// Cloud Run (worker pools) services over ONE in-memory world — which
// accounts exist, who may mint tokens for whom, which principal holds
// which permission in which project, the secrets and the worker pools —
// so tests drive the real client libraries (DESIGN §7, "How the Google
// fakes work").
//
// Every call must carry a bearer token the world issued (Token, or one a
// GenerateAccessToken minted); the world reads the principal from it, so a
// test asserts who made each call (Calls) instead of assuming it. Errors
// carry a google.rpc.ErrorInfo as Google's do, so the clients' apierror
// parsing runs; long-running operations are answered done. Reading a
// secret back (AccessSecretVersion) fails the test: the mesh only ever adds
// versions.
//
// It is test support, not a production path; it lives outside _test files
// so that tests of several packages (shared/grant, functions/grants,
// devenv) start the same world.
package googlefake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/iam/credentials/apiv1/credentialspb"
	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"cloud.google.com/go/resourcemanager/apiv3/resourcemanagerpb"
	"cloud.google.com/go/run/apiv2/runpb"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The permissions the world checks, by their Google names.
const (
	PermProjectsGet       = "resourcemanager.projects.get"
	PermSecretsCreate     = "secretmanager.secrets.create"
	PermVersionsAdd       = "secretmanager.versions.add"
	PermWorkerPoolsCreate = "run.workerpools.create"
	PermWorkerPoolsUpdate = "run.workerpools.update"
)

// CustomerPermissions are what the published role list gives the
// customer's account in its project (shared/grant's Roles), as the world
// checks them.
var CustomerPermissions = []string{PermProjectsGet, PermSecretsCreate, PermVersionsAdd, PermWorkerPoolsCreate, PermWorkerPoolsUpdate}

// Call is one call the world received.
type Call struct {
	// Method is the RPC's short name: "GenerateAccessToken", "GetProject",
	// "CreateSecret", "AddSecretVersion", "UpdateWorkerPool", ...
	Method string
	// Principal is the account the bearer token stands for ("" when the
	// token was unknown).
	Principal string
	// Resource is the name the request is about.
	Resource string
	// Code is how it was answered.
	Code codes.Code
}

// Version is one stored secret version.
type Version struct {
	Data []byte
	// Checksummed says the payload arrived with a data_crc32c (which the
	// world checked against the data).
	Checksummed bool
	// By is the principal that added it.
	By string
}

// Fake is a running world.
type Fake struct {
	// Addr is the loopback address it listens on.
	Addr string
	t    testing.TB
	srv  *grpc.Server

	mu       sync.Mutex
	tokens   map[string]string                    // bearer token → principal
	accounts map[string]map[string]bool           // service account → who may mint its tokens
	actAs    map[string]map[string]bool           // service account → who may run things as it
	perms    map[string]map[string]bool           // principal → "project\x00permission"
	projects map[string]string                    // project id → the id its read answers with
	labels   map[string]map[string]string         // project id → its labels
	outages  map[string]codes.Code                // method → the code every call of it gets
	hooks    map[string]func(ctx context.Context) // method → run before each call of it
	secrets  map[string][]Version                 // projects/P/secrets/S → versions (1-based by index+1)
	pools    map[string]*poolRecord               // projects/P/locations/L/workerPools/N
	calls    []Call
	seq      int
}

type poolRecord struct {
	pb *runpb.WorkerPool
	by string
}

// Start serves a new, empty world on a free loopback port until the test
// ends.
func Start(t testing.TB) *Fake {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("googlefake: %v", err)
	}
	f := &Fake{Addr: lis.Addr().String(), t: t, tokens: map[string]string{}, accounts: map[string]map[string]bool{},
		actAs: map[string]map[string]bool{}, perms: map[string]map[string]bool{}, projects: map[string]string{}, labels: map[string]map[string]string{},
		outages: map[string]codes.Code{}, hooks: map[string]func(context.Context){}, secrets: map[string][]Version{}, pools: map[string]*poolRecord{}}
	f.srv = grpc.NewServer(grpc.UnaryInterceptor(f.intercept))
	credentialspb.RegisterIAMCredentialsServer(f.srv, iamService{Fake: f})
	resourcemanagerpb.RegisterProjectsServer(f.srv, projectsService{Fake: f})
	secretmanagerpb.RegisterSecretManagerServiceServer(f.srv, secretsService{Fake: f})
	runpb.RegisterWorkerPoolsServer(f.srv, runService{Fake: f})
	go func() { _ = f.srv.Serve(lis) }()
	t.Cleanup(f.srv.Stop)
	return f
}

// Options reach the world with the real clients as the holder of token:
// its endpoint, no TLS, and the token as a static bearer.
func (f *Fake) Options(token string) []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(f.Addr),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, TokenType: "Bearer"})),
	}
}

// --- arranging the world ---

// Token issues a bearer token standing for principal (the runtime's own
// identity, as its application default credentials would give it).
func (f *Fake) Token(principal string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.issue(principal)
}

func (f *Fake) issue(principal string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	tok := "ya29.fake-" + hex.EncodeToString(b)
	f.tokens[tok] = principal
	return tok
}

// AddAccount makes a service account exist (with nobody allowed to mint
// its tokens yet).
func (f *Fake) AddAccount(email string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.accounts[email] == nil {
		f.accounts[email] = map[string]bool{}
	}
}

// DeleteAccount deletes a service account, its bindings with it.
func (f *Fake) DeleteAccount(email string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.accounts, email)
	delete(f.actAs, email)
}

// AllowTokenCreator lets member mint tokens for target
// (roles/iam.serviceAccountTokenCreator on target).
func (f *Fake) AllowTokenCreator(target, member string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.accounts[target] != nil {
		f.accounts[target][member] = true
	}
}

// RemoveTokenCreator removes that binding: what a customer does to revoke.
func (f *Fake) RemoveTokenCreator(target, member string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.accounts[target], member)
}

// AllowActAs lets member run workloads as sa (iam.serviceAccounts.actAs).
func (f *Fake) AllowActAs(sa, member string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.actAs[sa] == nil {
		f.actAs[sa] = map[string]bool{}
	}
	f.actAs[sa][member] = true
}

// AddProject makes a project exist; its read answers for itself.
func (f *Fake) AddProject(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.projects[id] = id
}

// LabelProject sets a label on project (gcloud projects update
// --update-labels); an empty value removes it. The read answers it.
func (f *Fake) LabelProject(project, key, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.labels[project] == nil {
		f.labels[project] = map[string]string{}
	}
	if value == "" {
		delete(f.labels[project], key)
		return
	}
	f.labels[project][key] = value
}

// GrantLabel is the label with which a customer names the mesh account a
// project serves (shared/grant's ProjectLabel; repeated here so that the
// world does not import the code it tests).
const GrantLabel = "agentmesh-grant"

// AnswerProjectAs makes the read of project id answer for another project.
func (f *Fake) AnswerProjectAs(id, other string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.projects[id] = other
}

// Allow gives principal permissions in project.
func (f *Fake) Allow(principal, project string, perms ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.perms[principal] == nil {
		f.perms[principal] = map[string]bool{}
	}
	for _, p := range perms {
		f.perms[principal][project+"\x00"+p] = true
	}
}

// Deny takes permissions in project away from principal.
func (f *Fake) Deny(principal, project string, perms ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range perms {
		delete(f.perms[principal], project+"\x00"+p)
	}
}

// Outage makes every call of method (its short name) fail with code, until
// EndOutage.
func (f *Fake) Outage(method string, code codes.Code) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outages[method] = code
}

// OnCall runs fn before every call of method (its short name), with the
// call's context, until it is replaced (nil removes it): a test can block
// a call until its deadline, or change the world, or the mesh's store,
// while a call is in flight. A call whose context ended in fn is answered
// with the context's status, as a server would.
func (f *Fake) OnCall(method string, fn func(ctx context.Context)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fn == nil {
		delete(f.hooks, method)
		return
	}
	f.hooks[method] = fn
}

// EndOutage ends an Outage.
func (f *Fake) EndOutage(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.outages, method)
}

// Provider is the mesh's side of the chain: its runtime identity and its
// deployer, which the runtime may impersonate. It returns a bearer token
// of the runtime identity.
func (f *Fake) Provider(runtime, deployer string) string {
	f.AddAccount(runtime)
	f.AddAccount(deployer)
	f.AllowTokenCreator(deployer, runtime)
	return f.Token(runtime)
}

// Customer is a customer who followed the setup (docs/grants.md): the
// project, labelled with the mesh account it serves (meshAccount, the
// account id, as the label's value), its service account holding the
// published roles and allowed to run workloads as itself, and the one
// binding that lets deployer mint its tokens.
func (f *Fake) Customer(project, sa, deployer, meshAccount string) {
	f.AddProject(project)
	f.LabelProject(project, GrantLabel, meshAccount)
	f.AddAccount(sa)
	f.Allow(sa, project, CustomerPermissions...)
	f.AllowActAs(sa, sa)
	f.AllowTokenCreator(sa, deployer)
}

// --- inspecting the world ---

// Calls returns every call so far, in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Secret returns the versions of projects/project/secrets/id.
func (f *Fake) Secret(project, id string) []Version {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.secrets["projects/"+project+"/secrets/"+id])
}

// WorkerPool returns the worker pool of that full name and the principal
// that last wrote it.
func (f *Fake) WorkerPool(name string) (*runpb.WorkerPool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pools[name]
	if p == nil {
		return nil, ""
	}
	return proto.Clone(p.pb).(*runpb.WorkerPool), p.by
}

// --- the services ---

// The four services over the one world; what a service does not implement
// answers Unimplemented.
type (
	iamService struct {
		credentialspb.UnimplementedIAMCredentialsServer
		*Fake
	}
	projectsService struct {
		resourcemanagerpb.UnimplementedProjectsServer
		*Fake
	}
	secretsService struct {
		secretmanagerpb.UnimplementedSecretManagerServiceServer
		*Fake
	}
	runService struct {
		runpb.UnimplementedWorkerPoolsServer
		*Fake
	}
)

type principalKey struct{}

// intercept reads the caller from the bearer token, answers an outage, and
// records every call with its outcome.
func (f *Fake) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	principal := ""
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			principal = f.tokens[tok]
		}
	}
	outage, down := f.outages[method]
	hook := f.hooks[method]
	f.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
	var resp any
	var err error
	switch {
	case ctx.Err() != nil:
		err = status.FromContextError(ctx.Err()).Err()
	case down:
		err = status.Error(outage, "The service is currently unavailable.")
	case principal == "":
		err = fail(codes.Unauthenticated, "ACCESS_TOKEN_TYPE_UNSUPPORTED", "googleapis.com", "Request had invalid authentication credentials.", nil)
	default:
		resp, err = handler(context.WithValue(ctx, principalKey{}, principal), req)
	}
	f.mu.Lock()
	f.calls = append(f.calls, Call{Method: method, Principal: principal, Resource: resourceOf(req), Code: status.Code(err)})
	f.mu.Unlock()
	return resp, err
}

func resourceOf(req any) string {
	switch r := req.(type) {
	case *credentialspb.GenerateAccessTokenRequest:
		return r.GetName()
	case *resourcemanagerpb.GetProjectRequest:
		return r.GetName()
	case *secretmanagerpb.CreateSecretRequest:
		return r.GetParent() + "/secrets/" + r.GetSecretId()
	case *secretmanagerpb.AddSecretVersionRequest:
		return r.GetParent()
	case *secretmanagerpb.AccessSecretVersionRequest:
		return r.GetName()
	case *secretmanagerpb.GetSecretRequest:
		return r.GetName()
	case *runpb.UpdateWorkerPoolRequest:
		return r.GetWorkerPool().GetName()
	case *runpb.GetWorkerPoolRequest:
		return r.GetName()
	}
	return ""
}

func principalOf(ctx context.Context) string { p, _ := ctx.Value(principalKey{}).(string); return p }

// fail is a status with an ErrorInfo, as Google's APIs answer.
func fail(code codes.Code, reason, domain, msg string, meta map[string]string) error {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain, Metadata: meta})
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

func denied(domain, perm, resource string) error {
	return fail(codes.PermissionDenied, "IAM_PERMISSION_DENIED", domain,
		fmt.Sprintf("Permission '%s' denied on resource '%s' (or it may not exist).", perm, resource), map[string]string{"permission": perm, "resource": resource})
}

// allowed reports whether principal holds perm in project (f.mu held).
func (f *Fake) allowed(principal, project, perm string) bool {
	return f.perms[principal][project+"\x00"+perm]
}

var saName = regexp.MustCompile(`^projects/-/serviceAccounts/([^/]+@[^/]+)$`)

// GenerateAccessToken walks the delegation chain: the caller must be a
// token creator of the first account, each account of the next, and the
// last of the target. A missing account is NotFound; a missing binding is
// PermissionDenied (what IAM answers).
func (f iamService) GenerateAccessToken(ctx context.Context, req *credentialspb.GenerateAccessTokenRequest) (*credentialspb.GenerateAccessTokenResponse, error) {
	if len(req.GetScope()) == 0 {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "iamcredentials.googleapis.com", "Scope required.", nil)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := principalOf(ctx)
	for _, name := range append(slices.Clone(req.GetDelegates()), req.GetName()) {
		m := saName.FindStringSubmatch(name)
		if m == nil {
			return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "iamcredentials.googleapis.com", fmt.Sprintf("Invalid form of account ID %s. Should be [Gaia ID |Email |Unique ID |] of the account", name), nil)
		}
		creators, ok := f.accounts[m[1]]
		if !ok {
			return nil, fail(codes.NotFound, "NOT_FOUND", "iamcredentials.googleapis.com", fmt.Sprintf("Not found; Gaia id not found for email %s", m[1]), nil)
		}
		if !creators[prev] {
			return nil, denied("iam.googleapis.com", "iam.serviceAccounts.getAccessToken", name)
		}
		prev = m[1]
	}
	return &credentialspb.GenerateAccessTokenResponse{AccessToken: f.issue(prev), ExpireTime: timestamppb.New(time.Now().Add(time.Hour))}, nil
}

// GetProject answers a project the caller may read (and, like Google, the
// same refusal for one that does not exist).
func (f projectsService) GetProject(ctx context.Context, req *resourcemanagerpb.GetProjectRequest) (*resourcemanagerpb.Project, error) {
	id, ok := strings.CutPrefix(req.GetName(), "projects/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "cloudresourcemanager.googleapis.com", "Invalid project name.", nil)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	answer, exists := f.projects[id]
	if !exists || !f.allowed(principalOf(ctx), id, PermProjectsGet) {
		return nil, denied("cloudresourcemanager.googleapis.com", PermProjectsGet, req.GetName())
	}
	var labels map[string]string
	if len(f.labels[id]) > 0 {
		labels = maps.Clone(f.labels[id])
	}
	return &resourcemanagerpb.Project{Name: "projects/" + numberOf(answer), ProjectId: answer, State: resourcemanagerpb.Project_ACTIVE, Labels: labels}, nil
}

// numberOf is a stable project number for an id.
func numberOf(id string) string {
	return fmt.Sprint(100000000000 + int64(crc32.ChecksumIEEE([]byte(id))))
}

var secretParent = regexp.MustCompile(`^projects/([^/]+)$`)
var secretFull = regexp.MustCompile(`^projects/([^/]+)/secrets/([A-Za-z0-9_-]{1,255})$`)

// CreateSecret makes a secret container; AlreadyExists when it is there.
func (f secretsService) CreateSecret(ctx context.Context, req *secretmanagerpb.CreateSecretRequest) (*secretmanagerpb.Secret, error) {
	m := secretParent.FindStringSubmatch(req.GetParent())
	name := req.GetParent() + "/secrets/" + req.GetSecretId()
	if m == nil || !secretFull.MatchString(name) || req.GetSecret().GetReplication().GetReplication() == nil {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "secretmanager.googleapis.com", "Invalid secret, name or replication.", nil)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(principalOf(ctx), m[1], PermSecretsCreate) {
		return nil, denied("secretmanager.googleapis.com", PermSecretsCreate, req.GetParent())
	}
	if _, ok := f.secrets[name]; ok {
		return nil, fail(codes.AlreadyExists, "ALREADY_EXISTS", "secretmanager.googleapis.com", fmt.Sprintf("Secret [%s] already exists.", name), nil)
	}
	f.secrets[name] = nil
	return &secretmanagerpb.Secret{Name: name, Replication: req.GetSecret().GetReplication(), Labels: req.GetSecret().GetLabels(), CreateTime: timestamppb.Now()}, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AddSecretVersion stores the next version, checking a given checksum.
func (f secretsService) AddSecretVersion(ctx context.Context, req *secretmanagerpb.AddSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	m := secretFull.FindStringSubmatch(req.GetParent())
	if m == nil {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "secretmanager.googleapis.com", "Invalid secret name.", nil)
	}
	data := req.GetPayload().GetData()
	crc := req.GetPayload().DataCrc32C
	if crc != nil && *crc != int64(crc32.Checksum(data, castagnoli)) {
		return nil, fail(codes.InvalidArgument, "DATA_CRC32C_MISMATCH", "secretmanager.googleapis.com", "Checksum mismatch.", nil)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.allowed(principalOf(ctx), m[1], PermVersionsAdd) {
		return nil, denied("secretmanager.googleapis.com", PermVersionsAdd, req.GetParent())
	}
	vs, ok := f.secrets[req.GetParent()]
	if !ok {
		return nil, fail(codes.NotFound, "NOT_FOUND", "secretmanager.googleapis.com", fmt.Sprintf("Secret [%s] not found.", req.GetParent()), nil)
	}
	f.secrets[req.GetParent()] = append(vs, Version{Data: slices.Clone(data), Checksummed: crc != nil, By: principalOf(ctx)})
	return &secretmanagerpb.SecretVersion{Name: fmt.Sprintf("%s/versions/%d", req.GetParent(), len(vs)+1), State: secretmanagerpb.SecretVersion_ENABLED,
		CreateTime: timestamppb.Now(), ClientSpecifiedPayloadChecksum: crc != nil}, nil
}

// AccessSecretVersion fails the test: the mesh places secrets in a
// customer's project and never reads one back.
func (f secretsService) AccessSecretVersion(ctx context.Context, req *secretmanagerpb.AccessSecretVersionRequest) (*secretmanagerpb.AccessSecretVersionResponse, error) {
	f.t.Errorf("googlefake: AccessSecretVersion(%s) by %s: a secret placed in a customer's project must never be read back", req.GetName(), principalOf(ctx))
	return nil, denied("secretmanager.googleapis.com", "secretmanager.versions.access", req.GetName())
}

var poolName = regexp.MustCompile(`^projects/([^/]+)/locations/([a-z0-9-]+)/workerPools/([a-z]([-a-z0-9]*[a-z0-9])?)$`)

// UpdateWorkerPool writes a worker pool (creating it with allow_missing):
// the caller needs the permissions in the project and actAs on the
// template's service account, and every secret the containers name must
// exist with that version. The operation is answered done.
func (f runService) UpdateWorkerPool(ctx context.Context, req *runpb.UpdateWorkerPoolRequest) (*longrunningpb.Operation, error) {
	wp := req.GetWorkerPool()
	m := poolName.FindStringSubmatch(wp.GetName())
	if m == nil || len(wp.GetTemplate().GetContainers()) == 0 || wp.GetTemplate().GetContainers()[0].GetImage() == "" {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "run.googleapis.com", "Invalid worker pool: a name and a container image are required.", nil)
	}
	project := m[1]
	caller := principalOf(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	_, exists := f.pools[wp.GetName()]
	switch {
	case !exists && !req.GetAllowMissing():
		return nil, fail(codes.NotFound, "NOT_FOUND", "run.googleapis.com", fmt.Sprintf("Resource '%s' was not found", wp.GetName()), nil)
	case !exists && !f.allowed(caller, project, PermWorkerPoolsCreate):
		return nil, denied("run.googleapis.com", PermWorkerPoolsCreate, wp.GetName())
	case exists && !f.allowed(caller, project, PermWorkerPoolsUpdate):
		return nil, denied("run.googleapis.com", PermWorkerPoolsUpdate, wp.GetName())
	}
	sa := wp.GetTemplate().GetServiceAccount()
	if _, ok := f.accounts[sa]; !ok || !f.actAs[sa][caller] {
		return nil, denied("iam.googleapis.com", "iam.serviceAccounts.actAs", "projects/-/serviceAccounts/"+sa)
	}
	for _, c := range wp.GetTemplate().GetContainers() {
		for _, e := range c.GetEnv() {
			ref := e.GetValueSource().GetSecretKeyRef()
			if ref == nil {
				continue
			}
			vs, ok := f.secrets["projects/"+project+"/secrets/"+ref.GetSecret()]
			n, err := strconv.Atoi(ref.GetVersion())
			if ref.GetVersion() == "latest" {
				n, err = len(vs), nil
			}
			if !ok || err != nil || n < 1 || n > len(vs) {
				return nil, fail(codes.FailedPrecondition, "FAILED_PRECONDITION", "run.googleapis.com",
					fmt.Sprintf("Secret projects/%s/secrets/%s/versions/%s was not found", project, ref.GetSecret(), ref.GetVersion()), nil)
			}
		}
	}
	out := proto.Clone(wp).(*runpb.WorkerPool)
	out.UpdateTime = timestamppb.Now()
	out.LastModifier = caller
	f.seq++
	out.Generation = int64(f.seq)
	f.pools[wp.GetName()] = &poolRecord{pb: out, by: caller}
	res, err := anypb.New(out)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &longrunningpb.Operation{Name: fmt.Sprintf("projects/%s/locations/%s/operations/op-%d", project, m[2], f.seq), Done: true,
		Result: &longrunningpb.Operation_Response{Response: res}}, nil
}

// GetWorkerPool answers a worker pool the caller may see.
func (f runService) GetWorkerPool(ctx context.Context, req *runpb.GetWorkerPoolRequest) (*runpb.WorkerPool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pools[req.GetName()]
	if p == nil {
		return nil, fail(codes.NotFound, "NOT_FOUND", "run.googleapis.com", fmt.Sprintf("Resource '%s' was not found", req.GetName()), nil)
	}
	return proto.Clone(p.pb).(*runpb.WorkerPool), nil
}
