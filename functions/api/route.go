package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
)

// Route is one row of the route table: the single source of meshd's mux,
// the Cloud Function registrations (deploy.go), Terraform's function map and
// the load balancer's URL map (cmd/meshgen). A row says who may call it
// (Auth) and builds its handler from the dependencies (Handler), so nothing
// dispatches on entry-point strings.
type Route struct {
	// EntryPoint is the Cloud Function's entry point (and, hyphenated, its
	// name: httpx.FunctionName).
	EntryPoint string
	Method     string // "" answers every method (a site such as the console)
	Path       string // Go 1.22 pattern path, e.g. /v1/accounts/{id}/apps
	// HTML marks a route that serves pages to people rather than JSON.
	HTML bool
	// Auth is what the caller must present before Handler runs.
	Auth Auth
	// Handler builds the route's handler, once per instance.
	Handler Handler
	// Standalone marks a row whose handler uses no dependency (health): its
	// function serves it without building them, so it answers even when
	// the keys, the store or the bus cannot be reached, and a request
	// for it never makes an instance load the keys.
	Standalone bool
	// job is a scheduled row's work, which meshd's ticker calls directly
	// (JobRoute sets it and builds Handler around it).
	job func(d *Deps) Job
}

// Handler builds a route's handler from the dependencies. A principal the
// row's Auth resolved is in the request's context (PrincipalOf).
type Handler func(d *Deps) httpx.HandlerFunc

// Pattern is the ServeMux pattern "METHOD /path", or "/path" for a route
// that answers every method.
func (rt Route) Pattern() string { return rt.httpRoute().Pattern() }

// FunctionName is the deployed Cloud Function's name.
func (rt Route) FunctionName() string { return httpx.FunctionName(rt.EntryPoint) }

func (rt Route) httpRoute() httpx.Route {
	return httpx.Route{EntryPoint: rt.EntryPoint, Method: rt.Method, Path: rt.Path, HTML: rt.HTML}
}

// AuthKind is the kind of caller a route admits.
type AuthKind int

// The kinds of Auth.
const (
	// AuthPublic admits anyone: what the request proves (a mailed code, a
	// signature, a single-use key) is the service's to check.
	AuthPublic AuthKind = iota
	// AuthSession admits a signed-in session (ams_) only: of the account
	// named by the path's {id} when the path has one, else of any account.
	AuthSession
	// AuthToken admits a session of the account in the path, or an API
	// token (amt_) of that account holding Scope.
	AuthToken
	// AuthScheduled is a scheduled job. It is never on the public host: in
	// the cloud only Cloud Scheduler's service account may invoke the
	// function (IAM), and meshd calls it from a ticker, in process.
	AuthScheduled
)

// Auth is what a route demands of its caller before its handler runs.
type Auth struct {
	Kind  AuthKind
	Scope string        // AuthToken: the amt_ scope that may stand in for a session
	Every time.Duration // AuthScheduled: how often the job runs
}

// The Auth values of the route table.
var (
	Public  = Auth{Kind: AuthPublic}
	Session = Auth{Kind: AuthSession}
)

// SessionOrToken admits a session of the account in the path, or its API
// token with scope.
func SessionOrToken(scope string) Auth { return Auth{Kind: AuthToken, Scope: scope} }

// Scheduled makes a route a job run every interval.
func Scheduled(every time.Duration) Auth { return Auth{Kind: AuthScheduled, Every: every} }

func (a Auth) String() string {
	switch a.Kind {
	case AuthPublic:
		return "public"
	case AuthSession:
		return "session"
	case AuthToken:
		return "session or API token with scope " + a.Scope
	case AuthScheduled:
		return "scheduled every " + a.Every.String()
	}
	return fmt.Sprintf("auth(%d)", int(a.Kind))
}

type principalKey struct{}

// PrincipalOf is the account principal the route's Auth resolved; nil on a
// public route.
func PrincipalOf(r *http.Request) *account.Principal {
	p, _ := r.Context().Value(principalKey{}).(*account.Principal)
	return p
}

// guard runs the row's Auth before h.
func (a Auth) guard(d *Deps, h httpx.HandlerFunc) httpx.HandlerFunc {
	switch a.Kind {
	case AuthSession, AuthToken:
		return func(w http.ResponseWriter, r *http.Request) error {
			if d.Accounts == nil {
				return errs.New(errs.NotImplemented, "the account service is not configured on this instance")
			}
			var p *account.Principal
			var err error
			bearer := httpx.BearerToken(r)
			switch id := r.PathValue("id"); {
			case id != "" && a.Kind == AuthToken:
				p, err = d.Accounts.Authenticate(r.Context(), id, bearer, a.Scope)
			case id != "":
				p, err = d.Accounts.Authenticate(r.Context(), id, bearer, "")
			default:
				p, err = d.Accounts.SessionAccount(r.Context(), bearer)
			}
			if err != nil {
				return err
			}
			return h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
		}
	}
	return h
}

// check refuses a malformed row: every row needs an entry point, a path
// and a handler, and only a job may be (and must be) scheduled.
func (rt Route) check() error {
	switch {
	case rt.EntryPoint == "" || !strings.HasPrefix(rt.Path, "/") || rt.Handler == nil:
		return fmt.Errorf("route %q %q: entry point, path and handler are required", rt.EntryPoint, rt.Path)
	case rt.Auth.Kind == AuthScheduled && (rt.Auth.Every <= 0 || rt.Method != http.MethodPost):
		return fmt.Errorf("route %s: a scheduled job is a POST with an interval", rt.EntryPoint)
	case rt.Auth.Kind == AuthToken && rt.Auth.Scope == "":
		return fmt.Errorf("route %s: a token route names its scope", rt.EntryPoint)
	case (rt.Auth.Kind == AuthToken) && !strings.Contains(rt.Path, "{id}"):
		return fmt.Errorf("route %s: a token route names its account in the path ({id})", rt.EntryPoint)
	}
	return nil
}

// Check refuses a table with a malformed row, or two rows with the same
// entry point or pattern.
func Check(table []Route) error {
	entry, pattern := map[string]bool{}, map[string]bool{}
	for _, rt := range table {
		if err := rt.check(); err != nil {
			return err
		}
		if entry[rt.EntryPoint] || pattern[rt.Pattern()] {
			return fmt.Errorf("route %s (%s) is declared twice", rt.EntryPoint, rt.Pattern())
		}
		entry[rt.EntryPoint], pattern[rt.Pattern()] = true, true
	}
	return nil
}

// RunJobs runs every scheduled row of table on its interval until ctx
// ends: meshd's stand-in for Cloud Scheduler. It calls the same job the
// row's function runs; a failure is logged and retried on the next tick.
// every, when positive, replaces every row's interval (tests).
func (d *Deps) RunJobs(ctx context.Context, table []Route, every time.Duration) {
	for _, rt := range table {
		if rt.Auth.Kind != AuthScheduled || rt.job == nil {
			continue
		}
		run := rt.job(d)
		if run == nil {
			continue
		}
		go func() {
			interval := rt.Auth.Every
			if every > 0 {
				interval = every
			}
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if n, err := run(ctx); err != nil {
						if ctx.Err() == nil {
							d.Log.Warn("scheduled job failed", "job", rt.EntryPoint, "err", err)
						}
					} else if n > 0 {
						d.Log.Info("scheduled job", "job", rt.EntryPoint, "count", n)
					}
				}
			}
		}()
	}
}
