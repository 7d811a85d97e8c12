package googlefake

import (
	"context"
	"testing"
	"time"

	credentials "cloud.google.com/go/iam/credentials/apiv1"
	"cloud.google.com/go/iam/credentials/apiv1/credentialspb"
	resourcemanager "cloud.google.com/go/resourcemanager/apiv3"
	"cloud.google.com/go/resourcemanager/apiv3/resourcemanagerpb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// The world reads the caller from the bearer token: a token it never
// issued is refused, the chain is walked hop by hop, and the token it
// mints stands for the chain's last account.
func TestChainAndPrincipals(t *testing.T) {
	f := Start(t)
	rt := f.Provider("rt@mesh-prod.iam.gserviceaccount.com", "dep@mesh-prod.iam.gserviceaccount.com")
	f.Customer("acme-agents", "agent@acme-agents.iam.gserviceaccount.com", "dep@mesh-prod.iam.gserviceaccount.com", "acct_test")

	stranger, err := credentials.NewIamCredentialsClient(t.Context(), f.Options("not-a-token")...)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	req := &credentialspb.GenerateAccessTokenRequest{Name: "projects/-/serviceAccounts/agent@acme-agents.iam.gserviceaccount.com",
		Delegates: []string{"projects/-/serviceAccounts/dep@mesh-prod.iam.gserviceaccount.com"}, Scope: []string{"s"}}
	if _, err := stranger.GenerateAccessToken(ctx(t), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("an unknown token: %v", err)
	}

	iam, err := credentials.NewIamCredentialsClient(t.Context(), f.Options(rt)...)
	if err != nil {
		t.Fatal(err)
	}
	defer iam.Close()
	// Without the delegate the runtime may not act as the customer.
	direct := &credentialspb.GenerateAccessTokenRequest{Name: req.Name, Scope: []string{"s"}}
	_, err = iam.GenerateAccessToken(ctx(t), direct)
	if ae, ok := apierror.FromError(err); !ok || ae.GRPCStatus().Code() != codes.PermissionDenied || ae.Reason() != "IAM_PERMISSION_DENIED" {
		t.Fatalf("no delegate: %v", err)
	}
	resp, err := iam.GenerateAccessToken(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := resourcemanager.NewProjectsClient(t.Context(), f.Options(resp.GetAccessToken())...)
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	p, err := rm.GetProject(ctx(t), &resourcemanagerpb.GetProjectRequest{Name: "projects/acme-agents"})
	if err != nil || p.GetProjectId() != "acme-agents" {
		t.Fatalf("%v %v", p, err)
	}
	calls := f.Calls()
	last := calls[len(calls)-1]
	if last.Method != "GetProject" || last.Principal != "agent@acme-agents.iam.gserviceaccount.com" || last.Code != codes.OK {
		t.Errorf("last call %+v", last)
	}
	if calls[0].Principal != "" || calls[0].Code != codes.Unauthenticated {
		t.Errorf("first call %+v", calls[0])
	}
}
