package grant

import (
	"context"
	"fmt"

	credentials "cloud.google.com/go/iam/credentials/apiv1"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
)

// Google is how the service reaches Google's APIs, as two identities: its
// own (the first hop of the chain) and a customer account's, through a
// token the chain minted. meshd and the Cloud Functions use ADC(); tests
// point both at an in-process world (shared/grant/googlefake).
type Google struct {
	// Self are the client options of calls the service makes as itself:
	// nil means application default credentials (the function's runtime
	// service account in the cloud; gcloud's on one machine).
	Self []option.ClientOption
	// As returns the client options of calls made with an access token
	// minted for a customer's account.
	As func(token string) []option.ClientOption
}

// ADC reaches the real APIs: as the instance's application default
// credentials, and as a customer's account with the token the chain gave.
func ADC() *Google {
	return &Google{As: func(token string) []option.ClientOption {
		return []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, TokenType: "Bearer"}))}
	}}
}

// selfClient is the service's own IAM Credentials client, made on first
// use and kept (a failure is not kept: the next call tries again, so an
// instance whose credentials arrive later recovers).
func (s *Service) selfClient(ctx context.Context) (*credentials.IamCredentialsClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.self != nil {
		return s.self, nil
	}
	c, err := credentials.NewIamCredentialsClient(ctx, s.google.Self...)
	if err != nil {
		return nil, fmt.Errorf("the IAM Credentials client: %w", err)
	}
	s.self = c
	return c, nil
}

// as returns the client options of calls made with token, which the
// chain minted for a customer account. The token is given to the client
// as a fixed value, never through a token source that would mint it: an
// error of the chain is then always the chain's own call, never one that
// surfaced through a later client's token source (DESIGN §11: never
// classify such an error).
func (s *Service) as(token string) []option.ClientOption { return s.google.As(token) }
