// Package console is the web console for people (spec §1, {console_url}):
// sign in with a mailed code, register a passkey, mint single-use agent keys
// (am_) after a fresh passkey check, manage API tokens (amt_), claim
// handles and start pairing through the registrar, grant the mesh a
// Google Cloud project and deploy agents there (the Cloud page), download
// the signed audit export and read the public anchors (the Records page),
// close the account (the Close account page), and read a seller's offers,
// the approval page of a paid SKU and the account's agreements and
// engagements (commerce.go).
//
// It is one function group whose pages are one route, /console/ for every
// method: the pages share their templates, static files, session cookie
// and CSRF handling, so they are served by one Cloud Function ("Console")
// rather than one per page, and meshd mounts the same handler on its mux.
// The group's second row only forwards the approval address a refusal
// names (commerce.ApprovalPath, outside /console/) to its page. Like
// every group under functions/, it holds no business logic: each handler
// reads a form, calls one method of shared/account (or of the registrar),
// and renders a server-side html/template page. The only script is a small
// hand-written file for the WebAuthn calls (navigator.credentials.create and
// .get), served from the binary. docs/console.md describes the pages, the
// cookie and the CSRF protection.
package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/httpx"
)

// Prefix is the path the console is served under, on every host.
const Prefix = "/console/"

// Routes is the group's route table: the whole console is one route. It
// is public at the row: the console keeps its own cookie session and CSRF
// checks (docs/console.md) and calls the account service for each page.
var Routes = []api.Route{
	{EntryPoint: "Console", Path: Prefix, HTML: true, Auth: api.Public, Handler: handler},
	// The approval address an AGREEMENT_REQUIRED refusal names is
	// commerce.ApprovalURL's: the console's origin and ApprovalPath, not
	// under Prefix. It sends the person on to the console's page.
	{EntryPoint: "ConsoleApproval", Method: http.MethodGet, Path: commerce.ApprovalPath, HTML: true, Auth: api.Public,
		Standalone: true, Handler: func(*api.Deps) httpx.HandlerFunc { return approvalRedirect }},
}

// approvalRedirect answers commerce.ApprovalPath with the console's
// approval page, keeping only the members that page reads.
func approvalRedirect(w http.ResponseWriter, r *http.Request) error {
	q, keep := r.URL.Query(), url.Values{}
	for _, k := range []string{"sku", "seller"} {
		if v := q.Get(k); v != "" {
			keep.Set(k, v)
		}
	}
	to := Prefix + strings.TrimPrefix(commerce.ApprovalPath, "/")
	if len(keep) > 0 {
		to += "?" + keep.Encode()
	}
	http.Redirect(w, r, to, http.StatusFound)
	return nil
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
	// The commerce pages read the bus the way the account views do, with
	// the control plane's services key; without a bus they say so.
	if d.Bus != nil {
		if js, err := jetstream.New(d.Bus.NC); err == nil {
			cfg.Commerce = &BusCommerce{Bus: d.Bus, JS: js, Credentials: d.Credentials, Registrar: d.Registrar}
		} else {
			d.Log.Warn("console: no commerce pages", "err", err)
		}
	}
	// The engagements section lists from the control plane's own store.
	if d.Engagements != nil {
		cfg.Engagements = EngagementStore{Service: d.Engagements}
	}
	s := New(cfg)
	return func(w http.ResponseWriter, r *http.Request) error {
		s.ServeHTTP(w, r)
		return nil
	}
}

// EngagementStore is the EngagementLister of a deployment: the control
// plane's engagement service (shared/engagement), one row per offering the
// engagement's record is reachable under, so each row links to its public
// record.
type EngagementStore struct{ Service *engagement.Service }

// ListForAgents implements EngagementLister.
func (e EngagementStore) ListForAgents(ctx context.Context, agents []string) ([]EngagementSummary, error) {
	list, err := e.Service.ListForAgents(ctx, agents)
	if err != nil {
		return nil, err
	}
	var out []EngagementSummary
	for _, s := range list {
		state := strings.ReplaceAll(s.State, "_", " ")
		if s.InNotice {
			state += " (notice of termination given)"
		}
		for _, o := range s.Offerings {
			out = append(out, EngagementSummary{SowID: s.SowID, Version: int(s.Version), Client: s.Client, Seller: s.Seller,
				Offering: o, State: state, StartsAt: s.StartsAt, EndsAt: s.EndsAt})
		}
	}
	return out, nil
}
