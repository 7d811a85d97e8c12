// Package api is what every function group shares: the dependencies a
// route handler is given, and the two ways a group's routes are served — all
// on one mux (meshd, tests) or each as its own Cloud Function entry point
// whose dependencies are built on its first request.
package api

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/registrar"
)

// Deps are the services behind the routes. A nil service makes its routes
// answer 501 rather than crash.
type Deps struct {
	Log         *slog.Logger
	Accounts    *account.Service
	Credentials *credential.Service
	Guests      *guest.Service
	Registrar   *registrar.Service
	// Views answers the account routes that ask the bus (live status,
	// activity, subscriptions); nil without a bus connection.
	Views *accountview.Service
	// RateLimit is the per-IP limit every route sits behind.
	RateLimit *httpx.Limiter
	// TrustedProxyHops is how many proxies append to X-Forwarded-For in
	// front of this server (0 on one machine).
	TrustedProxyHops int
	// BodyTimeout is how long a request may take to deliver its body
	// (0: httpx.DefaultBodyTimeout, 10 s).
	BodyTimeout time.Duration
	// Capabilities is what GET /v1/capabilities reports.
	Capabilities map[string]any
}

// Group is one function group: its route table and the handler of each
// route given the dependencies.
type Group struct {
	Routes  []httpx.Route
	Handler func(d *Deps, rt httpx.Route) httpx.HandlerFunc
}

// Mount registers every route of g on mux, behind the per-IP limit and the
// body deadline.
func (g Group) Mount(mux *http.ServeMux, d *Deps) {
	for _, rt := range g.Routes {
		mux.Handle(rt.Pattern(), d.wrap(g.Handler(d, rt)))
	}
}

func (d *Deps) wrap(h httpx.HandlerFunc) http.Handler {
	var out http.Handler = httpx.Handle(d.Log, h)
	if d.RateLimit != nil {
		out = httpx.PerIP(d.RateLimit, d.TrustedProxyHops, d.Log, out)
	}
	return httpx.BodyDeadline(d.BodyTimeout, out)
}

// RegisterFunctions registers each route of g as its own Cloud Function
// entry point. The dependencies are built once per instance, on the first
// request (a function's lazy init is the one place configuration is read
// from the environment); if that fails, the route answers 503 and the next
// request tries again.
func (g Group) RegisterFunctions(build func() (*Deps, error)) {
	lazy := &lazyDeps{build: build}
	for _, rt := range g.Routes {
		functions.HTTP(rt.EntryPoint, func(w http.ResponseWriter, r *http.Request) {
			d, err := lazy.get()
			if err != nil {
				errs.WriteHTTP(w, slog.Default(), errs.Wrap(errs.Unavailable, "this function is not ready; retry shortly", err))
				return
			}
			httpx.SingleRoute(rt, d.Log, d.wrap(g.Handler(d, rt))).ServeHTTP(w, r)
		})
	}
}

type lazyDeps struct {
	mu    sync.Mutex
	build func() (*Deps, error)
	d     *Deps
}

func (l *lazyDeps) get() (*Deps, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.d != nil {
		return l.d, nil
	}
	d, err := l.build()
	if err != nil {
		return nil, err
	}
	l.d = d
	return d, nil
}

// NotConfigured is the answer of a route whose service this instance does
// not run.
func NotConfigured(what string) httpx.HandlerFunc {
	return func(http.ResponseWriter, *http.Request) error {
		return errs.Newf(errs.NotImplemented, "%s is not configured on this instance", what)
	}
}
