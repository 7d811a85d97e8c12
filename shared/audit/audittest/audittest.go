// Package audittest has what tests of the audit records share: an
// in-memory twin of the chains, timestamp authorities on loopback HTTP
// servers, and a complete export bundle made by the real anchorer and
// exporter, which tests change one link at a time.
package audittest

import (
	"context"
	"crypto"
	"fmt"
	"math/big"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/digitorus/timestamp"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// MemChains is audit.Chains in memory: a Ledger and a ChainReader whose
// rows are stamped with the time they were appended.
type MemChains struct {
	mu     sync.Mutex
	rows   map[string][]memRow
	proofs map[string][]audit.Proof
}

type memRow struct {
	row  audit.Row
	hash string
	at   time.Time
}

// NewMemChains is empty chains.
func NewMemChains() *MemChains {
	return &MemChains{rows: map[string][]memRow{}, proofs: map[string][]audit.Proof{}}
}

// Append adds e to its agent's chain as stored at the instant at.
func (m *MemChains) Append(e audit.Entry, at time.Time) (audit.Row, error) {
	if err := e.Check(); err != nil {
		return audit.Row{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	chain := m.rows[e.Agent]
	r := audit.Row{V: audit.RowVersion, Agent: e.Agent, Seq: int64(len(chain)) + 1, At: protocol.FormatTime(at),
		Role: e.Role, Peer: e.Peer, Offering: e.Offering, TaskID: e.TaskID, RequestID: e.RequestID, Outcome: e.Outcome,
		DurationMS: e.Duration.Milliseconds(), InputSHA256: e.InputSHA256, Prev: audit.GenesisPrev}
	if len(chain) > 0 {
		r.Prev = chain[len(chain)-1].hash
	}
	h, err := r.Hash()
	if err != nil {
		return audit.Row{}, err
	}
	m.rows[e.Agent] = append(chain, memRow{row: r, hash: h, at: at})
	return r, nil
}

// HeadsAt implements audit.Ledger.
func (m *MemChains) HeadsAt(_ context.Context, t time.Time) ([]audit.Head, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []audit.Head
	for agent, chain := range m.rows {
		i := len(chain)
		for i > 0 && !chain[i-1].at.Before(t) {
			i--
		}
		if i > 0 {
			out = append(out, audit.Head{Agent: agent, Seq: int64(i), Hash: chain[i-1].hash})
		}
	}
	slices.SortFunc(out, func(a, b audit.Head) int { return strings.Compare(a.Agent, b.Agent) })
	return out, nil
}

// RecordProofs implements audit.Ledger as audit.Chains does: a proof is
// kept unless the agent's last one proves the same head or a later date.
func (m *MemChains) RecordProofs(_ context.Context, proofs []audit.Proof) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range proofs {
		ps := m.proofs[p.Agent]
		if n := len(ps); n > 0 && (ps[n-1].Hash == p.Hash || ps[n-1].Date >= p.Date) {
			continue
		}
		m.proofs[p.Agent] = append(ps, p)
	}
	return nil
}

// Rows implements audit.ChainReader.
func (m *MemChains) Rows(_ context.Context, agent string) ([]audit.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []audit.Row
	for _, r := range m.rows[agent] {
		out = append(out, r.row)
	}
	return out, nil
}

// Proofs implements audit.ChainReader.
func (m *MemChains) Proofs(_ context.Context, agent string) ([]audit.Proof, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.proofs[agent]), nil
}

// Purge removes an agent's chain and proofs, as audit.Chains.Purge does.
func (m *MemChains) Purge(_ context.Context, agent string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rows, agent)
	delete(m.proofs, agent)
	return nil
}

// Authority is a test-only timestamp authority served on a loopback
// HTTP server, as the anchorer's configuration names it.
type Authority struct {
	*tsa.Authority
	Server *httptest.Server
}

// Config is the authority as configuration names it.
func (a *Authority) Config() audit.Authority {
	return audit.Authority{Name: a.Name(), URL: a.Server.URL, Root: a.Root()}
}

// NewAuthority starts a test-only authority, stopped at cleanup.
func NewAuthority(t testing.TB, name string) *Authority {
	t.Helper()
	a, err := tsa.New(name)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return &Authority{Authority: a, Server: srv}
}

// Agent is a fresh agent key's public form.
func Agent(t testing.TB) string {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

// Entry is a valid entry of agent; n tells entries apart.
func Entry(agent string, n int) audit.Entry {
	id := fmt.Sprintf("req-%d", n)
	return audit.Entry{Agent: agent, Role: audit.RoleResponder, Peer: "UPEERAGENT", Offering: "summarize",
		RequestID: id, TaskID: fmt.Sprintf("task-%d", n), Outcome: "completed", Duration: time.Duration(n) * time.Millisecond,
		InputSHA256: audit.InputDigest([]byte(id))}
}

// Token is a TimeStampToken of authority a over digest with nonce,
// carrying its certificates: what a tampering test puts in place of a
// stamp's (another authority's token over the same document and nonce).
func Token(t testing.TB, a *tsa.Authority, digest []byte, nonce *big.Int) []byte {
	t.Helper()
	q, err := (&timestamp.Request{HashAlgorithm: crypto.SHA256, HashedMessage: digest, Nonce: nonce, Certificates: true}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.Respond(q)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := timestamp.ParseResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	return ts.RawToken
}
