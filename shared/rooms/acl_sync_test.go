package rooms

import (
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/keys"
)

// TestRevocationSyncTimer: a revocation the broker lost after the expel
// (another process's update of the account JWT replaced the one carrying
// it) is made again by a copy's own sync timer, with no sweep: the
// credential's connection, dialled back in, closes (or the dial is
// refused, when the timer was first).
func TestRevocationSyncTimer(t *testing.T) {
	m := startACL(t, 1, Limits{}, true)
	w, err := Start(t.Context(), bustest.Env(t, m.b, "rooms-timer", nil),
		Config{Credentials: m.workers[0].cfg.Credentials, RevocationSync: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })

	creator, member := bustest.Agent(t), bustest.Agent(t)
	desc, _ := m.room(creator, GradeACL)
	m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})
	cred := m.must(nil, member, "credential", map[string]any{"descriptor": desc})
	seed, _ := cred["seed"].(string)
	key, err := keys.FromSeed[keys.CredentialRole]([]byte(seed))
	if err != nil {
		t.Fatal(err)
	}
	m.must(nil, creator, "expel", map[string]any{"descriptor": desc, "member": member.Public()})
	if err := m.b.UpdateMeshAccount(t.Context(), func(ac *jwt.AccountClaims) error {
		delete(ac.Revocations, key.Public())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The timer may restore it before the dial; then the dial is refused.
	if back, err := m.dialRoom(cred); err == nil {
		back.waitClosed(t, time.Now())
	}
	if m.revokedAt(key.Public()).IsZero() {
		t.Fatal("the connection closed but the broker does not revoke the credential")
	}
}
