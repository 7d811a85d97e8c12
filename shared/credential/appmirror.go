package credential

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// AppMirror keeps, on the bus, which agents each live app may read the
// activity and usage of, for the activity worker, which never reads this
// store (activity.AppAgentsMirror). An answer is read from the store when
// the mirror calls it: app key → AppAgents, live apps only.
type AppMirror interface {
	// Sync brings the records of appKeys in line with answer, retrying
	// while other writers change them; it reports the records written.
	Sync(ctx context.Context, appKeys []string, answer func(context.Context) (map[string][]string, error)) (int, error)
	// Resync brings every record in line with answer, which names every
	// live app; it reports the records corrected.
	Resync(ctx context.Context, answer func(context.Context) (map[string][]string, error)) (int, error)
}

// mirrorTimeout bounds the mirror's update after a change.
const mirrorTimeout = 30 * time.Second

// mirrorAccount updates the bus's records of the account's apps after a
// change the store has committed (an app created, refreshed or revoked, an
// agent bound or retired, the account disabled). A failure is logged, not
// returned: the change stands, and the credential sweep (ResyncApps)
// corrects the records within its interval.
func (s *Service) mirrorAccount(ctx context.Context, accountID string) {
	if s.cfg.Apps == nil || accountID == "" {
		return
	}
	// Committed: mirror it even if the caller has gone.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mirrorTimeout)
	defer cancel()
	apps, err := s.ListApps(ctx, accountID)
	if err == nil && len(apps) == 0 {
		return
	}
	if err == nil {
		keys := make([]string, len(apps))
		for i, a := range apps {
			keys[i] = a.Key
		}
		_, err = s.cfg.Apps.Sync(ctx, keys, func(ctx context.Context) (map[string][]string, error) {
			return s.accountAppAgents(ctx, accountID, nil)
		})
	}
	if err != nil {
		s.log.Warn("the bus's record of the account's apps was not updated; the credential sweep corrects it",
			"account", accountID, "err", err)
	}
}

// ResyncApps brings the bus's app records in line with the store: every
// live app's written, every other deleted. It is part of the credential
// sweep, so a record a failed update left wrong is corrected within
// SweepInterval. It reports the records corrected.
func (s *Service) ResyncApps(ctx context.Context) (int, error) {
	if s.cfg.Apps == nil {
		return 0, nil
	}
	n, err := s.cfg.Apps.Resync(ctx, func(ctx context.Context) (map[string][]string, error) {
		var apps []App
		if err := store.List(ctx, s.st, CollApps, store.Query{}, &apps); err != nil {
			return nil, err
		}
		byAccount := map[string][]App{}
		for _, a := range apps {
			byAccount[a.AccountID] = append(byAccount[a.AccountID], a)
		}
		out := map[string][]string{}
		for _, id := range slices.Sorted(maps.Keys(byAccount)) {
			if !slices.ContainsFunc(byAccount[id], func(a App) bool { return a.RevokedAt == 0 }) {
				continue
			}
			m, err := s.accountAppAgents(ctx, id, byAccount[id])
			if err != nil {
				return nil, err
			}
			maps.Copy(out, m)
		}
		return out, nil
	})
	if err != nil {
		return n, errs.Wrap(errs.DependencyFailed, "the bus's app records could not be brought in line with the store", err)
	}
	if n > 0 {
		s.log.Warn("app records on the bus were corrected", "count", n)
	}
	return n, nil
}

// AppAgents is what the activity worker answers an app about: the agents
// of the account that owns the live app whose key is appKey, every agent
// it ever bound and every app key it holds, so the app reads their
// activity and usage. A key that is no app, a revoked app and a disabled
// account's are NOT_FOUND. The worker reads it from the app's record on
// the bus, which the mirror writes from accountAppAgents.
func (s *Service) AppAgents(ctx context.Context, appKey string) ([]string, error) {
	var apps []App
	if err := store.List(ctx, s.st, CollApps, store.Where("key", appKey), &apps); err != nil {
		return nil, txErr(err)
	}
	if len(apps) != 1 || apps[0].RevokedAt != 0 {
		return nil, errs.Newf(errs.NotFound, "%s is no live app", appKey)
	}
	m, err := s.accountAppAgents(ctx, apps[0].AccountID, nil)
	if err != nil {
		return nil, txErr(err)
	}
	agents, ok := m[appKey]
	if !ok {
		return nil, errs.Newf(errs.NotFound, "%s is no live app: its account is disabled", appKey)
	}
	return agents, nil
}

// accountAppAgents maps each live app of the account to the agents it may
// read about (sorted): none when the account is gone or disabled. apps are
// the account's apps when the caller has read them, else nil.
func (s *Service) accountAppAgents(ctx context.Context, accountID string, apps []App) (map[string][]string, error) {
	out := map[string][]string{}
	var acct account.Account
	if err := store.Get(ctx, s.st, account.CollAccounts, accountID, &acct); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return out, nil
		}
		return nil, err
	}
	if acct.Disabled {
		return out, nil
	}
	if apps == nil {
		var err error
		if apps, err = s.ListApps(ctx, accountID); err != nil {
			return nil, err
		}
	}
	agents, err := s.Agents(ctx, accountID)
	if err != nil {
		return nil, err
	}
	list := make([]string, 0, len(agents)+len(apps))
	for _, a := range agents {
		list = append(list, a.ID)
	}
	for _, a := range apps {
		list = append(list, a.Key)
	}
	slices.Sort(list)
	list = slices.Compact(list)
	for _, a := range apps {
		if a.RevokedAt == 0 {
			out[a.Key] = list
		}
	}
	return out, nil
}
