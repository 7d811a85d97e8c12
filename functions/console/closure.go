package console

import (
	"context"
	"net/http"

	"agentmesh.dev/mesh/shared/closure"
)

// The Close account page: what closing will and will not remove (the
// closure service's preview, from what this instance reaches), and the
// close form, which, like minting an agent key, runs a passkey assertion
// right before it is sent; the closure service refuses without one from
// the last five minutes.

type closeData struct {
	Configured bool
	Passkeys   int
	Preview    closure.Preview
}

func (s *Server) closeView(r *http.Request, ss *session) (*view, error) {
	v := &view{Title: "Close account", Nav: "close", sess: ss, Data: &closeData{}, Err: map[string]string{}}
	if s.closure == nil {
		return v, nil
	}
	n, err := s.acc.PasskeyCount(r.Context(), ss.p.AccountID)
	if err != nil {
		return nil, err
	}
	pv, err := s.closure.Preview(r.Context(), ss.p)
	if err != nil {
		return nil, err
	}
	v.Data = &closeData{Configured: true, Passkeys: n, Preview: pv}
	return v, nil
}

func (s *Server) closePage(w http.ResponseWriter, r *http.Request, ss *session) {
	v, err := s.closeView(r, ss)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	s.render(w, r, http.StatusOK, "close", v)
}

type closedData struct {
	Done        bool
	Email       string
	Outstanding []string
}

// closeAccount begins the closure and runs its steps for up to
// closure.RunBudget (the request may go; the work does not stop with it).
// The account, its session with it, is gone afterwards: the answer is a
// page without a session, with the outstanding list, or saying that the
// rest continues and the list will be mailed.
func (s *Server) closeAccount(w http.ResponseWriter, r *http.Request, ss *session) {
	refuse := func(err error) {
		v, verr := s.closeView(r, ss)
		if verr != nil {
			s.fail(w, r, ss, verr)
			return
		}
		status, msg := s.messageOf(err)
		v.Err["close"] = msg
		s.render(w, r, status, "close", v)
	}
	if s.closure == nil {
		s.notFound(w, r)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		v, err := s.closeView(r, ss)
		if err != nil {
			s.fail(w, r, ss, err)
			return
		}
		v.Err["close"] = "Tick the box to confirm that you want to close the account for good."
		s.render(w, r, http.StatusBadRequest, "close", v)
		return
	}
	if _, err := s.closure.Begin(r.Context(), ss.p); err != nil {
		refuse(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), closure.RunBudget)
	defer cancel()
	job, err := s.closure.Run(ctx, ss.p.AccountID)
	if err != nil {
		s.log.Warn("closure stopped; the scheduled row finishes it", "account", ss.p.AccountID, "err", err)
	}
	s.clearCookie(w, sessionCookie)
	s.clearCookie(w, registrarCookie)
	d := closedData{Done: job.Done(), Email: ss.p.Account.Email, Outstanding: job.Outstanding}
	title := "Your account is closed"
	if !d.Done {
		title = "Your account is being closed"
	}
	s.render(w, r, http.StatusOK, "closed", &view{Title: title, Data: d})
}
