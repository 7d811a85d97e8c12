package closure

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
)

// result is what a step did: its note, whether it was skipped, what it
// adds to the job's facts (applied at its checkpoint), and for the last
// step the outstanding list.
type result struct {
	note        string
	skipped     bool
	facts       func(*Facts)
	outstanding []string
}

// run runs one step on the job as it was when the step was taken up.
// Every step is idempotent: it may run again after a runner died between
// its work and its checkpoint.
func (s *Service) run(ctx context.Context, step string, job Job) (result, error) {
	id, email, agents := job.AccountID, job.Email, job.Facts.Agents
	switch step {
	case StepRecord:
		return s.record(ctx, job)
	case StepRevokeKeys:
		closed, err := s.cfg.Credentials.CloseAccount(ctx, id)
		if err != nil {
			return result{}, err
		}
		n, err := s.cfg.Accounts.RevokeKeys(ctx, id)
		if err != nil {
			return result{}, err
		}
		where := "at the broker (their connections closed at once)"
		if !s.cfg.BrokerRevokes {
			where = "in the store only (this instance cannot reach the broker; renewals are refused)"
		}
		return result{note: fmt.Sprintf("Revoked %s %s, tombstoned %s, and revoked %d unused agent keys and API tokens.",
			count(closed.Revoked, "credential key"), where, count(len(closed.Agents), "agent"), n)}, nil
	case StepDeregister:
		if s.cfg.Bus == nil {
			return result{skipped: true, note: "Skipped: this instance has no bus connection."}, nil
		}
		removed, err := s.deregister(ctx, agents)
		if err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Removed %s from the registry and withdrew the catalog entries of %s.", count(removed, "registration"), count(len(agents), "agent"))}, nil
	case StepReleaseHandles:
		hs, err := s.cfg.Registrar.ReleaseHandles(ctx, id, email)
		if err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Released %s.", count(len(hs), "handle"))}, nil
	case StepDetach:
		g, err := grant.ForgetAccount(ctx, s.cfg.Store, id)
		if err != nil {
			return result{}, err
		}
		if err := accountview.DropSubscriptions(ctx, s.cfg.Store, id); err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Forgot %s and dropped the catalog subscriptions.", count(g, "cloud grant"))}, nil
	case StepEndSessions:
		n, err := s.cfg.Accounts.EndSessions(ctx, id, email)
		if err != nil {
			return result{}, err
		}
		m, err := s.cfg.Registrar.EndSessions(ctx, email)
		if err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Deleted %d console sessions and passkey ceremonies and %s.", n, count(m, "registrar session"))}, nil
	case StepPurgeAudit:
		return s.purgeAudit(ctx, agents)
	case StepPurgeActivity:
		if s.cfg.Bus == nil {
			return result{skipped: true, note: "Skipped: this instance has no bus connection."}, nil
		}
		if err := s.erase(ctx, agents); err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Erased the activity timeline, usage counters and feeds (history and latest values) of %s.", count(len(agents), "agent"))}, nil
	case StepPurgeRecords:
		n, err := s.cfg.Credentials.PurgeAccount(ctx, id, agents)
		if err != nil {
			return result{}, err
		}
		a, err := grant.PurgeActions(ctx, s.cfg.Store, id)
		if err != nil {
			return result{}, err
		}
		k, err := s.cfg.Accounts.PurgeAccount(ctx, id, email)
		if err != nil {
			return result{}, err
		}
		return result{note: fmt.Sprintf("Deleted the account, its address's index and %s.", count(n+a+k, "other record"))}, nil
	case StepNotify:
		out := s.outstanding(job)
		if err := s.mailOutstanding(ctx, job, out); err != nil {
			return result{}, err
		}
		return result{note: "Mailed the outstanding list to the account's address, then forgot the address.", outstanding: out}, nil
	}
	return result{}, fmt.Errorf("unknown step %q", step)
}

// record notes the facts the later steps and the answer need.
func (s *Service) record(ctx context.Context, job Job) (result, error) {
	ags, err := s.cfg.Credentials.Agents(ctx, job.AccountID)
	if err != nil {
		return result{}, err
	}
	var f Facts
	for _, a := range ags {
		f.Agents = append(f.Agents, a.ID)
	}
	slices.Sort(f.Agents)
	hs, err := s.cfg.Registrar.HandlesOf(ctx, job.AccountID, job.Email)
	if err != nil {
		return result{}, err
	}
	for _, h := range hs {
		f.Handles = append(f.Handles, h.Handle)
	}
	if f.Grants, err = grant.HeldBy(ctx, s.cfg.Store, job.AccountID); err != nil {
		return result{}, err
	}
	if f.AnchorDates, f.AuditRows, err = s.auditFacts(ctx, f.Agents); err != nil {
		return result{}, err
	}
	return result{note: fmt.Sprintf("Noted %s, %s and %s.", count(len(f.Agents), "agent"), count(len(f.Handles), "handle"), count(len(f.Grants), "cloud grant")),
		facts: func(dst *Facts) { *dst = f }}, nil
}

// auditFacts reads how many rows the agents' chains hold and the dates of
// the anchors that committed to one of their heads.
func (s *Service) auditFacts(ctx context.Context, agents []string) (dates []string, rows int64, err error) {
	if s.cfg.Chains == nil {
		return nil, 0, nil
	}
	for _, a := range agents {
		h, found, err := s.cfg.Chains.Head(ctx, a)
		if err != nil {
			return nil, 0, fmt.Errorf("audit head of %s: %w", a, err)
		}
		if !found {
			continue
		}
		rows += h.Seq
		ps, err := s.cfg.Chains.Proofs(ctx, a)
		if err != nil {
			return nil, 0, fmt.Errorf("audit proofs of %s: %w", a, err)
		}
		for _, p := range ps {
			if !slices.Contains(dates, p.Date) {
				dates = append(dates, p.Date)
			}
		}
	}
	slices.Sort(dates)
	return dates, rows, nil
}

// purgeAudit purges the agents' chains. An anchor made since StepRecord
// may have committed to a head too: the dates are read again first and
// added to the facts at the checkpoint.
func (s *Service) purgeAudit(ctx context.Context, agents []string) (result, error) {
	if s.cfg.Chains == nil {
		return result{skipped: true, note: "Skipped: this instance keeps no audit chains."}, nil
	}
	dates, _, err := s.auditFacts(ctx, agents)
	if err != nil {
		return result{}, err
	}
	for _, a := range agents {
		if err := s.cfg.Chains.Purge(ctx, a); err != nil {
			return result{}, fmt.Errorf("purge the audit chain of %s: %w", a, err)
		}
	}
	return result{note: fmt.Sprintf("Purged the audit chains of %s.", count(len(agents), "agent")),
		facts: func(f *Facts) {
			for _, d := range dates {
				if !slices.Contains(f.AnchorDates, d) {
					f.AnchorDates = append(f.AnchorDates, d)
				}
			}
			slices.Sort(f.AnchorDates)
		}}, nil
}

// deregister removes the agents' registrations (mesh.internal.registry.
// remove) and catalog entries (mesh.internal.catalog.admin), and reports
// how many registrations this call removed.
func (s *Service) deregister(ctx context.Context, agents []string) (int, error) {
	removed := 0
	for batch := range slices.Chunk(agents, busBatch) {
		out, err := s.call(ctx, protocol.SubjRegistryRemove, map[string]any{"agents": batch})
		if err != nil {
			return removed, fmt.Errorf("registry: %w", err)
		}
		l, _ := out["removed"].([]any)
		removed += len(l)
	}
	for _, a := range agents {
		if _, err := s.call(ctx, protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "remove": true}); err != nil {
			return removed, fmt.Errorf("catalog: %w", err)
		}
	}
	return removed, nil
}

// erase asks the activity worker to erase the agents' timeline, counters
// and feeds (mesh.internal.guest.erase erases by key, whatever the key).
func (s *Service) erase(ctx context.Context, agents []string) error {
	for batch := range slices.Chunk(agents, busBatch) {
		if _, err := s.call(ctx, protocol.SubjGuestErase, map[string]any{"keys": batch}); err != nil {
			return fmt.Errorf("activity: %w", err)
		}
	}
	return nil
}

func (s *Service) call(ctx context.Context, subject string, payload any) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, busTimeout)
	defer cancel()
	return s.cfg.Bus.Call(ctx, subject, protocol.TypeRequest, payload)
}

// mailOutstanding mails the outstanding list to the account's address.
func (s *Service) mailOutstanding(ctx context.Context, job Job, out []string) error {
	if job.Email == "" || s.cfg.Mail == nil {
		return nil
	}
	var b strings.Builder
	b.WriteString("Your account was closed at your request.\n\n")
	b.WriteString("Its agents are off the mesh, its handles are released, its keys and credentials are revoked, and its records, audit rows included, are deleted.\n")
	if len(out) > 0 {
		b.WriteString("\nWhat closure does not remove, and what is yours to do:\n\n")
		for _, line := range out {
			b.WriteString("- " + line + "\n")
		}
	}
	b.WriteString("\nIf you did not close this account, reply to this mail; the account cannot be restored, but a new one can be made for this address.\n")
	return s.cfg.Mail.Send(ctx, mail.Message{To: job.Email, Subject: "Your account is closed", Text: b.String(), Kind: "account-closed"})
}

// count is "1 agent", "2 agents", "no agent".
func count(n int, what string) string {
	switch n {
	case 0:
		return "no " + what
	case 1:
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
