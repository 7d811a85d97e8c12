package credential

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// JobRequest is the body of POST /v1/job-credential: a node asks for a
// narrow, minutes-long credential that lets a worker process act for one of
// its agents on one task, and nothing else. Both the node key and the agent
// key sign the same job string, so neither can ask alone:
//
//	mesh-job-cred-v1:<ts>:<node_id>:<agent_id>:<task_id>:<ttl_seconds>
//
// (standard base64 signatures, like the node-credential strings).
type JobRequest struct {
	NodeID     string `json:"node_id"`
	AgentID    string `json:"agent_id"`
	TaskID     string `json:"task_id"`
	TS         *int64 `json:"ts"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty"` // 0: ten minutes; 60..900
	NodeSig    string `json:"node_sig"`
	AgentSig   string `json:"agent_sig"`
}

// JobResult is the answer: the worker gets its own credential key's seed.
type JobResult struct {
	OK        bool           `json:"ok"`
	JWT       string         `json:"jwt"`
	Seed      string         `json:"seed"`
	Creds     string         `json:"creds"`
	AgentID   string         `json:"agent_id"`
	TaskID    string         `json:"task_id"`
	ExpiresAt string         `json:"expires_at"`
	Mesh      map[string]any `json:"mesh"`
	// InboxPrefix is the reply prefix the job's connection sets: its only
	// reply space.
	InboxPrefix string `json:"inbox_prefix"`
}

// JobString is the signed string of a job credential request.
func JobString(ts int64, nodeID, agentID, taskID string, ttlSeconds int64) string {
	return fmt.Sprintf("mesh-job-cred-v1:%d:%s:%s:%s:%d", ts, nodeID, agentID, taskID, ttlSeconds)
}

// JobCredential issues a job credential.
func (s *Service) JobCredential(ctx context.Context, r JobRequest) (JobResult, error) {
	if r.NodeID == "" || r.AgentID == "" || r.TaskID == "" || r.TS == nil || r.NodeSig == "" || r.AgentSig == "" {
		return JobResult{}, bad("node_id, agent_id, task_id, ts, node_sig, agent_sig required")
	}
	if !keys.IsUserPublicKey(r.NodeID) {
		return JobResult{}, bad("node_id must be a user public key")
	}
	if err := CheckAgentID(r.AgentID, "agent_id"); err != nil {
		return JobResult{}, err
	}
	// The task id becomes a subject token of the permissions: anything but
	// a plain token could widen them ("x.>").
	if !protocol.ValidToken(r.TaskID) {
		return JobResult{}, bad("task_id must be 1-128 characters of A-Z a-z 0-9 _ -")
	}
	ttl := DefaultJobTTL
	if r.TTLSeconds != 0 {
		ttl = time.Duration(r.TTLSeconds) * time.Second
		if ttl < MinJobTTL || ttl > MaxJobTTL {
			return JobResult{}, bad("ttl_seconds must be between 60 and 900")
		}
	}
	now := s.now()
	if d := now.Sub(time.Unix(*r.TS, 0)); d > TimestampSkew || d < -TimestampSkew {
		return JobResult{}, unauth(errs.Unauthorized, "stale timestamp; re-sign with current time")
	}
	msg := []byte(JobString(*r.TS, r.NodeID, r.AgentID, r.TaskID, r.TTLSeconds))
	if protocol.VerifyString(r.NodeID, msg, r.NodeSig, protocol.Base64Std) != nil {
		return JobResult{}, unauth(errs.IdentityMismatch, "node_sig does not verify against node_id")
	}
	if protocol.VerifyString(r.AgentID, msg, r.AgentSig, protocol.Base64Std) != nil {
		return JobResult{}, unauth(errs.IdentityMismatch, "agent_sig does not verify against agent_id")
	}
	if err := s.minting(); err != nil {
		return JobResult{}, err
	}
	cred, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return JobResult{}, errs.Wrap(errs.InternalError, "credential key", err)
	}
	expires := now.Add(ttl)
	var res JobResult
	var minted Mint
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		accountID, hs, err := standing(tx, []string{r.AgentID})
		if err != nil {
			return err
		}
		tok, err := s.mint(mintSpec{kind: creds.KindJob, key: cred.Public(), name: "job " + r.TaskID, hosted: []string{r.AgentID}, taskID: r.TaskID, expires: expires})
		if err != nil {
			return err
		}
		if err := rememberHost(tx, r.AgentID, hs[0], cred.Public()); err != nil {
			return err
		}
		m := Mint{ID: protocol.NewID(), Kind: "job", Key: cred.Public(), Agents: []string{r.AgentID}, AccountID: accountID,
			TaskID: r.TaskID, IssuedAt: ms(now), ExpiresAt: ms(expires)}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		minted = m
		seed := cred.Seed()
		cf, err := jwt.FormatUserConfig(tok, seed)
		if err != nil {
			return err
		}
		res = JobResult{OK: true, JWT: tok, Seed: string(seed), Creds: string(cf), AgentID: r.AgentID, TaskID: r.TaskID,
			ExpiresAt: protocol.FormatTime(expires), Mesh: s.meshBlock(), InboxPrefix: protocol.PrivateInboxPrefix(cred.Public())}
		return nil
	})
	if err != nil {
		if errs.CodeOf(err) != "" {
			return JobResult{}, err
		}
		return JobResult{}, errs.Wrap(errs.Unavailable, "cannot check the agent's standing now; retry", err)
	}
	s.keepMint(ctx, minted)
	return res, nil
}
