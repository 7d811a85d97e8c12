package console

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
)

// Registrar is what the Handles page needs from the handle registrar (spec
// §4.1), called in process like the account service. The console proves
// the person's address with its own sign-in, so it asks the registrar for a
// registrar session on that address rather than mailing a second code.
type Registrar interface {
	// SessionFor opens a registrar session for an address the caller has
	// already proven, recording how (provenance), and says until when it
	// lasts.
	SessionFor(ctx context.Context, email, provenance string) (token string, expiresAt time.Time, err error)
	// Claim claims <name>.<email> for the session's address. A first claim
	// needs an operator name; without one it fails with OPERATOR_REQUIRED.
	Claim(ctx context.Context, token, name, operatorName string) (handle string, err error)
	// StartPairing issues the single-use XXX-XXX code that binds an agent
	// to one of the session's handles (ten minutes).
	StartPairing(ctx context.Context, token, handle string) (code string, expiresAt time.Time, err error)
	// Mine lists the session address's handles.
	Mine(ctx context.Context, token string) ([]account.Handle, error)
}

// Provenance is how the console tells the registrar the address was
// proven: by a code mailed to it, as the registrar's own sign-in does.
const Provenance = "email"

// OperatorRequired is the registrar's refusal of a first claim without an
// operator name.
const OperatorRequired errs.Code = "OPERATOR_REQUIRED"

type handlesData struct {
	Configured bool
	Email      string
	Handles    []account.Handle
	Pairing    *pairing
	NeedOp     bool // the last claim was refused for want of an operator name
}

type pairing struct {
	Handle, Code string
	ExpiresAt    time.Time
}

// Command is what the person runs on the agent's machine.
func (p pairing) Command() string { return "mesh-adapter pair " + p.Handle + " " + p.Code }

// registrarCookie holds the registrar session the console opened for this
// console session: one per console session, not one per request (each
// lasts eight hours in the registrar's store). Its value is the registrar
// token, a dot, and a binding to the console session token (below).
const registrarCookie = "mesh_console_registrar"

// registrarSlack is how long before the registrar session's end the
// console stops using it, so that a form does not meet it expiring.
const registrarSlack = 10 * time.Minute

// registrarBinding ties a registrar token to the console session token the
// cookie was set for: only the browser holding that HttpOnly session
// cookie could have been given it, so a registrar cookie planted by
// someone else (another subdomain, an earlier sign-in on the same browser)
// is never used for this session.
func registrarBinding(sessionToken, regToken string) string {
	sum := sha256.Sum256([]byte("mesh-console-registrar-v1\x00" + sessionToken + "\x00" + regToken))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// registrarToken is the registrar session of this console session: the
// one its cookie holds, or (with fresh set, no valid cookie, or a cookie
// bound to another session) a new one, then kept in the cookie. cached says
// the token came from the cookie.
func (s *Server) registrarToken(ctx context.Context, w http.ResponseWriter, r *http.Request, ss *session, fresh bool) (token string, cached bool, err error) {
	if !fresh {
		if c, err := r.Cookie(registrarCookie); err == nil {
			i := strings.LastIndexByte(c.Value, '.') // the binding has no dot
			if tok, bind := c.Value[:max(i, 0)], c.Value[i+1:]; i > 0 && equalToken(bind, registrarBinding(ss.token, tok)) {
				return tok, true, nil
			}
		}
	}
	tok, exp, err := s.reg.SessionFor(ctx, ss.p.Account.Email, Provenance)
	if err != nil {
		return "", false, err
	}
	if until := exp.Add(-registrarSlack); until.After(time.Now()) {
		s.setCookie(w, registrarCookie, tok+"."+registrarBinding(ss.token, tok), until)
	}
	return tok, false, nil
}

// withRegistrar runs fn with this console session's registrar session. A
// kept session the registrar no longer knows (expired, swept) is replaced
// once, and fn run again: fn must have done nothing when it was refused
// as unauthorized, which is what the registrar does.
func (s *Server) withRegistrar(ctx context.Context, w http.ResponseWriter, r *http.Request, ss *session, fn func(token string) error) (string, error) {
	token, cached, err := s.registrarToken(ctx, w, r, ss, false)
	if err != nil {
		return "", err
	}
	err = fn(token)
	if cached && errs.CodeOf(err) == errs.Unauthorized {
		if token, _, err = s.registrarToken(ctx, w, r, ss, true); err != nil {
			return "", err
		}
		err = fn(token)
	}
	return token, err
}

// handlesView lists the person's handles with the registrar session token.
// Without a registrar the page says so and offers nothing.
func (s *Server) handlesView(ctx context.Context, ss *session, token string) (*view, error) {
	d := &handlesData{Configured: s.reg != nil, Email: ss.p.Account.Email}
	v := &view{Title: "Handles", Nav: "handles", sess: ss, Data: d, Form: map[string]string{}}
	if s.reg == nil {
		return v, nil
	}
	hs, err := s.reg.Mine(ctx, token)
	if err != nil {
		return nil, err
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].ClaimedAt > hs[j].ClaimedAt })
	d.Handles = hs
	return v, nil
}

func (s *Server) handlesPage(w http.ResponseWriter, r *http.Request, ss *session) {
	var v *view
	var err error
	if s.reg == nil {
		v, err = s.handlesView(r.Context(), ss, "")
	} else {
		_, err = s.withRegistrar(r.Context(), w, r, ss, func(token string) error {
			v, err = s.handlesView(r.Context(), ss, token)
			return err
		})
	}
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	if h := r.URL.Query().Get("claimed"); h != "" {
		for _, mine := range v.Data.(*handlesData).Handles {
			if account.HandleID(mine.Handle) == account.HandleID(h) {
				v.Notice = "You claimed " + mine.Handle + ". Start pairing to bind an agent to it."
			}
		}
	}
	s.render(w, r, http.StatusOK, "handles", v)
}

// handleAction runs one registrar call for a form of the Handles page and
// renders the page with its outcome next to that form.
func (s *Server) handleAction(w http.ResponseWriter, r *http.Request, ss *session, form string,
	call func(ctx context.Context, token string, d *handlesData) error, done func(v *view)) {
	if s.reg == nil {
		v, _ := s.handlesView(r.Context(), ss, "")
		v.Err = errMap(form, "The handle registrar is not configured on this instance.")
		s.render(w, r, http.StatusNotImplemented, "handles", v)
		return
	}
	ctx := r.Context()
	pending := &handlesData{}
	token, callErr := s.withRegistrar(ctx, w, r, ss, func(token string) error { return call(ctx, token, pending) })
	var v *view
	var err error
	if token == "" {
		err = callErr // no registrar session at all
	} else {
		v, err = s.handlesView(ctx, ss, token)
	}
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	d := v.Data.(*handlesData)
	if callErr != nil {
		status, msg := s.messageOf(callErr)
		v.Err = errMap(form, msg)
		if d.NeedOp = errs.CodeOf(callErr) == OperatorRequired; d.NeedOp && status >= 500 {
			status = http.StatusBadRequest // a code missing from this build's error table
		}
		v.Form["name"], v.Form["operator_name"] = r.PostFormValue("name"), r.PostFormValue("operator_name")
		s.render(w, r, status, "handles", v)
		return
	}
	d.Pairing = pending.Pairing
	done(v)
}

func (s *Server) claimHandle(w http.ResponseWriter, r *http.Request, ss *session) {
	var handle string
	s.handleAction(w, r, ss, "claim", func(ctx context.Context, token string, _ *handlesData) error {
		var err error
		handle, err = s.reg.Claim(ctx, token, r.PostFormValue("name"), r.PostFormValue("operator_name"))
		return err
	}, func(*view) { redirect(w, r, Prefix+"handles?claimed="+url.QueryEscape(handle)) })
}

func (s *Server) startPairing(w http.ResponseWriter, r *http.Request, ss *session) {
	handle := r.PostFormValue("handle")
	s.handleAction(w, r, ss, "pair", func(ctx context.Context, token string, d *handlesData) error {
		code, exp, err := s.reg.StartPairing(ctx, token, handle)
		if err == nil {
			d.Pairing = &pairing{Handle: handle, Code: code, ExpiresAt: exp}
		}
		return err
	}, func(v *view) { s.render(w, r, http.StatusOK, "handles", v) })
}
