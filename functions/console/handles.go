package console

import (
	"context"
	"net/http"
	"net/url"
	"sort"
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
	// already proven, recording how (provenance).
	SessionFor(ctx context.Context, email, provenance string) (token string, err error)
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

// registrarSession opens the registrar session of the signed-in address.
func (s *Server) registrarSession(ctx context.Context, ss *session) (string, error) {
	return s.reg.SessionFor(ctx, ss.p.Account.Email, Provenance)
}

// handlesView lists the person's handles. Without a registrar the page
// says so and offers nothing.
func (s *Server) handlesView(ctx context.Context, ss *session, token string) (*view, error) {
	d := &handlesData{Configured: s.reg != nil, Email: ss.p.Account.Email}
	v := &view{Title: "Handles", Nav: "handles", sess: ss, Data: d, Form: map[string]string{}}
	if s.reg == nil {
		return v, nil
	}
	var err error
	if token == "" {
		if token, err = s.registrarSession(ctx, ss); err != nil {
			return nil, err
		}
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
	v, err := s.handlesView(r.Context(), ss, "")
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
	token, err := s.registrarSession(ctx, ss)
	var callErr error
	pending := &handlesData{}
	if err == nil {
		callErr = call(ctx, token, pending)
	} else {
		callErr = err
	}
	v, err := s.handlesView(ctx, ss, token)
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
