package devenv

import (
	"github.com/nats-io/jwt/v2"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// AdminSocket is the operator's door into a running meshd: a Unix socket in
// the data directory (mode 0600, so only the user running meshd can use it)
// serving AdminHandler.
const AdminSocket = "admin.sock"

// AdminHandler serves the operator commands over HTTP:
//
//	POST /admin/accounts                 {email}         → {account_id, email, created}
//	POST /admin/agent-tokens             {account, name, operator_name?}
//	                                     → {token, id, label, expires_in, command, handle_claim, handle_note, operator_name}
//	POST /admin/agents/{id}/retire       {reason}        → {ok}
//	POST /admin/accounts/{id}/disable    {reason}        → {ok}
//	POST /admin/operator-credentials     {ttl, label?}   → {public_key, name, jwt, seed, creds, expires_at, mesh}
//	POST /admin/operator-credentials/{key}/revoke        → {ok}
//	POST /admin/catalog/{agent}/official {official: on|off} → {entry}
//	POST /admin/catalog/{agent}/remove                   → {agent_id, removed}
//	POST /admin/credits/{owner}/grant    {credits, reason?} → {owner, credits, currency, updated_at}
//	POST /admin/credits/{owner}/balance                   → {owner, credits, currency, updated_at}
//
// The same handler runs behind the socket of a running meshd and in-process
// in the admin command when no meshd is running.
func AdminHandler(c *Control, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn httpx.HandlerFunc) { mux.Handle(pattern, httpx.Handle(log, fn)) }
	h("POST /admin/accounts", func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Email string `json:"email"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		a, created, err := c.Accounts.CreateAccount(r.Context(), b.Email)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"account_id": a.ID, "email": a.Email, "created": created})
		return nil
	})
	h("POST /admin/agent-tokens", func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Account      string `json:"account"`
			Name         string `json:"name"`
			OperatorName string `json:"operator_name"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		g, err := c.Accounts.AdminMintAgentKeyFor(r.Context(), b.Account, b.Name, b.OperatorName)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"token": g.Token, "id": g.ID, "label": g.Label,
			"expires_in": g.ExpiresIn, "command": g.Command, "handle_claim": g.HandleClaim, "handle_note": g.HandleNote,
			"operator_name": g.OperatorName})
		return nil
	})
	reasoned := func(do func(ctx context.Context, id, reason string) error) httpx.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) error {
			var b struct {
				Reason string `json:"reason"`
			}
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true, AllowEmpty: true}); err != nil {
				return err
			}
			if err := do(r.Context(), r.PathValue("id"), b.Reason); err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
			return nil
		}
	}
	h("POST /admin/agents/{id}/retire", reasoned(c.Credentials.RetireAgent))
	h("POST /admin/accounts/{id}/disable", reasoned(func(ctx context.Context, id, reason string) error {
		if reason == "" {
			reason = "disabled by the operator"
		}
		return c.Credentials.DisableAccount(ctx, id, reason)
	}))
	h("POST /admin/operator-credentials", func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			TTL   string `json:"ttl"`
			Label string `json:"label"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		ttl, err := OperatorTTL(b.TTL)
		if err != nil {
			return err
		}
		res, err := c.Credentials.MintOperator(r.Context(), b.Label, ttl)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, res)
		return nil
	})
	h("POST /admin/operator-credentials/{key}/revoke", func(w http.ResponseWriter, r *http.Request) error {
		if err := c.Credentials.RevokeOperator(r.Context(), r.PathValue("key")); err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
		return nil
	})
	h("POST /admin/catalog/{agent}/official", func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Official string `json:"official"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		var on bool
		switch b.Official {
		case "on":
			on = true
		case "off":
		default:
			return errs.Newf(errs.InvalidRequest, "say on or off, not %q", b.Official)
		}
		out, err := catalogAdmin(r.Context(), c, map[string]any{"agent_id": r.PathValue("agent"), "official": on})
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	h("POST /admin/catalog/{agent}/remove", func(w http.ResponseWriter, r *http.Request) error {
		out, err := catalogAdmin(r.Context(), c, map[string]any{"agent_id": r.PathValue("agent"), "remove": true})
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	h("POST /admin/catalog/{agent}/restore", func(w http.ResponseWriter, r *http.Request) error {
		out, err := catalogAdmin(r.Context(), c, map[string]any{"agent_id": r.PathValue("agent"), "restore": true})
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	h("POST /admin/credits/{owner}/grant", func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Credits int64  `json:"credits"`
			Reason  string `json:"reason"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		payload := map[string]any{"owner": r.PathValue("owner"), "credits": b.Credits}
		if b.Reason != "" {
			payload["reason"] = b.Reason
		}
		out, err := busAdmin(r.Context(), c, protocol.SubjCreditsGrant, "credits", payload)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	h("POST /admin/credits/{owner}/balance", func(w http.ResponseWriter, r *http.Request) error {
		out, err := busAdmin(r.Context(), c, protocol.CreditVerbSubject("balance"), "credits", map[string]any{"owner": r.PathValue("owner")})
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	})
	return httpx.JSONErrors(mux, log)
}

// busAdmin asks a bus worker to act for the operator (subject, signed by
// the services key). What lives on the bus cannot be changed on a stopped
// mesh.
func busAdmin(ctx context.Context, c *Control, subject, what string, payload map[string]any) (map[string]any, error) {
	if c.Bus == nil {
		return nil, errs.Newf(errs.Unavailable, "the %s live on the bus: start meshd on this data dir, then run the command again", what)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := c.Bus.Call(ctx, subject, protocol.TypeRequest, payload)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the "+what+" service did not answer; retry shortly")
	}
	return out, nil
}

// catalogAdmin asks the activity worker to change the catalog as the
// operator (protocol.SubjCatalogAdmin, signed by the services key). The
// catalog lives on the bus, so a stopped mesh cannot change it.
func catalogAdmin(ctx context.Context, c *Control, payload map[string]any) (map[string]any, error) {
	if c.Bus == nil {
		return nil, errs.New(errs.Unavailable, "the catalog lives on the bus: start meshd on this data dir, then run the command again")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := c.Bus.Call(ctx, protocol.SubjCatalogAdmin, protocol.TypeRequest, payload)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the catalog service did not answer; retry shortly")
	}
	return out, nil
}

// OperatorTTL reads the lifetime of an operator test credential: a Go
// duration ("1h", "90m"), required, more than zero and at most
// creds.MaxOperatorLifetime. There is no default: whoever mints one says
// how long it may read the mesh's traffic.
func OperatorTTL(s string) (time.Duration, error) {
	if s == "" {
		return 0, errs.New(errs.InvalidRequest, "an operator credential needs an explicit --ttl (for example 1h), at most 24h")
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, errs.Newf(errs.InvalidRequest, "--ttl %q is not a duration such as 1h or 90m", s)
	}
	if d > creds.MaxOperatorLifetime {
		return 0, errs.Newf(errs.InvalidRequest, "--ttl %s is more than a day; an operator credential lives at most 24h", s)
	}
	return d, nil
}

// startAdmin serves AdminHandler on the data directory's socket.
func (m *Mesh) startAdmin(dataDir string) error {
	path := filepath.Join(dataDir, AdminSocket)
	// A socket left by a meshd that died is stale; one that answers belongs
	// to a meshd still running on this directory (the data-dir lock would
	// have stopped us before this point anyway).
	if _, err := os.Stat(path); err == nil {
		if conn, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
			conn.Close()
			return fmt.Errorf("devenv: another meshd answers on %s", path)
		}
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("devenv: admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("devenv: admin socket: %w", err)
	}
	srv := &http.Server{Handler: AdminHandler(m.control, m.log.With("component", "admin")), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("admin socket stopped", "err", err)
		}
	}()
	m.closers = append(m.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(ctx)
		_ = os.Remove(path)
		return err
	})
	return nil
}

// OpenControl opens a stopped mesh's control plane for the operator
// commands: the store and the services over it, with no broker (a
// revocation recorded now is pushed when meshd next starts). It holds the
// data directory's lock until the returned close, so it fails, before
// opening anything, with a *LockedError while a meshd (or another admin
// command) has the directory, and no meshd starts there meanwhile.
func OpenControl(dataDir string, log *slog.Logger) (c *Control, closeFn func() error, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if _, err := os.Stat(filepath.Join(dataDir, keysDir)); err != nil {
		return nil, nil, fmt.Errorf("no mesh in %s (start meshd there once first): %w", dataDir, err)
	}
	lock, err := LockDataDir(dataDir, "meshd admin")
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = lock.Unlock()
		}
	}()
	trust, err := creds.Load(filepath.Join(dataDir, keysDir))
	if err != nil {
		return nil, nil, err
	}
	st, err := boltstore.Open(filepath.Join(dataDir, storeFile), boltstore.WithLockTimeout(time.Second))
	if err != nil {
		return nil, nil, err
	}
	ob, err := mail.NewOutbox(filepath.Join(dataDir, outboxDir), log)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	c = &Control{Store: st}
	c.Accounts = account.New(account.Config{Store: st, Mail: ob, Log: log})
	c.Credentials = credential.New(credential.Config{Store: st, Trust: trust, Log: log})
	return c, func() error { return errors.Join(st.Close(), lock.Unlock()) }, nil
}

// applyStoredRevocations pushes to the broker every revocation the store
// holds, so ones recorded while meshd was stopped take effect at start.
func (m *Mesh) applyStoredRevocations(ctx context.Context, st store.Store) error {
	var revs []struct {
		Key string `json:"key"`
		At  int64  `json:"at"`
	}
	if err := store.List(ctx, st, credential.CollRevocations, store.Query{}, &revs); err != nil {
		return fmt.Errorf("devenv: read revocations: %w", err)
	}
	if len(revs) == 0 {
		return nil
	}
	// One account update for all of them: each push re-signs the JWT.
	return m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		for _, r := range revs {
			if err := creds.RevokeCredentials(ac, time.UnixMilli(r.At), r.Key); err != nil {
				return err
			}
		}
		return nil
	})
}
