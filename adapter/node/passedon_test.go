package node

import (
	"testing"

	"agentmesh.dev/mesh/shared/errs"
)

// The admission service's refusals a seller's node passes on as they are,
// and the errors it does not (they are about the service, not the request).
func TestPassedOn(t *testing.T) {
	for _, c := range []struct {
		e    *errs.Error
		want bool
	}{
		{errs.New(errs.AgreementRequired, "x"), true},
		{errs.New(errs.InsufficientFunds, "x"), true},
		{errs.New(errs.Forbidden, "x").WithDetail("sow_id", "s"), true},
		{errs.New(errs.Forbidden, "x"), false},
		{errs.New(errs.Conflict, "x").WithDetail("request_id", "r"), true},
		{errs.New(errs.Conflict, "x"), false},
		{errs.New(errs.Unavailable, "x"), false},
	} {
		if got := passedOn(c.e); got != c.want {
			t.Errorf("%s %v: passed on %v, want %v", c.e.Code, c.e.Details, got, c.want)
		}
	}
}
