package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
	"unicode"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/passkey"
)

// safeNext keeps a "next" page only when it is one of the console's own,
// and returns it as the escaped, cleaned path to redirect to; "" otherwise.
// The checks are made on the decoded path that will be sent, after
// cleaning: a "%5C" or "%2e%2e" that decodes into a backslash or a "..",
// which http.Redirect would clean into "/\evil.example/" (a browser reads
// that as //evil.example/), can never get through. The query and fragment
// are dropped.
func safeNext(next string) string {
	if next == "" || strings.ContainsRune(next, '\\') || hasControl(next) {
		return ""
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return ""
	}
	if strings.ContainsRune(u.Path, '\\') || hasControl(u.Path) {
		return ""
	}
	p := path.Clean(u.Path)
	if !strings.HasPrefix(p+"/", Prefix) {
		return ""
	}
	if p+"/" == Prefix {
		return Prefix
	}
	return (&url.URL{Path: p}).EscapedPath()
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, unicode.IsControl) >= 0
}

// --- Sign in ---------------------------------------------------------------

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	next := safeNext(q.Get("next"))
	if ss, err := s.current(r); err == nil && ss != nil {
		redirect(w, r, firstOf(next, Prefix))
		return
	}
	v := &view{Title: "Sign in", CSRF: s.signinToken(w, r), Form: map[string]string{"email": q.Get("email"), "next": next}}
	if email, err := account.NormalizeEmail(q.Get("email")); err == nil {
		v.Title, v.Form["email"] = "Enter your sign-in code", email
		switch {
		case q.Get("sent") != "1":
		case s.outbox != "":
			v.Notice = "Code written to the outbox on the machine running meshd (see below)."
		default:
			v.Notice = "Code sent. It can take a minute to arrive; look in your spam folder too."
		}
		s.render(w, r, http.StatusOK, "code", v)
		return
	}
	if q.Get("signed_out") == "1" {
		v.Notice = "You are signed out."
	}
	s.render(w, r, http.StatusOK, "login", v)
}

// signinFormOK checks the sign-in forms' CSRF value against the sign-in
// cookie, rendering the refusal on the page when it does not match.
func (s *Server) signinFormOK(w http.ResponseWriter, r *http.Request, page string, v *view) bool {
	c, err := r.Cookie(signinCookie)
	if err == nil && equalToken(r.PostFormValue(csrfField), c.Value) {
		return true
	}
	v.CSRF = s.signinToken(w, r)
	v.Err = errMap(page, "Your browser did not send back the console's sign-in cookie, or this form is out of date. Reload the page and try again (cookies must be allowed for this site).")
	s.render(w, r, http.StatusForbidden, page, v)
	return false
}

func (s *Server) sendCode(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Sign in", Form: map[string]string{"email": r.FormValue("email"), "next": safeNext(r.FormValue("next"))}}
	if !s.signinFormOK(w, r, "login", v) {
		return
	}
	email, err := s.acc.StartLogin(r.Context(), r.PostFormValue("email"), true, httpx.ClientKey(r, s.hops))
	if err != nil {
		status, msg := s.messageOf(err)
		v.CSRF, v.Err = s.signinToken(w, r), errMap("login", msg)
		s.render(w, r, status, "login", v)
		return
	}
	q := url.Values{"email": {email}, "sent": {"1"}}
	if n := v.Form["next"]; n != "" {
		q.Set("next", n)
	}
	redirect(w, r, Prefix+"login?"+q.Encode())
}

func (s *Server) verifyCode(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Enter your sign-in code", Form: map[string]string{"email": r.FormValue("email"), "next": safeNext(r.FormValue("next"))}}
	if !s.signinFormOK(w, r, "code", v) {
		return
	}
	tok, sess, _, err := s.acc.VerifyLogin(r.Context(), r.PostFormValue("email"), r.PostFormValue("code"))
	if err != nil {
		status, msg := s.messageOf(err)
		v.CSRF, v.Err = s.signinToken(w, r), errMap("code", msg)
		s.render(w, r, status, "code", v)
		return
	}
	s.setCookie(w, sessionCookie, tok, time.UnixMilli(sess.ExpiresAt))
	s.clearCookie(w, signinCookie)
	redirect(w, r, firstOf(v.Form["next"], Prefix))
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request, ss *session) {
	if err := s.acc.SignOut(r.Context(), ss.token); err != nil && errs.CodeOf(err) != errs.Unauthorized {
		s.fail(w, r, ss, err)
		return
	}
	s.clearCookie(w, sessionCookie)
	s.clearCookie(w, registrarCookie)
	redirect(w, r, Prefix+"login?signed_out=1")
}

// --- Account home ------------------------------------------------------------

type homeData struct {
	Passkeys   int
	Fresh      bool
	UnusedKeys int
	Keys       int
	Handles    bool
}

func (s *Server) home(w http.ResponseWriter, r *http.Request, ss *session) {
	n, err := s.acc.PasskeyCount(r.Context(), ss.p.AccountID)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	keys, err := s.acc.ListAgentKeys(r.Context(), ss.p)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	d := homeData{Passkeys: n, Fresh: s.acc.Fresh(ss.p), Keys: len(keys), Handles: s.reg != nil}
	for _, k := range keys {
		if s.acc.KeyState(k) == "unused" {
			d.UnusedKeys++
		}
	}
	s.render(w, r, http.StatusOK, "home", &view{Title: "Your account", Nav: "home", sess: ss, Data: d})
}

// --- Passkeys ----------------------------------------------------------------

type passkeysData struct {
	Count      int
	Fresh      bool
	FreshUntil time.Time
}

func (s *Server) passkeysPage(w http.ResponseWriter, r *http.Request, ss *session) {
	n, err := s.acc.PasskeyCount(r.Context(), ss.p.AccountID)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	v := &view{Title: "Passkeys", Nav: "passkeys", sess: ss,
		Data: passkeysData{Count: n, Fresh: s.acc.Fresh(ss.p), FreshUntil: ss.p.PasskeyAt.Add(passkey.FreshFor)}}
	if r.URL.Query().Get("registered") == "1" && n > 0 {
		v.Notice = "Passkey registered. You can now mint agent keys: you confirm with a passkey each time."
	}
	s.render(w, r, http.StatusOK, "passkeys", v)
}

// passkeyBegin and passkeyFinish are the two halves of a WebAuthn ceremony,
// called by console.js with the session cookie; they are the account
// service's ceremonies, bound to this session.
func (s *Server) passkeyBegin(w http.ResponseWriter, r *http.Request, ss *session) error {
	opts, id, err := s.acc.BeginPasskey(r.Context(), ss.p, r.PathValue("kind"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "ceremony": id, "options": opts})
	return nil
}

func (s *Server) passkeyFinish(w http.ResponseWriter, r *http.Request, ss *session) error {
	var b struct {
		Ceremony string          `json:"ceremony"`
		Response json.RawMessage `json:"response"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	if b.Ceremony == "" || len(b.Response) == 0 {
		return errs.New(errs.InvalidRequest, "ceremony and response are required")
	}
	res, err := s.acc.FinishPasskey(r.Context(), ss.p, b.Ceremony, b.Response)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "registered": res.Registered, "passkey_fresh": res.Fresh})
	return nil
}

// --- Agent keys --------------------------------------------------------------

type keyRow struct {
	ID, Label, State, HandleClaim, AgentID string
	CreatedAt, ExpiresAt                   int64
}

type agentKeysData struct {
	Keys     []keyRow
	Passkeys int
	Fresh    bool
	New      *account.AgentKeyGrant
}

func (s *Server) agentKeysView(r *http.Request, ss *session) (*view, error) {
	n, err := s.acc.PasskeyCount(r.Context(), ss.p.AccountID)
	if err != nil {
		return nil, err
	}
	keys, err := s.acc.ListAgentKeys(r.Context(), ss.p)
	if err != nil {
		return nil, err
	}
	d := &agentKeysData{Passkeys: n, Fresh: s.acc.Fresh(ss.p)}
	for _, k := range keys {
		d.Keys = append(d.Keys, keyRow{ID: k.ID, Label: k.Label, State: s.acc.KeyState(k), HandleClaim: k.HandleClaim,
			AgentID: k.AgentID, CreatedAt: k.CreatedAt, ExpiresAt: k.ExpiresAt})
	}
	return &view{Title: "Agent keys", Nav: "agent-keys", sess: ss, Data: d, Form: map[string]string{}}, nil
}

func (s *Server) agentKeysPage(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := s.agentKeysView(r, ss)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	if id := r.URL.Query().Get("revoked"); id != "" {
		for _, k := range v.Data.(*agentKeysData).Keys {
			if k.ID == id && k.State == "revoked" {
				v.Notice = "The agent key for " + k.Label + " (" + k.ID + ") is revoked: it can no longer be used."
			}
		}
	}
	s.render(w, r, http.StatusOK, "agent-keys", v)
}

// mintAgentKey mints through the account service, which refuses unless the
// session passed a passkey check in the last five minutes (spec §5); the
// page's script runs that check just before it sends this form. The key is
// on this one answer only: it is never stored or shown again.
func (s *Server) mintAgentKey(w http.ResponseWriter, r *http.Request, ss *session) {
	g, mintErr := s.acc.MintAgentKey(r.Context(), ss.p, r.PostFormValue("name"), r.PostFormValue("operator_name"))
	if mintErr == nil {
		// The operator name may have been set by this mint.
		if a, err := s.acc.GetAccount(r.Context(), ss.p.AccountID); err == nil {
			ss.p.Account = a
		}
	}
	v, err := s.agentKeysView(r, ss)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	if mintErr != nil {
		status, msg := s.messageOf(mintErr)
		v.Err = errMap("mint", msg)
		v.Form["name"], v.Form["operator_name"] = r.PostFormValue("name"), r.PostFormValue("operator_name")
		s.render(w, r, status, "agent-keys", v)
		return
	}
	v.Data.(*agentKeysData).New = &g
	s.render(w, r, http.StatusOK, "agent-keys", v)
}

func (s *Server) revokeAgentKey(w http.ResponseWriter, r *http.Request, ss *session) {
	id := r.PathValue("id")
	if err := s.acc.RevokeAgentKey(r.Context(), ss.p, id); err != nil {
		v, verr := s.agentKeysView(r, ss)
		if verr != nil {
			s.fail(w, r, ss, verr)
			return
		}
		status, msg := s.messageOf(err)
		v.Err = errMap("keys", msg)
		s.render(w, r, status, "agent-keys", v)
		return
	}
	redirect(w, r, Prefix+"agent-keys?revoked="+url.QueryEscape(id))
}

// --- API tokens --------------------------------------------------------------

type tokenRow struct {
	ID, Name  string
	Scopes    []string
	CreatedAt int64
	Revoked   bool
}

type newToken struct {
	Token, ID, Name string
	Scopes          []string
}

type tokensData struct {
	Tokens []tokenRow
	Scopes []string
	New    *newToken
}

func (s *Server) tokensView(r *http.Request, ss *session) (*view, error) {
	ts, err := s.acc.ListAPITokens(r.Context(), ss.p)
	if err != nil {
		return nil, err
	}
	d := &tokensData{Scopes: account.Scopes}
	for _, t := range ts {
		d.Tokens = append(d.Tokens, tokenRow{ID: t.ID, Name: t.Name, Scopes: t.Scopes, CreatedAt: t.CreatedAt, Revoked: t.RevokedAt != 0})
	}
	return &view{Title: "API tokens", Nav: "tokens", sess: ss, Data: d, Form: map[string]string{}}, nil
}

func (s *Server) tokensPage(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := s.tokensView(r, ss)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	if id := r.URL.Query().Get("revoked"); id != "" {
		for _, t := range v.Data.(*tokensData).Tokens {
			if t.ID == id && t.Revoked {
				v.Notice = "The API token " + t.Name + " (" + t.ID + ") is revoked."
			}
		}
	}
	s.render(w, r, http.StatusOK, "tokens", v)
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request, ss *session) {
	scopes := r.PostForm["scope"]
	tok, t, createErr := s.acc.CreateAPIToken(r.Context(), ss.p, r.PostFormValue("name"), scopes)
	v, err := s.tokensView(r, ss)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	if createErr != nil {
		status, msg := s.messageOf(createErr)
		v.Err = errMap("create", msg)
		v.Form["name"] = r.PostFormValue("name")
		for _, sc := range scopes {
			v.Form["scope:"+sc] = "on"
		}
		s.render(w, r, status, "tokens", v)
		return
	}
	v.Data.(*tokensData).New = &newToken{Token: tok, ID: t.ID, Name: t.Name, Scopes: t.Scopes}
	s.render(w, r, http.StatusOK, "tokens", v)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, ss *session) {
	id := r.PathValue("id")
	if err := s.acc.RevokeAPIToken(r.Context(), ss.p, id); err != nil {
		v, verr := s.tokensView(r, ss)
		if verr != nil {
			s.fail(w, r, ss, verr)
			return
		}
		status, msg := s.messageOf(err)
		v.Err = errMap("tokens", msg)
		s.render(w, r, status, "tokens", v)
		return
	}
	redirect(w, r, Prefix+"tokens?revoked="+url.QueryEscape(id))
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
