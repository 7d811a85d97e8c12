// Package console is the web console for people (spec §1, {console_url}):
// sign in with a mailed code, register a passkey, mint single-use agent keys
// (am_) after a fresh passkey check, manage API tokens (amt_), claim
// handles and start pairing through the registrar, grant the mesh a
// Google Cloud project and deploy agents there (the Cloud page), download
// the signed audit export and read the public anchors (the Records page),
// and close the account (the Close account page).
//
// It is one function group with one route, /console/ for every method: the
// pages share their templates, static files, session cookie and CSRF
// handling, so they are served by one Cloud Function ("Console") rather
// than one per page, and meshd mounts the same handler on its mux. Like
// every group under functions/, it holds no business logic: each handler
// reads a form, calls one method of shared/account (or of the registrar),
// and renders a server-side html/template page. The only script is a small
// hand-written file for the WebAuthn calls (navigator.credentials.create and
// .get), served from the binary. docs/console.md describes the pages, the
// cookie and the CSRF protection.
package console

import (
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/httpx"
)

// Prefix is the path the console is served under, on every host.
const Prefix = "/console/"

// Routes is the group's route table: the whole console is one route. It
// is public at the row: the console keeps its own cookie session and CSRF
// checks (docs/console.md) and calls the account service for each page.
var Routes = []api.Route{
	{EntryPoint: "Console", Path: Prefix, HTML: true, Auth: api.Public, Handler: handler},
}

func handler(d *api.Deps) httpx.HandlerFunc {
	if d.Accounts == nil {
		return api.NotConfigured("the account service (and with it the console)")
	}
	cfg := Config{Accounts: d.Accounts, Grants: d.Grants, Closure: d.Closure, ConsoleURL: d.Accounts.ConsoleURL(), Log: d.Log, TrustedProxyHops: d.TrustedProxyHops}
	// Without a registrar the Handles page says it is not configured. The
	// nil check is on the pointer: a nil *Service inside the interface
	// would not compare equal to nil.
	if d.Registrar != nil {
		cfg.Registrar = NewRegistrar(d.Registrar)
	}
	s := New(cfg)
	return func(w http.ResponseWriter, r *http.Request) error {
		s.ServeHTTP(w, r)
		return nil
	}
}
