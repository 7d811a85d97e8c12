package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoChains is BindChains' answer when the audit stream does not exist:
// no writer has created it, so no chain holds a row.
var ErrNoChains = errors.New("audit: the audit stream does not exist yet")

// BindChains binds the audit stream as it is, without creating or changing
// it (OpenChains does both): for a caller that must not decide the
// stream's replicas or limits, such as the control plane purging a closed
// account's chains. ErrNoChains when it does not exist.
func BindChains(ctx context.Context, js jetstream.JetStream) (*Chains, error) {
	st, err := js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, ErrNoChains
	}
	if err != nil {
		return nil, fmt.Errorf("audit: bind stream %s: %w", Stream, err)
	}
	return &Chains{js: js, stream: st, now: time.Now}, nil
}
