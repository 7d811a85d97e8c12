package grant

import (
	"context"
	"errors"
	"fmt"
	"time"

	credentials "cloud.google.com/go/iam/credentials/apiv1"
	"cloud.google.com/go/iam/credentials/apiv1/credentialspb"
	resourcemanager "cloud.google.com/go/resourcemanager/apiv3"
	"cloud.google.com/go/resourcemanager/apiv3/resourcemanagerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// The chain's token: the narrowest scope that reaches every API a deploy
// calls, and a lifetime that outlasts one check or one deploy.
const (
	cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"
	tokenLifetime      = 15 * time.Minute
)

func saResource(email string) string { return "projects/-/serviceAccounts/" + email }

// verdict is what a check concluded.
type verdict struct {
	state     State
	lastError string
}

// check is the check of DESIGN §11: one GenerateAccessToken for the
// customer's account with the deployer as delegate, then one GetProject as
// that account, which must answer for the project recorded. A 403 or 404
// from the token call is ambiguous (our hop or theirs), so one more
// question is asked about our hop alone (askOwnHop). Every call has its
// own deadline; the calls in the customer's project are logged.
func (s *Service) check(ctx context.Context, g Grant, trigger string) verdict {
	token, v, ok := s.impersonate(ctx, g, trigger)
	if !ok {
		return v
	}
	rm, err := resourcemanager.NewProjectsClient(ctx, s.as(token)...)
	if err != nil {
		return verdict{Unreachable, fmt.Sprintf("Our side: the mesh could not build its Resource Manager client (%v); nothing to change in your project. The mesh retries on its own.", err)}
	}
	defer rm.Close()
	var p *resourcemanagerpb.Project
	err = s.call(ctx, g, trigger, "resourcemanager.GetProject", "projects/"+g.ProjectID, func(ctx context.Context) error {
		var err error
		p, err = rm.GetProject(ctx, &resourcemanagerpb.GetProjectRequest{Name: "projects/" + g.ProjectID})
		return err
	})
	return judgeProjectRead(g, p.GetProjectId(), p.GetLabels(), err)
}

// impersonate mints a token for the customer's account through the chain.
// When it cannot, ok is false and v says why (the one more question
// included).
func (s *Service) impersonate(ctx context.Context, g Grant, trigger string) (token string, v verdict, ok bool) {
	iam, err := s.selfClient(ctx)
	if err != nil {
		return "", verdict{Unreachable, fmt.Sprintf("Our side: the mesh could not reach Google with its own credentials (%v); nothing to change in your project. The mesh retries on its own.", clip(err.Error(), 200))}, false
	}
	var resp *credentialspb.GenerateAccessTokenResponse
	err = s.call(ctx, g, trigger, "iamcredentials.GenerateAccessToken", saResource(g.ServiceAccount), func(ctx context.Context) error {
		var err error
		resp, err = iam.GenerateAccessToken(ctx, &credentialspb.GenerateAccessTokenRequest{Name: saResource(g.ServiceAccount),
			Delegates: []string{saResource(s.cfg.Deployer)}, Scope: []string{cloudPlatformScope}, Lifetime: durationpb.New(tokenLifetime)})
		return err
	})
	if err == nil && resp.GetAccessToken() != "" {
		return resp.GetAccessToken(), verdict{}, true
	}
	if err == nil {
		err = status.Error(codes.Internal, "the answer carried no token")
	}
	var own error
	if c, _ := codeOf(err); c == codes.PermissionDenied || c == codes.NotFound {
		own = s.askOwnHop(ctx, iam)
	}
	return "", judgeImpersonation(g, s.cfg.Deployer, err, own), false
}

// askOwnHop is the one more question (DESIGN §11): can the runtime still
// mint a token for the deployer alone? It is a call in our own project, so
// it is not a line of the customer's actions log; the token is dropped.
func (s *Service) askOwnHop(ctx context.Context, iam *credentials.IamCredentialsClient) error {
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := iam.GenerateAccessToken(cctx, &credentialspb.GenerateAccessTokenRequest{Name: saResource(s.cfg.Deployer),
		Scope: []string{cloudPlatformScope}, Lifetime: durationpb.New(5 * time.Minute)})
	if err != nil {
		s.log.Warn("the mesh's own hop to its deployer failed", "deployer", s.cfg.Deployer, "err", err)
		return err
	}
	return nil
}

// judgeImpersonation classifies a failed token call. err is the chained
// call's error; own is the answer to the one more question, asked only
// when err was a 403 or a 404 (nil: our hop works).
func judgeImpersonation(g Grant, deployer string, err, own error) verdict {
	c, msg := codeOf(err)
	switch {
	case (c == codes.PermissionDenied || c == codes.NotFound) && own != nil:
		oc, _ := codeOf(own)
		return verdict{Unreachable, fmt.Sprintf("Our side: the mesh's runtime could not act as its deployer %s (%s), so your project was not checked; nothing to change on your side. The mesh retries on its own.", deployer, codeName(oc))}
	case c == codes.PermissionDenied:
		return verdict{Revoked, fmt.Sprintf("Your side: the deployer %s may not create tokens for %s: the roles/iam.serviceAccountTokenCreator binding for it on that account is missing. Grant it again (docs/grants.md), wait 2–7 minutes for IAM, then verify.", deployer, g.ServiceAccount)}
	case c == codes.NotFound:
		return verdict{Revoked, fmt.Sprintf("Your side: the service account %s was not found in project %s; it may have been deleted. Create it again (or record the right one), grant the roles and the binding, then verify.", g.ServiceAccount, g.ProjectID)}
	}
	return verdict{Unreachable, fmt.Sprintf("Google's IAM Credentials API did not give a token for %s (%s: %s); nothing has been decided about your grant. The mesh retries on its own.", g.ServiceAccount, codeName(c), clip(msg, 200))}
}

// judgeProjectRead classifies the project read: it must succeed, name the
// project recorded, and carry the label that names this mesh account
// (ProjectLabel). The deployer is shared by every mesh account, so the
// chain working only proves that the deployer may act as the named
// account, not that the grant is this mesh account's: without the label,
// anyone could record a grant naming someone else's account and deploy
// into their project (a confused deputy). Setting a label needs
// resourcemanager.projects.update, which only the project's owners hold.
// A missing or different label is unreachable, not revoked: it is a setup
// step not (yet) done rather than a binding taken back, and the scheduled
// re-check verifies the grant once the label is there. A refusal at this
// step is not a revocation either (the chain worked).
func judgeProjectRead(g Grant, answered string, labels map[string]string, err error) verdict {
	c, msg := codeOf(err)
	want := LabelValue(g.AccountID)
	switch {
	case err == nil && answered != g.ProjectID:
		return verdict{Unreachable, fmt.Sprintf("Your side: reading project %s as %s answered for project %q instead: check that project_id names the project the account belongs to.", g.ProjectID, g.ServiceAccount, clip(answered, 64))}
	case err == nil && labels[ProjectLabel] == "":
		return verdict{Unreachable, fmt.Sprintf("Your side: project %s has no label %s naming this mesh account, so the grant cannot be proven to be yours. Run: %s — then verify (one project serves one mesh account).",
			g.ProjectID, ProjectLabel, labelCommand(g.ProjectID, want))}
	case err == nil && labels[ProjectLabel] != want:
		return verdict{Unreachable, fmt.Sprintf("Your side: project %s's label %s names another mesh account (%q), not this one; one project serves one mesh account. If the project is yours to give to this account, run: %s — then verify.",
			g.ProjectID, ProjectLabel, clip(labels[ProjectLabel], 63), labelCommand(g.ProjectID, want))}
	case err == nil:
		return verdict{Verified, ""}
	case c == codes.PermissionDenied:
		return verdict{Unreachable, fmt.Sprintf("Your side: %s may not read project %s (PERMISSION_DENIED). Grant it roles/browser on the project (docs/grants.md), then verify.", g.ServiceAccount, g.ProjectID)}
	}
	return verdict{Unreachable, fmt.Sprintf("The read of project %s as %s failed (%s: %s). The mesh retries on its own; check the project id if this persists.", g.ProjectID, g.ServiceAccount, codeName(c), clip(msg, 200))}
}

// codeOf is the gRPC code and message of an error from a Google client: its
// status, or the context's end when the deadline cut a retry short.
func codeOf(err error) (codes.Code, string) {
	if err == nil {
		return codes.OK, ""
	}
	if st, ok := status.FromError(err); ok {
		return st.Code(), st.Message()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, "no answer before the deadline"
	case errors.Is(err, context.Canceled):
		return codes.Canceled, "the request was cancelled"
	}
	return codes.Unknown, err.Error()
}

// checkAndSettle checks g and writes the verdict to its record, if the
// record is still the one checked (a POST may have replaced it, a DELETE
// removed it) and keep, when given, accepts it as it is now.
func (s *Service) checkAndSettle(ctx context.Context, g Grant, trigger string, keep func(cur Grant) bool) (Grant, error) {
	v := s.check(ctx, g, trigger)
	if ctx.Err() != nil {
		// The caller went away mid-check: its failures say nothing about
		// the grant, so nothing is written (a pending record is taken up
		// by the scheduled row).
		return Grant{}, errs.Wrap(errs.Unavailable, "the check was interrupted; verify again", ctx.Err())
	}
	now := s.now()
	var out Grant
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var cur Grant
		if err := tx.Get(CollGrants, docID(g.AccountID, g.Provider), &cur); err != nil {
			return err
		}
		if cur.ID != g.ID || (keep != nil && !keep(cur)) {
			return errStale
		}
		cur.State, cur.LastError, cur.CheckedAt = v.state, v.lastError, now.UnixMilli()
		switch v.state {
		case Verified:
			cur.VerifiedAt, cur.Failures, cur.NextCheckAt = now.UnixMilli(), 0, 0
		case Unreachable:
			cur.Failures++
			cur.NextCheckAt = now.Add(recheckWait(cur.Failures)).UnixMilli()
		default:
			cur.Failures, cur.NextCheckAt = 0, 0
		}
		out = cur
		return tx.Set(CollGrants, docID(g.AccountID, g.Provider), cur)
	})
	switch {
	case errors.Is(err, errStale), errors.Is(err, store.ErrNotFound):
		return Grant{}, errs.New(errs.Conflict, "the grant was replaced or deleted while it was being checked; read it again")
	case err != nil:
		return Grant{}, txErr(err)
	}
	s.log.Info("cloud grant checked", "account", g.AccountID, "provider", g.Provider, "trigger", trigger, "state", v.state)
	return out, nil
}

var errStale = errors.New("grant: the record changed")

// recheckWait is how long an unreachable grant waits before the next
// scheduled check: RecheckEvery, doubling with each failure in a row, up to
// MaxRecheckWait.
func recheckWait(failures int) time.Duration {
	w := RecheckEvery
	for i := 1; i < failures && w < MaxRecheckWait; i++ {
		w *= 2
	}
	return min(w, MaxRecheckWait)
}

// Recheck is the scheduled row's work: it checks the unreachable grants
// whose wait is over, and pending ones left behind by a call that died
// before its check. It reports how many it checked. A grant that changed
// meanwhile is left as it is.
func (s *Service) Recheck(ctx context.Context) (int, error) {
	now := s.now()
	var unreachable, pending []Grant
	if err := store.List(ctx, s.st, CollGrants, store.Where("state", string(Unreachable)), &unreachable); err != nil {
		return 0, txErr(err)
	}
	if err := store.List(ctx, s.st, CollGrants, store.Where("state", string(Pending)), &pending); err != nil {
		return 0, txErr(err)
	}
	var due []Grant
	for _, g := range unreachable {
		if g.NextCheckAt <= now.UnixMilli() {
			due = append(due, g)
		}
	}
	for _, g := range pending {
		if now.Sub(time.UnixMilli(g.GrantedAt)) >= stalePending {
			due = append(due, g)
		}
	}
	n, began := 0, time.Now()
	for _, g := range due {
		if n >= recheckBatch || time.Since(began) >= recheckBudget || ctx.Err() != nil {
			break
		}
		was := g.State
		if _, err := s.checkAndSettle(ctx, g, "recheck", func(cur Grant) bool { return cur.State == was }); err != nil && errs.CodeOf(err) != errs.Conflict {
			return n, err
		}
		n++
	}
	return n, nil
}
