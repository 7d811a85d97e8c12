// Package secretfake is an in-process Secret Manager for tests: a gRPC
// server on a loopback port that implements the calls the mesh makes
// (secretmanagerpb.SecretManagerServiceServer) over an in-memory world, so
// tests drive the real client library (DESIGN §7). It is test support, not
// a production path; it lives outside _test files so that tests of other
// packages can start one.
//
// What it checks, as the real service does: every call carries the bearer
// token the fake was started with (Unauthenticated otherwise); secret IDs
// are 1–255 letters, digits, '-' and '_'; a payload is at most 64 KiB and,
// when it carries a CRC32C, matches it; "latest" is the most recently
// created version whatever its state, and reading a version that is not
// enabled is FailedPrecondition. Errors carry a google.rpc.ErrorInfo, so the
// client's apierror parsing runs; the reasons are the fake's own, and the
// code under test must decide on the gRPC code, never on a reason.
package secretfake

import (
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
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
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Token is the bearer token the fake accepts unless Start is given another.
const Token = "secretfake-test-token"

// Domain is the ErrorInfo domain of the fake's errors, the real service's.
const Domain = "secretmanager.googleapis.com"

// MaxPayload is the real service's payload limit.
const MaxPayload = 64 << 10

var secretID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Fake is a running fake Secret Manager.
type Fake struct {
	secretmanagerpb.UnimplementedSecretManagerServiceServer

	// Addr is the loopback address it listens on.
	Addr  string
	token string
	srv   *grpc.Server

	mu      sync.Mutex
	secrets map[string]*secret // by full name, projects/P/secrets/ID
	calls   []string           // method names, in order
	denied  map[string]bool    // full secret names whose versions may not be read
}

type secret struct {
	pb       *secretmanagerpb.Secret
	versions []*version // versions[i] is version i+1
}

type version struct {
	pb   *secretmanagerpb.SecretVersion
	data []byte
	crc  *int64 // the checksum stored with the payload, as given (or computed) when added
}

// Start serves a fake on a free loopback port until Close. token is the
// bearer token callers must present ("" means Token).
func Start(token string) (*Fake, error) {
	if token == "" {
		token = Token
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("secretfake: %w", err)
	}
	f := &Fake{Addr: lis.Addr().String(), token: token, secrets: map[string]*secret{}, denied: map[string]bool{}}
	f.srv = grpc.NewServer(grpc.UnaryInterceptor(f.authorize))
	secretmanagerpb.RegisterSecretManagerServiceServer(f.srv, f)
	go func() { _ = f.srv.Serve(lis) }()
	return f, nil
}

// Close stops the server at once.
func (f *Fake) Close() { f.srv.Stop() }

// ClientOptions reach this fake with the real client: its endpoint, no
// TLS, and a static bearer token (tok, or the fake's own when "").
func (f *Fake) ClientOptions(tok string) []option.ClientOption {
	if tok == "" {
		tok = f.token
	}
	return []option.ClientOption{
		option.WithEndpoint(f.Addr),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: tok, TokenType: "Bearer"})),
	}
}

// NewClient is the real client connected to this fake.
func (f *Fake) NewClient(ctx context.Context) (*secretmanager.Client, error) {
	return secretmanager.NewClient(ctx, f.ClientOptions("")...)
}

// authorize refuses a call without the fake's bearer token, and records
// the method of every call it lets through.
func (f *Fake) authorize(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if !slices.Contains(md.Get("authorization"), "Bearer "+f.token) {
		return nil, fail(codes.Unauthenticated, "CREDENTIALS_MISSING", "Request had invalid authentication credentials.", nil)
	}
	f.mu.Lock()
	f.calls = append(f.calls, info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:])
	f.mu.Unlock()
	return handler(ctx, req)
}

// fail is a status with an ErrorInfo, as Google's APIs answer.
func fail(code codes.Code, reason, msg string, meta map[string]string) error {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: meta})
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}

// --- the world, for tests to arrange and inspect ---

// Calls returns the names of the methods called so far, in order
// ("AccessSecretVersion", "AddSecretVersion", ...).
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// CountCalls is how many calls of method were made.
func (f *Fake) CountCalls(method string) int {
	n := 0
	for _, c := range f.Calls() {
		if c == method {
			n++
		}
	}
	return n
}

// Create makes the container project/id (as Terraform does), if absent.
func (f *Fake) Create(project, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := "projects/" + project + "/secrets/" + id
	if f.secrets[name] == nil {
		f.secrets[name] = &secret{pb: &secretmanagerpb.Secret{Name: name, CreateTime: timestamppb.Now(),
			Replication: &secretmanagerpb.Replication{Replication: &secretmanagerpb.Replication_Automatic_{Automatic: &secretmanagerpb.Replication_Automatic{}}}}}
	}
}

// Exists reports whether the container project/id exists.
func (f *Fake) Exists(project, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.secrets["projects/"+project+"/secrets/"+id] != nil
}

// Labels are the labels of the container project/id.
func (f *Fake) Labels(project, id string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.secrets["projects/"+project+"/secrets/"+id]; s != nil {
		return s.pb.GetLabels()
	}
	return nil
}

// Put adds a version holding data to project/id (creating the container)
// with its correct checksum, and returns the version's number.
func (f *Fake) Put(project, id string, data []byte) int {
	f.Create(project, id)
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.secrets["projects/"+project+"/secrets/"+id]
	crc := int64(crc32.Checksum(data, castagnoli))
	return s.add(data, &crc).num()
}

// Versions is how many versions project/id has, whatever their state.
func (f *Fake) Versions(project, id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.secrets["projects/"+project+"/secrets/"+id]; s != nil {
		return len(s.versions)
	}
	return 0
}

// Latest is the payload of project/id's latest version, whatever its state.
func (f *Fake) Latest(project, id string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.secrets["projects/"+project+"/secrets/"+id]
	if s == nil || len(s.versions) == 0 {
		return nil, false
	}
	return slices.Clone(s.versions[len(s.versions)-1].data), true
}

// Corrupt flips one bit of the latest version's stored data of project/id
// and keeps its checksum, as damage in storage or transit would.
func (f *Fake) Corrupt(project, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.secrets["projects/"+project+"/secrets/"+id]
	v := s.versions[len(s.versions)-1]
	if len(v.data) == 0 {
		v.data = []byte{0}
		return
	}
	v.data[len(v.data)/2] ^= 0x01
}

// SetState sets the state of version n of project/id.
func (f *Fake) SetState(project, id string, n int, state secretmanagerpb.SecretVersion_State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secrets["projects/"+project+"/secrets/"+id].versions[n-1].pb.State = state
}

// Deny makes reading project/id's versions PermissionDenied.
func (f *Fake) Deny(project, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.denied["projects/"+project+"/secrets/"+id] = true
}

func (s *secret) add(data []byte, crc *int64) *version {
	n := len(s.versions) + 1
	v := &version{data: slices.Clone(data), crc: crc, pb: &secretmanagerpb.SecretVersion{
		Name: fmt.Sprintf("%s/versions/%d", s.pb.Name, n), CreateTime: timestamppb.New(time.Now()),
		State: secretmanagerpb.SecretVersion_ENABLED, ClientSpecifiedPayloadChecksum: crc != nil,
	}}
	s.versions = append(s.versions, v)
	return v
}

func (v *version) num() int {
	n, _ := strconv.Atoi(v.pb.Name[strings.LastIndexByte(v.pb.Name, '/')+1:])
	return n
}

// --- the service ---

// lookupSecret finds a container by its full name.
func (f *Fake) lookupSecret(name string) (*secret, error) {
	parts := strings.Split(name, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[1] == "" || parts[2] != "secrets" || !secretID.MatchString(parts[3]) {
		return nil, fail(codes.InvalidArgument, "INVALID_RESOURCE_NAME", fmt.Sprintf("Invalid resource field value in the request: %q", name), nil)
	}
	s := f.secrets[name]
	if s == nil {
		return nil, fail(codes.NotFound, "SECRET_NOT_FOUND", fmt.Sprintf("Secret [%s] not found.", name), map[string]string{"secret": name})
	}
	return s, nil
}

// lookupVersion finds a version by its full name (number or "latest").
func (f *Fake) lookupVersion(name string) (*secret, *version, error) {
	i := strings.LastIndex(name, "/versions/")
	if i < 0 {
		return nil, nil, fail(codes.InvalidArgument, "INVALID_RESOURCE_NAME", fmt.Sprintf("Invalid resource field value in the request: %q", name), nil)
	}
	s, err := f.lookupSecret(name[:i])
	if err != nil {
		if status.Code(err) == codes.NotFound {
			// The real service says the same for a missing secret and a
			// secret without versions.
			return nil, nil, fail(codes.NotFound, "SECRET_VERSION_NOT_FOUND", fmt.Sprintf("Secret [%s] not found or has no versions.", name), map[string]string{"secret_version": name})
		}
		return nil, nil, err
	}
	id := name[i+len("/versions/"):]
	var v *version
	switch n, err := strconv.Atoi(id); {
	case id == "latest":
		if len(s.versions) > 0 {
			v = s.versions[len(s.versions)-1]
		}
	case err != nil || n < 1:
		return nil, nil, fail(codes.InvalidArgument, "INVALID_RESOURCE_NAME", fmt.Sprintf("Invalid version id %q.", id), nil)
	case n <= len(s.versions):
		v = s.versions[n-1]
	}
	if v == nil {
		return nil, nil, fail(codes.NotFound, "SECRET_VERSION_NOT_FOUND", fmt.Sprintf("Secret [%s] not found or has no versions.", name), map[string]string{"secret_version": name})
	}
	return s, v, nil
}

// GetSecret answers the container.
func (f *Fake) GetSecret(_ context.Context, req *secretmanagerpb.GetSecretRequest) (*secretmanagerpb.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookupSecret(req.GetName())
	if err != nil {
		return nil, err
	}
	return clone(s.pb), nil
}

// CreateSecret makes a container; it must name its replication.
func (f *Fake) CreateSecret(_ context.Context, req *secretmanagerpb.CreateSecretRequest) (*secretmanagerpb.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	parent := req.GetParent()
	if !strings.HasPrefix(parent, "projects/") || strings.Count(parent, "/") != 1 || !secretID.MatchString(req.GetSecretId()) {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", fmt.Sprintf("Invalid secret %q under %q.", req.GetSecretId(), parent), nil)
	}
	if req.GetSecret().GetReplication().GetReplication() == nil {
		return nil, fail(codes.InvalidArgument, "INVALID_ARGUMENT", "Secret.replication is required.", nil)
	}
	name := parent + "/secrets/" + req.GetSecretId()
	if f.secrets[name] != nil {
		return nil, fail(codes.AlreadyExists, "SECRET_ALREADY_EXISTS", fmt.Sprintf("Secret [%s] already exists.", name), nil)
	}
	pb := &secretmanagerpb.Secret{Name: name, Replication: req.GetSecret().GetReplication(), Labels: req.GetSecret().GetLabels(), CreateTime: timestamppb.Now()}
	f.secrets[name] = &secret{pb: pb}
	return clone(pb), nil
}

// AddSecretVersion stores a payload as the secret's next version.
func (f *Fake) AddSecretVersion(_ context.Context, req *secretmanagerpb.AddSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookupSecret(req.GetParent())
	if err != nil {
		return nil, err
	}
	data := req.GetPayload().GetData()
	if len(data) > MaxPayload {
		return nil, fail(codes.InvalidArgument, "PAYLOAD_TOO_LARGE", "Secret payload exceeds the 64 KiB limit.", nil)
	}
	crc := req.GetPayload().DataCrc32C
	if crc != nil && *crc != int64(crc32.Checksum(data, castagnoli)) {
		return nil, fail(codes.InvalidArgument, "DATA_CRC32C_MISMATCH", "Checksum mismatch: the payload's data_crc32c does not match its data.", nil)
	}
	if crc == nil {
		c := int64(crc32.Checksum(data, castagnoli))
		crc = &c
	}
	return clone(s.add(data, crc).pb), nil
}

// ListSecretVersions lists a secret's versions, newest first. The one
// filter it knows is "state:ENABLED" (or DISABLED, DESTROYED).
func (f *Fake) ListSecretVersions(_ context.Context, req *secretmanagerpb.ListSecretVersionsRequest) (*secretmanagerpb.ListSecretVersionsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookupSecret(req.GetParent())
	if err != nil {
		return nil, err
	}
	var want *secretmanagerpb.SecretVersion_State
	if flt := strings.TrimSpace(req.GetFilter()); flt != "" {
		st, ok := strings.CutPrefix(flt, "state:")
		v, known := secretmanagerpb.SecretVersion_State_value[st]
		if !ok || !known {
			return nil, fail(codes.InvalidArgument, "INVALID_FILTER", fmt.Sprintf("The fake knows only state:<STATE> filters, not %q.", flt), nil)
		}
		state := secretmanagerpb.SecretVersion_State(v)
		want = &state
	}
	out := &secretmanagerpb.ListSecretVersionsResponse{}
	for _, v := range slices.Backward(s.versions) {
		if want == nil || v.pb.State == *want {
			out.Versions = append(out.Versions, clone(v.pb))
		}
	}
	out.TotalSize = int32(len(out.Versions))
	return out, nil
}

// AccessSecretVersion answers a version's payload with its stored checksum.
func (f *Fake) AccessSecretVersion(_ context.Context, req *secretmanagerpb.AccessSecretVersionRequest) (*secretmanagerpb.AccessSecretVersionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, v, err := f.lookupVersion(req.GetName())
	if err != nil {
		return nil, err
	}
	if f.denied[s.pb.Name] {
		return nil, fail(codes.PermissionDenied, "IAM_PERMISSION_DENIED",
			fmt.Sprintf("Permission 'secretmanager.versions.access' denied for resource '%s' (or it may not exist).", req.GetName()),
			map[string]string{"permission": "secretmanager.versions.access"})
	}
	if v.pb.State != secretmanagerpb.SecretVersion_ENABLED {
		return nil, fail(codes.FailedPrecondition, "SECRET_VERSION_NOT_ENABLED",
			fmt.Sprintf("Secret Version [%s] is in %s state.", v.pb.Name, v.pb.State), map[string]string{"secret_version": v.pb.Name})
	}
	return &secretmanagerpb.AccessSecretVersionResponse{Name: v.pb.Name,
		Payload: &secretmanagerpb.SecretPayload{Data: slices.Clone(v.data), DataCrc32C: v.crc}}, nil
}

// DisableSecretVersion disables a version.
func (f *Fake) DisableSecretVersion(_ context.Context, req *secretmanagerpb.DisableSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	return f.setState(req.GetName(), secretmanagerpb.SecretVersion_DISABLED)
}

// EnableSecretVersion enables a disabled version.
func (f *Fake) EnableSecretVersion(_ context.Context, req *secretmanagerpb.EnableSecretVersionRequest) (*secretmanagerpb.SecretVersion, error) {
	return f.setState(req.GetName(), secretmanagerpb.SecretVersion_ENABLED)
}

func (f *Fake) setState(name string, state secretmanagerpb.SecretVersion_State) (*secretmanagerpb.SecretVersion, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, v, err := f.lookupVersion(name)
	if err != nil {
		return nil, err
	}
	if v.pb.State == secretmanagerpb.SecretVersion_DESTROYED {
		return nil, fail(codes.FailedPrecondition, "SECRET_VERSION_DESTROYED", fmt.Sprintf("Secret Version [%s] is destroyed.", v.pb.Name), nil)
	}
	v.pb.State = state
	return clone(v.pb), nil
}

// clone copies a message the world keeps, so that gRPC marshals the copy
// after the lock is released while the world may change.
func clone[M proto.Message](m M) M { return proto.Clone(m).(M) }
