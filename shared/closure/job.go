package closure

import (
	"context"
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

const storeDown = "the account store is unavailable; retry shortly"

func txErr(err error) error { return errs.OrUnavailable(err, storeDown) }

// ErrBusy is Advance's answer while another runner holds the job's lease.
var ErrBusy = errors.New("closure: another runner holds this closure")

// errLeaseLost stops a runner whose lease another runner took over (it
// outlived LeaseTTL); its step's work is done again by that runner.
var errLeaseLost = errors.New("closure: the lease was taken over")

// Begin starts closing the principal's account: it needs a signed-in
// session that confirmed a passkey in the last few minutes (as minting an
// agent key does), never an API token. In one transaction it records the
// job and disables the account, so nothing new is minted, bound or signed
// in from then on and what the steps find no longer changes. A closure
// already under way is returned as it is.
func (s *Service) Begin(ctx context.Context, p *account.Principal) (Job, error) {
	if p == nil || p.Via != "session" {
		return Job{}, errs.New(errs.Forbidden, "an account is closed from a signed-in session with a passkey; API tokens cannot close one")
	}
	if !s.cfg.Accounts.Fresh(p) {
		return Job{}, errs.Newf(errs.Forbidden, "confirm with your passkey first: closing the account needs a passkey check from the last %d minutes",
			int(passkey.FreshFor/time.Minute)).WithDetail("passkey_required", true)
	}
	now := s.now()
	var job Job
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		job = Job{}
		var acct account.Account
		if err := tx.Get(account.CollAccounts, p.AccountID, &acct); err != nil {
			return err
		}
		switch err := tx.Get(CollClosures, p.AccountID, &job); {
		case err == nil && !job.Done():
			return nil // under way: resume it
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return err
		}
		job = Job{AccountID: p.AccountID, Email: acct.Email, State: StateRunning, StartedAt: ms(now)}
		for _, name := range Steps {
			job.Steps = append(job.Steps, StepState{Name: name})
		}
		if err := tx.Set(CollClosures, p.AccountID, job); err != nil {
			return err
		}
		return tx.Update(account.CollAccounts, p.AccountID, map[string]any{"disabled": true,
			"disabled_reason": "closing at its owner's request", "disabled_at": ms(now)})
	})
	if errors.Is(err, store.ErrNotFound) {
		return Job{}, errs.Newf(errs.NotFound, "no account %s", p.AccountID)
	}
	if err != nil {
		return Job{}, txErr(err)
	}
	s.log.Info("account closure begun", "account", p.AccountID)
	return job, nil
}

// Get reads a closure job.
func (s *Service) Get(ctx context.Context, accountID string) (Job, error) {
	var job Job
	err := store.Get(ctx, s.cfg.Store, CollClosures, accountID, &job)
	if errors.Is(err, store.ErrNotFound) {
		return Job{}, errs.Newf(errs.NotFound, "no closure of account %s", accountID)
	}
	return job, txErr(err)
}

// Advance runs the job's next step as runner holder and checkpoints it:
// it takes the lease (ErrBusy while another runner holds it), counts the
// step's run, runs it, and marks it done with its note in the same
// document. A done job is returned as it is.
func (s *Service) Advance(ctx context.Context, accountID, holder string) (Job, error) {
	var job Job
	i := -1
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		job, i = Job{}, -1
		if err := tx.Get(CollClosures, accountID, &job); err != nil {
			return err
		}
		if job.Done() {
			return nil
		}
		now := ms(s.now())
		if job.Lease != "" && job.Lease != holder && job.LeaseUntil > now {
			return ErrBusy
		}
		if i = job.next(); i < 0 {
			return fmt.Errorf("closure of %s: running with every step done", accountID)
		}
		job.Lease, job.LeaseUntil = holder, now+LeaseTTL.Milliseconds()
		job.Steps[i].Runs++
		return tx.Set(CollClosures, accountID, job)
	})
	switch {
	case errors.Is(err, ErrBusy):
		return job, ErrBusy
	case errors.Is(err, store.ErrNotFound):
		return Job{}, errs.Newf(errs.NotFound, "no closure of account %s", accountID)
	case err != nil:
		return Job{}, txErr(err)
	case i < 0:
		return job, nil
	}
	name := job.Steps[i].Name
	res, err := s.run(ctx, name, job)
	if err != nil {
		s.log.Warn("closure step failed; it is retried", "account", accountID, "step", name, "err", err)
		s.note(accountID, holder, fmt.Sprintf("%s: %v", name, err))
		return job, fmt.Errorf("closure step %s: %w", name, err)
	}
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Get(CollClosures, accountID, &job); err != nil {
			return err
		}
		if job.Lease != holder {
			return errLeaseLost
		}
		now := s.now()
		st := &job.Steps[i]
		st.DoneAt, st.Note, st.Skipped = ms(now), res.note, res.skipped
		if res.facts != nil {
			res.facts(&job.Facts)
		}
		job.LastError = ""
		if job.next() < 0 {
			job.State, job.FinishedAt, job.PurgeAt = StateDone, ms(now), ms(now.Add(KeepDone))
			job.Outstanding = res.outstanding
			job.Email, job.Facts, job.Lease, job.LeaseUntil = "", Facts{}, "", 0
		}
		return tx.Set(CollClosures, accountID, job)
	})
	if err != nil {
		return job, txErr(err)
	}
	s.log.Info("closure step done", "account", accountID, "step", name, "skipped", res.skipped)
	if job.Done() {
		s.log.Info("account closed", "account", accountID)
	}
	return job, nil
}

// note records why a run stopped, if holder still holds the job.
func (s *Service) note(accountID, holder, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		var job Job
		if err := tx.Get(CollClosures, accountID, &job); err != nil {
			return err
		}
		if job.Lease != holder {
			return nil
		}
		return tx.Update(CollClosures, accountID, map[string]any{"last_error": clip(why, 500)})
	})
	if err != nil {
		s.log.Warn("closure: the failure could not be recorded", "account", accountID, "err", err)
	}
}

// release gives up holder's lease, so the next runner need not wait for it
// to lapse.
func (s *Service) release(accountID, holder string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		var job Job
		if err := tx.Get(CollClosures, accountID, &job); err != nil || job.Lease != holder {
			return err
		}
		return tx.Update(CollClosures, accountID, map[string]any{"lease": "", "lease_until": 0})
	})
}

// Run advances the job until it is done, a step fails, another runner
// holds it, or ctx ends; it returns the job as it stands. A closure cut
// off here is finished by the scheduled row (Resume).
func (s *Service) Run(ctx context.Context, accountID string) (Job, error) {
	holder := protocol.NewID()
	for {
		job, err := s.Advance(ctx, accountID, holder)
		if err != nil || job.Done() {
			if err != nil && !errors.Is(err, ErrBusy) {
				s.release(accountID, holder)
			}
			return job, err
		}
		if ctx.Err() != nil {
			s.release(accountID, holder)
			return job, ctx.Err()
		}
	}
}

// Resume is the scheduled row's job: it runs every unfinished closure whose
// lease is free to its end (a closure whose step keeps failing waits for the
// next run), and deletes the records of closures done more than KeepDone
// ago. It reports how many closures it finished or deleted.
func (s *Service) Resume(ctx context.Context) (int, error) {
	var running, done []Job
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Query(CollClosures, store.Where("state", StateRunning), &running); err != nil {
			return err
		}
		return tx.Query(CollClosures, store.Where("state", StateDone), &done)
	})
	if err != nil {
		return 0, txErr(err)
	}
	n := 0
	var errList []error
	now := ms(s.now())
	for _, j := range running {
		if j.Lease != "" && j.LeaseUntil > now {
			continue // a runner is at it
		}
		job, err := s.Run(ctx, j.AccountID)
		switch {
		case errors.Is(err, ErrBusy):
		case err != nil:
			errList = append(errList, fmt.Errorf("closure of %s: %w", j.AccountID, err))
		case job.Done():
			n++
		}
		if ctx.Err() != nil {
			break
		}
	}
	for _, j := range done {
		if j.PurgeAt == 0 || j.PurgeAt > now {
			continue
		}
		err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error { return tx.Delete(CollClosures, j.AccountID) })
		if err != nil {
			errList = append(errList, err)
			continue
		}
		n++
	}
	return n, errors.Join(errList...)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
