// Package closure closes an account (spec §4.4, DESIGN §11 "Closure"): it
// says beforehand, from what this instance can reach and what the account
// holds, what closing will and will not remove (Preview); and it runs the
// cascade — revoke its keys, deregister its agents, release its handles,
// detach what is attached, end its sessions, purge its records including
// its audit rows — as a resumable job of idempotent steps, with a
// checkpoint per step in the control-plane store, because a Cloud Function
// can time out in the middle. What is left for the person to do is answered
// (and mailed) in plain sentences.
//
// The job is one document per account (CollClosures). A runner takes a
// lease on it, runs the first step not done, and checkpoints it; the
// closing request runs as many steps as its time allows, and a scheduled
// row (Resume) finishes closures left unfinished. Every step may run again
// after a crash between its work and its checkpoint, so each one is
// idempotent; a step that was checkpointed never runs again.
package closure

import (
	"context"
	"log/slog"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// CollClosures holds the closure jobs; id: the account id.
const CollClosures = "account_closures"

// The steps, in the order they run. Keys are revoked first and
// registrations removed after, so that no agent of the account can
// register again between the two.
const (
	// StepRecord notes what the later steps remove and what the answer
	// must name (agents, handles, grants, anchors), while it can still be
	// read; the account is already disabled, so it no longer changes.
	StepRecord = "record"
	// StepRevokeKeys revokes at the broker every credential key that
	// carried one of its agents and every app key (live connections close
	// at once), tombstones its agents, and revokes its unused agent keys
	// (am_) and API tokens (amt_).
	StepRevokeKeys = "revoke_keys"
	// StepDeregister removes its agents' registrations from the registry
	// and withdraws their catalog entries, over the bus.
	StepDeregister = "deregister_agents"
	// StepReleaseHandles deletes its handles (and their pending pairing
	// codes): they resolve 404 and may be claimed again.
	StepReleaseHandles = "release_handles"
	// StepDetach forgets its cloud grants and drops its catalog
	// subscriptions.
	StepDetach = "detach_attachments"
	// StepEndSessions deletes its console and registrar sessions, its
	// passkey ceremonies and its pending codes.
	StepEndSessions = "end_sessions"
	// StepPurgeAudit purges its agents' audit chains and their proofs.
	StepPurgeAudit = "purge_audit"
	// StepPurgeActivity erases its agents' activity timeline, usage
	// counters and feeds (MESH_FEED history, mesh_feeds latest values),
	// over the bus.
	StepPurgeActivity = "purge_activity"
	// StepPurgeRecords deletes its remaining control-plane records: agents,
	// apps, mints, keys, tokens, passkeys, connect requests, the actions
	// log, the address's index and the account.
	StepPurgeRecords = "purge_records"
	// StepNotify mails the outstanding list to the address, and forgets
	// the address.
	StepNotify = "notify"
)

// Steps is every step, in order.
var Steps = []string{StepRecord, StepRevokeKeys, StepDeregister, StepReleaseHandles, StepDetach, StepEndSessions,
	StepPurgeAudit, StepPurgeActivity, StepPurgeRecords, StepNotify}

// Job states.
const (
	StateRunning = "running"
	StateDone    = "done"
)

// Defaults.
const (
	// LeaseTTL is how long a runner holds a job for one step; a runner that
	// died midway loses it after this, and another takes the job up.
	LeaseTTL = 2 * time.Minute
	// ResumeEvery is how often the scheduled row resumes unfinished
	// closures.
	ResumeEvery = 5 * time.Minute
	// RunBudget is how long the closing request runs steps before it
	// answers that the rest continues in the background: well inside a
	// Cloud Function's 60 s timeout.
	RunBudget = 40 * time.Second
	// KeepDone is how long a finished job's record (its steps and the
	// outstanding list, no address or identifiers) is kept for the
	// operator before the scheduled row deletes it.
	KeepDone = 30 * 24 * time.Hour
	// busTimeout bounds each call over the bus.
	busTimeout = 10 * time.Second
	// busBatch stays under the registry's and the activity worker's
	// per-request bounds.
	busBatch = 500
)

// Job is a closure as stored.
type Job struct {
	AccountID string `json:"account_id"`
	// Email is the address the outstanding list is mailed to; forgotten
	// when the job is done.
	Email      string      `json:"email,omitempty"`
	State      string      `json:"state"`
	StartedAt  int64       `json:"started_at"`
	FinishedAt int64       `json:"finished_at,omitempty"`
	Steps      []StepState `json:"steps"`
	// Facts are what StepRecord noted, for the later steps and the
	// answer; cleared when the job is done.
	Facts Facts `json:"facts"`
	// Outstanding is what the person must still do, in sentences; set when
	// the job is done.
	Outstanding []string `json:"outstanding,omitempty"`
	// Lease names the runner holding the job, until LeaseUntil (Unix ms).
	Lease      string `json:"lease,omitempty"`
	LeaseUntil int64  `json:"lease_until,omitempty"`
	// LastError is why the last run stopped, for the operator.
	LastError string `json:"last_error,omitempty"`
	// PurgeAt is when a done job's record is deleted (Unix ms).
	PurgeAt int64 `json:"purge_at,omitempty"`
}

// StepState is one step's checkpoint.
type StepState struct {
	Name string `json:"name"`
	// Runs counts the times the step was started: 1 for a step that ran
	// once, more when a runner died between its work and its checkpoint.
	Runs   int   `json:"runs"`
	DoneAt int64 `json:"done_at,omitempty"` // Unix ms; 0 while not done
	// Note says what the step did, or why it did nothing.
	Note string `json:"note,omitempty"`
	// Skipped is set when this instance cannot do the step (no bus, no
	// audit chains); the outstanding list says what that leaves.
	Skipped bool `json:"skipped,omitempty"`
}

// Facts are what StepRecord notes.
type Facts struct {
	Agents  []string     `json:"agents,omitempty"`
	Handles []string     `json:"handles,omitempty"`
	Grants  []grant.Held `json:"grants,omitempty"`
	// AnchorDates are the dates of the anchors that committed to a head of
	// one of the agents' chains.
	AnchorDates []string `json:"anchor_dates,omitempty"`
	// AuditRows counts the rows of the agents' chains.
	AuditRows int64 `json:"audit_rows,omitempty"`
}

// Done reports whether the job finished.
func (j *Job) Done() bool { return j.State == StateDone }

// next is the index of the first step not done, or -1.
func (j *Job) next() int {
	for i, st := range j.Steps {
		if st.DoneAt == 0 {
			return i
		}
	}
	return -1
}

// Accounts is what closure needs of the account service.
type Accounts interface {
	GetAccount(ctx context.Context, id string) (account.Account, error)
	Fresh(p *account.Principal) bool
	Counts(ctx context.Context, accountID string) (account.KeyCounts, error)
	RevokeKeys(ctx context.Context, accountID string) (int, error)
	EndSessions(ctx context.Context, accountID, email string) (int, error)
	PurgeAccount(ctx context.Context, accountID, email string) (int, error)
}

// Credentials is what closure needs of the credential service.
type Credentials interface {
	Agents(ctx context.Context, accountID string) ([]credential.Agent, error)
	ListApps(ctx context.Context, accountID string) ([]credential.App, error)
	CloseAccount(ctx context.Context, accountID string) (credential.Closed, error)
	PurgeAccount(ctx context.Context, accountID string, agents []string) (int, error)
}

// Registrar is what closure needs of the registrar.
type Registrar interface {
	HandlesOf(ctx context.Context, accountID, email string) ([]account.Handle, error)
	ReleaseHandles(ctx context.Context, accountID, email string) ([]string, error)
	EndSessions(ctx context.Context, email string) (int, error)
}

// Caller asks the bus workers, signed with the services key (bus.Caller).
type Caller interface {
	Call(ctx context.Context, subject string, typ protocol.Type, payload any) (map[string]any, error)
}

// Chains is what closure needs of the audit chains (BusChains, or
// *audit.Chains).
type Chains interface {
	Head(ctx context.Context, agent string) (audit.Head, bool, error)
	Proofs(ctx context.Context, agent string) ([]audit.Proof, error)
	Purge(ctx context.Context, agent string) error
}

// Config is what the service needs.
type Config struct {
	Store       store.Store
	Accounts    Accounts
	Credentials Credentials
	Registrar   Registrar
	// Bus reaches the registry, the catalog and the activity worker; nil
	// without a bus connection (those steps are skipped and the
	// outstanding list says what that leaves).
	Bus Caller
	// Chains are the audit chains; nil skips the audit purge likewise.
	Chains Chains
	Mail   mail.Sender
	// BrokerRevokes says whether revocations reach the broker at once
	// (a credential.Revoker is configured), or are only refused at renewal.
	BrokerRevokes bool
	// Deployer is the deployer service account customers bind for cloud
	// grants ("" when this instance has none).
	Deployer string
	// ConsoleURL is named in the mail.
	ConsoleURL string
	Now        func() time.Time
	Log        *slog.Logger
}

// Service closes accounts.
type Service struct {
	cfg Config
	now func() time.Time
	log *slog.Logger
}

// New builds the service.
func New(cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, now: cfg.Now, log: cfg.Log}
}

// Capabilities says what this instance's closure reaches, for
// /v1/capabilities.
func (s *Service) Capabilities() map[string]any {
	return map[string]any{"broker_revocation": s.cfg.BrokerRevokes, "registry": s.cfg.Bus != nil,
		"activity": s.cfg.Bus != nil, "audit": s.cfg.Chains != nil, "steps": Steps}
}

func ms(t time.Time) int64 { return t.UnixMilli() }
