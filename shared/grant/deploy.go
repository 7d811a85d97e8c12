package grant

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"strings"
	"unicode"

	run "cloud.google.com/go/run/apiv2"
	"cloud.google.com/go/run/apiv2/runpb"
	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"google.golang.org/genproto/googleapis/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// DeployRequest is the body of a deploy: which agent, where, from which
// image, with which model API key. The key is placed in the customer's
// Secret Manager and nowhere else: it is never stored by the mesh, logged,
// or answered.
type DeployRequest struct {
	// Name is the agent's name: its agent key's label, and (prefixed
	// "mesh-") the worker pool's and the secrets' names. 1–30 lower-case
	// letters, digits and hyphens, starting with a letter.
	Name string `json:"name"`
	// Region is the Cloud Run region, e.g. europe-west1.
	Region string `json:"region"`
	// Image is the container image: one with mesh-adapter on its PATH and
	// /bin/sh, usually in the customer's Artifact Registry repository.
	Image string `json:"image"`
	// Bucket is the customer's state bucket: the adapter's state directory
	// is mounted from it, so a restart keeps the agent's identity.
	Bucket string `json:"bucket"`
	// ModelAPIKey is the customer's model API key.
	ModelAPIKey string `json:"model_api_key"`
	// ModelAPIKeyEnv is the environment variable the agent reads it from
	// (MODEL_API_KEY when empty).
	ModelAPIKeyEnv string `json:"model_api_key_env,omitempty"`
}

// DeployResult is what a deploy did.
type DeployResult struct {
	Grant View `json:"grant"`
	// WorkerPool is the full name of the Cloud Run worker pool written.
	WorkerPool string `json:"worker_pool"`
	// Operation is Cloud Run's operation; Done says whether it had
	// finished when the call returned (a rollout may take minutes).
	Operation string `json:"operation"`
	Done      bool   `json:"done"`
	// AgentKeyID and Label name the agent key minted for the agent (the
	// key itself is only in the customer's secret).
	AgentKeyID  string `json:"agent_key_id"`
	Label       string `json:"label"`
	HandleClaim string `json:"handle_claim,omitempty"`
	// Secrets are the secret versions added, as projects/P/secrets/S/versions/N.
	Secrets []string `json:"secrets"`
}

// DefaultModelKeyEnv is the variable the agent reads the model API key from.
const DefaultModelKeyEnv = "MODEL_API_KEY"

// stateDir is where the state bucket is mounted in the container.
const stateDir = "/mesh-state"

// startScript runs the adapter: the first start redeems the agent key
// (`up`, which saves the identity and its credential in the state
// directory on the bucket); every later start finds the saved credential
// (config.json) and starts the same agent again.
const startScript = `if [ -s "$MESH_ADAPTER_HOME/config.json" ]; then exec mesh-adapter start --inbox --name "$MESH_AGENT_NAME"; fi
exec mesh-adapter up "$MESH_AGENT_KEY" --name "$MESH_AGENT_NAME"`

var (
	deployNameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$`)
	regionRE     = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]{1,2}$`)
	bucketRE     = regexp.MustCompile(`^[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]$`)
	envNameRE    = regexp.MustCompile(`^[A-Z_][A-Z0-9_]{0,63}$`)
	imageRE      = regexp.MustCompile(`^[a-z0-9][-a-z0-9.]*(:[0-9]+)?/[-a-zA-Z0-9._/]+(:[-a-zA-Z0-9._]{1,128})?(@sha256:[0-9a-f]{64})?$`)
)

// maxSecret is Secret Manager's payload limit.
const maxSecret = 64 << 10

// CheckDeploy validates a deploy body before anything is minted or
// called, and returns it normalised.
func CheckDeploy(r DeployRequest) (DeployRequest, error) {
	r.Name, r.Region, r.Image, r.Bucket = strings.TrimSpace(r.Name), strings.TrimSpace(r.Region), strings.TrimSpace(r.Image), strings.TrimSpace(r.Bucket)
	r.ModelAPIKey = strings.TrimSpace(r.ModelAPIKey)
	if r.ModelAPIKeyEnv == "" {
		r.ModelAPIKeyEnv = DefaultModelKeyEnv
	}
	switch {
	case !deployNameRE.MatchString(r.Name):
		return r, errs.New(errs.InvalidRequest, "name must be 1 to 30 lower-case letters, digits and hyphens, starting with a letter (it names the agent, its worker pool and its secrets)")
	case !regionRE.MatchString(r.Region):
		return r, errs.New(errs.InvalidRequest, "region must be a Cloud Run region such as europe-west1")
	case len(r.Image) > 512 || !imageRE.MatchString(r.Image):
		return r, errs.New(errs.InvalidRequest, "image must be a container image reference such as europe-west1-docker.pkg.dev/PROJECT/REPOSITORY/agent:1 (with mesh-adapter on its PATH)")
	case !bucketRE.MatchString(r.Bucket):
		return r, errs.New(errs.InvalidRequest, "bucket must be the name of your state bucket (3 to 63 lower-case letters, digits, '-', '_' and '.'), without gs://")
	case r.ModelAPIKey == "":
		return r, errs.New(errs.InvalidRequest, "model_api_key is required: the API key your agent's model provider gave you")
	case len(r.ModelAPIKey) > maxSecret:
		return r, errs.Newf(errs.InvalidRequest, "model_api_key is longer than %d bytes", maxSecret)
	case strings.IndexFunc(r.ModelAPIKey, unicode.IsControl) >= 0:
		return r, errs.New(errs.InvalidRequest, "model_api_key must not contain control characters or line breaks")
	case !envNameRE.MatchString(r.ModelAPIKeyEnv) || strings.HasPrefix(r.ModelAPIKeyEnv, "MESH_"):
		return r, errs.New(errs.InvalidRequest, "model_api_key_env must be an environment variable name (upper-case letters, digits and '_') not starting with MESH_")
	}
	return r, nil
}

// Deploy deploys an agent into the project of the account's verified
// grant: it mints the agent's key, places it and the model API key in the
// customer's Secret Manager as the customer's account (creating each
// secret if absent, adding a version with its checksum, never reading one
// back), and creates or updates a Cloud Run worker pool that runs
// mesh-adapter with that key, as the customer's account. A worker pool, not
// a service: the adapter serves no HTTP, and a service's revision only
// becomes ready once it answers on $PORT.
//
// A grant that is not verified withholds the work (nothing falls back to
// the mesh's own machines). A call refused inside the customer's project
// lowers the grant to revoked; a deploy never raises a state. Minting the
// key needs what minting always needs: a session with a fresh passkey. A
// key minted for a deploy that then fails is revoked again.
func (s *Service) Deploy(ctx context.Context, p *account.Principal, provider string, req DeployRequest) (DeployResult, error) {
	if s.cfg.Accounts == nil {
		return DeployResult{}, errs.New(errs.NotImplemented, "deploys are not configured on this instance")
	}
	if err := CheckProvider(provider); err != nil {
		return DeployResult{}, err
	}
	req, err := CheckDeploy(req)
	if err != nil {
		return DeployResult{}, err
	}
	if !s.cfg.Accounts.Fresh(p) {
		return DeployResult{}, errs.New(errs.Forbidden, "confirm with your passkey first: a deploy mints an agent key, which needs a passkey check from the last few minutes").
			WithDetail("passkey_required", true)
	}
	g, err := s.grant(ctx, p.AccountID, provider)
	if err != nil {
		return DeployResult{}, err
	}
	if g.State != Verified {
		why := ""
		if g.LastError != "" {
			why = " " + g.LastError
		}
		return DeployResult{}, errs.Newf(errs.Conflict, "the %s grant is %s, so nothing was deployed (and nothing runs on the mesh's own machines instead).%s Verify the grant once it is fixed.", provider, g.State, why).
			WithDetail("grant_state", string(g.State))
	}

	// One budget for the whole deploy: each call has its own deadline too,
	// but together they must end before the function's timeout.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DeployBudget)
	defer cancel()
	token, v, ok := s.impersonate(ctx, g, "deploy")
	if !ok {
		if v.state == Revoked {
			return DeployResult{}, s.lower(ctx, g, v.lastError)
		}
		return DeployResult{}, errs.New(errs.Unavailable, "the deploy could not start: "+v.lastError).WithDetail("grant_state", string(g.State))
	}

	key, err := s.cfg.Accounts.MintPlacedAgentKey(ctx, p, req.Name, fmt.Sprintf("the secret mesh-%s-agent-key of your Google Cloud project %s", req.Name, g.ProjectID))
	if err != nil {
		return DeployResult{}, err
	}
	res, uncertain, err := s.place(ctx, g, token, req, key)
	if err != nil && uncertain {
		// The worker pool may have been written with this key (the call got
		// no certain answer): revoking it could break an agent that is
		// starting, so it is kept, and the answer and the log say so.
		s.log.Warn("a deploy's worker pool write got no certain answer; its agent key was kept", "account", p.AccountID, "key_id", key.ID, "err", err)
		return DeployResult{}, err
	}
	if err != nil {
		// The key is in no running agent: take it back, so a secret version
		// left behind holds a dead key.
		// Its own deadline: the deploy's budget may be spent already.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		rerr := s.cfg.Accounts.RevokeAgentKey(rctx, p, key.ID)
		rcancel()
		if rerr != nil {
			s.log.Error("a failed deploy's agent key could not be revoked", "account", p.AccountID, "key_id", key.ID, "err", rerr)
		}
		return DeployResult{}, err
	}
	res.AgentKeyID, res.Label, res.HandleClaim = key.ID, key.Label, key.HandleClaim
	if res.Grant, err = s.viewOf(ctx, g); err != nil {
		return DeployResult{}, err
	}
	s.log.Info("agent deployed into a customer project", "account", p.AccountID, "project", g.ProjectID, "worker_pool", res.WorkerPool, "key_id", key.ID)
	return res, nil
}

// place does the deploy's calls in the customer's project, as the
// customer's account (token). uncertain reports a failure of the worker
// pool's write that may nevertheless have written it (no answer before
// the deadline, Google unavailable): the key must then be kept.
func (s *Service) place(ctx context.Context, g Grant, token string, req DeployRequest, key account.AgentKeyGrant) (res DeployResult, uncertain bool, err error) {
	res, err = s.placeSecrets(ctx, g, token, req, key)
	if err != nil {
		return res, false, err
	}
	// The worker pool is what runs in the customer's project: write it
	// only if the grant is still the one checked and still verified (a
	// DELETE, a new POST or a lowering may have come meanwhile).
	if err := s.stillVerified(ctx, g); err != nil {
		return res, false, err
	}
	return s.placeWorkerPool(ctx, g, token, req, key, res)
}

// stillVerified reads the grant again: the same record, still verified.
func (s *Service) stillVerified(ctx context.Context, g Grant) error {
	var cur Grant
	err := store.Get(ctx, s.st, CollGrants, docID(g.AccountID, g.Provider), &cur)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errs.New(errs.Conflict, "the grant was deleted during the deploy, so no worker pool was written (the secrets' new versions hold a revoked key)")
	case err != nil:
		return txErr(err)
	case cur.ID != g.ID || cur.State != Verified:
		return errs.Newf(errs.Conflict, "the grant changed during the deploy (it is now %s), so no worker pool was written; read it and deploy again", cur.State).
			WithDetail("grant_state", string(cur.State))
	}
	return nil
}

// placeSecrets adds the two secrets' versions.
func (s *Service) placeSecrets(ctx context.Context, g Grant, token string, req DeployRequest, key account.AgentKeyGrant) (DeployResult, error) {
	var res DeployResult
	sm, err := secretmanager.NewClient(ctx, s.as(token)...)
	if err != nil {
		return res, errs.Wrap(errs.Unavailable, "the deploy could not build its Secret Manager client; retry shortly", err)
	}
	defer sm.Close()
	keyVersion, err := s.putSecret(ctx, g, sm, "mesh-"+req.Name+"-agent-key", req.Name, []byte(key.Token))
	if err != nil {
		return res, err
	}
	modelVersion, err := s.putSecret(ctx, g, sm, "mesh-"+req.Name+"-model-key", req.Name, []byte(req.ModelAPIKey))
	if err != nil {
		return res, err
	}
	res.Secrets = []string{keyVersion, modelVersion}
	return res, nil
}

// placeWorkerPool writes the worker pool, pinned to the versions added.
func (s *Service) placeWorkerPool(ctx context.Context, g Grant, token string, req DeployRequest, key account.AgentKeyGrant, res DeployResult) (DeployResult, bool, error) {
	rc, err := run.NewWorkerPoolsClient(ctx, s.as(token)...)
	if err != nil {
		return res, false, errs.Wrap(errs.Unavailable, "the deploy could not build its Cloud Run client; retry shortly", err)
	}
	defer rc.Close()
	wp := s.workerPool(g, req, versionOf(res.Secrets[0]), versionOf(res.Secrets[1]))
	var op *run.UpdateWorkerPoolOperation
	err = s.call(ctx, g, "deploy", "run.UpdateWorkerPool", wp.Name, func(ctx context.Context) error {
		var err error
		op, err = rc.UpdateWorkerPool(ctx, &runpb.UpdateWorkerPoolRequest{WorkerPool: wp, AllowMissing: true})
		return err
	})
	if c, msg := codeOf(err); err != nil && uncertainCode(c) {
		return res, true, errs.Newf(errs.Unavailable, "the deploy's run.UpdateWorkerPool on %s got no certain answer (%s: %s): the worker pool may have been written, so its agent key %s was kept, not revoked. Deploy again, or revoke the key in the console if the pool is not running; the grant is unchanged.",
			wp.Name, codeName(c), clip(msg, 200), key.ID).WithDetail("grant_state", string(g.State)).WithDetail("agent_key_id", key.ID)
	}
	if err != nil {
		return res, false, s.refusal(ctx, g, "run.UpdateWorkerPool", wp.Name, err)
	}
	res.WorkerPool, res.Operation, res.Done = wp.Name, op.Name(), op.Done()
	if op.Done() {
		// A finished operation carries its result or its error; Poll reads
		// it without another call. Its failure is definite.
		if _, err := op.Poll(ctx); err != nil {
			return res, false, s.refusal(ctx, g, "run.UpdateWorkerPool", wp.Name, err)
		}
	}
	return res, false, nil
}

// uncertainCode is a failure after which a write may still have happened:
// no answer in time, Google unavailable, the call cut short, or an error
// that is not Google's answer at all.
func uncertainCode(c codes.Code) bool {
	return c == codes.DeadlineExceeded || c == codes.Unavailable || c == codes.Canceled || c == codes.Unknown
}

// putSecret creates the secret if absent and adds a version with its
// CRC32C checksum. It never reads a version back. It returns the new
// version's name.
func (s *Service) putSecret(ctx context.Context, g Grant, sm *secretmanager.Client, id, agent string, data []byte) (string, error) {
	parent := "projects/" + g.ProjectID
	name := parent + "/secrets/" + id
	err := s.call(ctx, g, "deploy", "secretmanager.CreateSecret", name, func(ctx context.Context) error {
		_, err := sm.CreateSecret(ctx, &secretmanagerpb.CreateSecretRequest{Parent: parent, SecretId: id, Secret: &secretmanagerpb.Secret{
			Replication: &secretmanagerpb.Replication{Replication: &secretmanagerpb.Replication_Automatic_{Automatic: &secretmanagerpb.Replication_Automatic{}}},
			Labels:      map[string]string{"managed-by": "agentmesh", "mesh-agent": agent}}})
		return err
	})
	if c, _ := codeOf(err); err != nil && c != codes.AlreadyExists {
		return "", s.refusal(ctx, g, "secretmanager.CreateSecret", name, err)
	}
	crc := int64(crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)))
	var v *secretmanagerpb.SecretVersion
	err = s.call(ctx, g, "deploy", "secretmanager.AddSecretVersion", name, func(ctx context.Context) error {
		var err error
		v, err = sm.AddSecretVersion(ctx, &secretmanagerpb.AddSecretVersionRequest{Parent: name,
			Payload: &secretmanagerpb.SecretPayload{Data: data, DataCrc32C: proto.Int64(crc)}})
		return err
	})
	if err != nil {
		return "", s.refusal(ctx, g, "secretmanager.AddSecretVersion", name, err)
	}
	return v.GetName(), nil
}

func versionOf(name string) string { return name[strings.LastIndexByte(name, '/')+1:] }

// workerPool is the worker pool a deploy writes: one copy of the adapter,
// as the customer's account, with the agent key and the model key from the
// versions just added, and the state directory on the bucket.
func (s *Service) workerPool(g Grant, req DeployRequest, keyVersion, modelVersion string) *runpb.WorkerPool {
	env := func(k, v string) *runpb.EnvVar { return &runpb.EnvVar{Name: k, Values: &runpb.EnvVar_Value{Value: v}} }
	secret := func(k, id, version string) *runpb.EnvVar {
		return &runpb.EnvVar{Name: k, Values: &runpb.EnvVar_ValueSource{ValueSource: &runpb.EnvVarSource{
			SecretKeyRef: &runpb.SecretKeySelector{Secret: id, Version: version}}}}
	}
	labels := map[string]string{"managed-by": "agentmesh", "mesh-agent": req.Name}
	return &runpb.WorkerPool{
		Name:   fmt.Sprintf("projects/%s/locations/%s/workerPools/mesh-%s", g.ProjectID, req.Region, req.Name),
		Labels: labels, LaunchStage: api.LaunchStage_BETA,
		Template: &runpb.WorkerPoolRevisionTemplate{
			Labels: labels, ServiceAccount: g.ServiceAccount,
			Containers: []*runpb.Container{{
				Name: "agent", Image: req.Image, Command: []string{"/bin/sh", "-c", startScript},
				Env: []*runpb.EnvVar{
					env("MESH_CONTROL_URL", s.cfg.ControlURL), env("MESH_REGISTRAR_URL", s.cfg.RegistrarURL),
					env("MESH_ADAPTER_HOME", stateDir), env("MESH_AGENT_NAME", req.Name),
					secret("MESH_AGENT_KEY", "mesh-"+req.Name+"-agent-key", keyVersion),
					secret(req.ModelAPIKeyEnv, "mesh-"+req.Name+"-model-key", modelVersion),
				},
				VolumeMounts: []*runpb.VolumeMount{{Name: "state", MountPath: stateDir}},
			}},
			Volumes: []*runpb.Volume{{Name: "state", VolumeType: &runpb.Volume_Gcs{Gcs: &runpb.GCSVolumeSource{Bucket: req.Bucket}}}},
		},
		Scaling: &runpb.WorkerPoolScaling{ManualInstanceCount: proto.Int32(1)},
	}
}

// refusal turns a failed deploy call into the answer: refused inside the
// customer's project (PERMISSION_DENIED) lowers the grant to revoked;
// anything else leaves it as it is. UNAUTHENTICATED is not the customer's
// refusal: it says our token was not accepted (expired, malformed), which
// is our problem, so it never lowers a grant.
func (s *Service) refusal(ctx context.Context, g Grant, method, resource string, err error) error {
	c, msg := codeOf(err)
	if c == codes.PermissionDenied {
		return s.lower(ctx, g, fmt.Sprintf("Your side: the deploy's %s on %s was refused as %s (%s). Check the roles in the published list (%s); once they are granted, verify the grant — a deploy never raises it.",
			method, resource, g.ServiceAccount, codeName(c), s.PermissionsURL()))
	}
	return errs.Newf(errs.DependencyFailed, "the deploy's %s on %s failed (%s: %s); the grant is unchanged. Retry, or read the actions log.",
		method, resource, codeName(c), clip(msg, 200)).WithDetail("grant_state", string(g.State))
}

// lower lowers a verified grant to revoked (a deploy never raises a state)
// and answers the refusal, saying the state the grant actually has: a
// record replaced or deleted meanwhile, or no longer verified, is left
// alone, and the answer says so instead of claiming it was revoked.
func (s *Service) lower(ctx context.Context, g Grant, why string) error {
	wrote, now, err := s.lowerRecord(ctx, g, why)
	if err != nil {
		return errs.Wrap(errs.Unavailable, "your project refused the deploy ("+why+"), and the grant could not be marked revoked; retry shortly", err)
	}
	var e *errs.Error
	switch {
	case wrote:
		s.log.Info("cloud grant lowered by a refused deploy", "account", g.AccountID, "provider", g.Provider)
		e = errs.New(errs.DependencyFailed, "your project refused the deploy, so the grant is now revoked: "+why).WithDetail("grant_state", string(Revoked))
	case now == "":
		e = errs.New(errs.DependencyFailed, "your project refused the deploy, and the grant was deleted meanwhile, so nothing was lowered: "+why)
	default:
		e = errs.Newf(errs.DependencyFailed, "your project refused the deploy; the grant was changed meanwhile and is %s, so it was left as it is: %s", now, why).WithDetail("grant_state", string(now))
	}
	e.Retryable = false
	return e
}

// lowerRecord writes the lowering and reports whether it wrote, and the
// state the record has after it ("" when there is no record any more).
func (s *Service) lowerRecord(ctx context.Context, g Grant, why string) (wrote bool, now State, err error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	err = s.st.RunTx(wctx, func(tx store.Tx) error {
		wrote, now = false, ""
		var cur Grant
		if err := tx.Get(CollGrants, docID(g.AccountID, g.Provider), &cur); err != nil {
			return err
		}
		now = cur.State
		if cur.ID != g.ID || cur.State != Verified {
			return nil
		}
		cur.State, cur.LastError, cur.Failures, cur.NextCheckAt = Revoked, why, 0, 0
		wrote, now = true, Revoked
		return tx.Set(CollGrants, docID(g.AccountID, g.Provider), cur)
	})
	if errors.Is(err, store.ErrNotFound) {
		return false, "", nil
	}
	return wrote, now, err
}
