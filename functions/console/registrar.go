package console

import (
	"context"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/registrar"
)

// registrarService adapts the registrar service to what the Handles page
// needs.
type registrarService struct{ s *registrar.Service }

// NewRegistrar is the console's view of the registrar service.
func NewRegistrar(s *registrar.Service) Registrar { return registrarService{s} }

func (r registrarService) SessionFor(ctx context.Context, email, provenance string) (string, time.Time, error) {
	v, err := r.s.SessionFor(ctx, email, provenance)
	return v.Token, v.ExpiresAt, err
}

func (r registrarService) Claim(ctx context.Context, token, name, operatorName string) (string, error) {
	c, err := r.s.Claim(ctx, token, name, operatorName)
	return c.Handle, err
}

func (r registrarService) StartPairing(ctx context.Context, token, handle string) (string, time.Time, error) {
	p, err := r.s.StartPairing(ctx, token, handle)
	return p.Code, p.ExpiresAt, err
}

func (r registrarService) Mine(ctx context.Context, token string) ([]account.Handle, error) {
	return r.s.Mine(ctx, token)
}
