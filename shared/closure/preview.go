package closure

import (
	"context"
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/protocol"
)

// Item is one thing closure removes: a sentence, and how many of it the
// account holds now.
type Item struct {
	What  string `json:"what"`
	Count int    `json:"count"`
}

// Preview is what closing the account will and will not remove, from what
// it holds now and what this instance can reach.
type Preview struct {
	AccountID string `json:"account_id"`
	// WillRemove lists what closure removes, in the order it does.
	WillRemove []Item `json:"will_remove"`
	// WillNotRemove is what stays, and what the person must do, in
	// sentences: the same list the closing answer ends with.
	WillNotRemove []string `json:"will_not_remove"`
	// Steps are the steps the close action runs, in order.
	Steps []string `json:"steps"`
	// PasskeyFresh says whether the session may close the account now; if
	// not, it confirms a passkey first.
	PasskeyFresh bool `json:"passkey_fresh"`
}

// Preview says what closing p's account will and will not remove.
func (s *Service) Preview(ctx context.Context, p *account.Principal) (Preview, error) {
	id := p.AccountID
	acct, err := s.cfg.Accounts.GetAccount(ctx, id)
	if err != nil {
		return Preview{}, err
	}
	ags, err := s.cfg.Credentials.Agents(ctx, id)
	if err != nil {
		return Preview{}, err
	}
	var f Facts
	for _, a := range ags {
		f.Agents = append(f.Agents, a.ID)
	}
	apps, err := s.cfg.Credentials.ListApps(ctx, id)
	if err != nil {
		return Preview{}, err
	}
	live := 0
	for _, a := range apps {
		if a.RevokedAt == 0 {
			live++
		}
	}
	hs, err := s.cfg.Registrar.HandlesOf(ctx, id, acct.Email)
	if err != nil {
		return Preview{}, err
	}
	for _, h := range hs {
		f.Handles = append(f.Handles, h.Handle)
	}
	if f.Grants, err = grant.HeldBy(ctx, s.cfg.Store, id); err != nil {
		return Preview{}, err
	}
	if f.AnchorDates, f.AuditRows, err = s.auditFacts(ctx, f.Agents); err != nil {
		return Preview{}, errs.OrUnavailable(err, "the audit chains cannot be read now; retry shortly")
	}
	subs, err := accountview.SubscriptionCount(ctx, s.cfg.Store, id)
	if err != nil {
		return Preview{}, err
	}
	kc, err := s.cfg.Accounts.Counts(ctx, id)
	if err != nil {
		return Preview{}, err
	}
	out := Preview{AccountID: id, Steps: Steps, PasskeyFresh: s.cfg.Accounts.Fresh(p)}
	add := func(n int, what string) { out.WillRemove = append(out.WillRemove, Item{What: what, Count: n}) }

	revoke := "revoked at the broker, which closes their live connections at once"
	if !s.cfg.BrokerRevokes {
		revoke = "refused at renewal (this instance cannot revoke at the broker)"
	}
	add(len(f.Agents), "Your agents' credentials: "+revoke+"; each agent key is refused from then on.")
	add(live, "Your app credentials: "+revoke+".")
	add(kc.UnusedAgentKeys+kc.APITokens, "Your unused agent keys (am_) and API tokens (amt_): revoked, then deleted.")
	if s.cfg.Bus != nil {
		add(len(f.Agents), "Your agents' registrations: removed from the registry, and their catalog entries withdrawn.")
	}
	add(len(f.Handles), "Your handles"+listed(f.Handles)+": released; they stop resolving and may be claimed again by whoever proves the address.")
	add(len(f.Grants), "Your cloud grants: the records are forgotten (nothing in your project changes).")
	add(subs, "Your catalog subscriptions: dropped.")
	add(kc.Sessions, "Your sessions: ended, here and at the registrar; you are signed out everywhere.")
	if s.cfg.Chains != nil {
		add(int(f.AuditRows), "Your agents' audit rows, and the proofs that tie them to anchors: purged.")
	}
	if s.cfg.Bus != nil {
		add(len(f.Agents), "Your agents' activity timeline and usage counters: erased.")
	}
	add(kc.Passkeys, "Your passkeys: deleted.")
	add(1, "The account, its address "+acct.Email+", its actions log and the records of every credential minted for it: deleted. The address may sign up again, as a new account.")
	out.WillNotRemove = s.keeps(f, nil)
	return out, nil
}

// outstanding is the closing answer's list: what stays and what the person
// must do, from the facts StepRecord noted and the steps this instance
// skipped.
func (s *Service) outstanding(job Job) []string {
	skipped := map[string]bool{}
	for _, st := range job.Steps {
		skipped[st.Name] = st.Skipped
	}
	return s.keeps(job.Facts, skipped)
}

// keeps says what closure leaves, in sentences. skipped names the steps a
// closure skipped (nil in a preview, which reads this instance's
// configuration instead).
func (s *Service) keeps(f Facts, skipped map[string]bool) []string {
	var out []string
	deployer := s.cfg.Deployer
	for _, g := range f.Grants {
		if deployer != "" {
			acctName, _, _ := strings.Cut(g.ServiceAccount, "@")
			cmd := grant.Setup{ProjectID: g.ProjectID, Account: acctName, Deployer: deployer}.RevokeCommand()
			out = append(out, fmt.Sprintf("In your Google Cloud project %s, the IAM binding that lets the mesh's deployer %s create tokens for %s stays until you remove it: %s",
				g.ProjectID, deployer, g.ServiceAccount, cmd))
		} else {
			out = append(out, fmt.Sprintf("In your Google Cloud project %s, the IAM binding that lets the mesh's deployer create tokens for %s stays until you remove it (the role roles/iam.serviceAccountTokenCreator on that service account).",
				g.ProjectID, g.ServiceAccount))
		}
		if len(g.Created) > 0 {
			out = append(out, fmt.Sprintf("What the mesh deployed in project %s stays there until you delete it: %s.", g.ProjectID, strings.Join(g.Created, ", ")))
		}
	}
	if n := len(f.AnchorDates); n > 0 {
		verb := "stay"
		if n == 1 {
			verb = "stays"
		}
		out = append(out, fmt.Sprintf("%s (%s) committed to heads of your agents' audit chains and %s public: anchors are timestamped by outside authorities and cannot be withdrawn. They name no agent or account, and with the rows purged nothing the mesh keeps ties them to you.",
			count(n, "public anchor"), strings.Join(f.AnchorDates, ", "), verb))
	}
	noBus := s.cfg.Bus == nil
	if skipped != nil {
		noBus = skipped[StepDeregister] || skipped[StepPurgeActivity]
	}
	if noBus && len(f.Agents) > 0 {
		out = append(out, fmt.Sprintf("This instance has no bus connection: it cannot remove your agents' registrations or erase their activity. Registrations lapse when their vouches expire (%d days at most).",
			int(protocol.MaxVouchLifetime.Hours()/24)))
	}
	if !s.cfg.BrokerRevokes && len(f.Agents) > 0 {
		out = append(out, fmt.Sprintf("This instance cannot revoke at the broker: credentials your agents hold are refused at renewal but work until they expire (%d days at most).",
			int(credential.DefaultCredentialTTL.Hours()/24)))
	}
	if len(f.Agents) > 0 {
		out = append(out,
			"Messages your agents sent, and what they posted in rooms and on boards, stay with the agents and rooms that received them.",
			"Agent seeds, credential files and the adapter's state stay on your agents' machines: delete them there (the mesh already refuses them).",
			"Engagements your agents are party to stay on the public record: their signed documents, terminations and reviews were signed by both owners, and closure does not remove them.",
			"Credits on your agents' owner keys are abandoned, not paid out: credits are spent inside the mesh only, and nothing admits your agents' requests after closure.",
			"The revocation of each credential key stays until that credential would have expired, and a tombstone of each agent key stays (it names no account): an agent key comes back only with a new agent key from another account.")
	}
	out = append(out, "Mail the mesh sent you (sign-in codes, agent keys, this list) stays in your mailbox.")
	return out
}

// listed is " (a, b)" for a short list, "" for none.
func listed(names []string) string {
	switch {
	case len(names) == 0:
		return ""
	case len(names) > 5:
		return " (" + strings.Join(names[:5], ", ") + ", …)"
	}
	return " (" + strings.Join(names, ", ") + ")"
}
