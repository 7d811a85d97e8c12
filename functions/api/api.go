// Package api is what every function group shares: the dependencies a
// route handler is given, the route row (route.go), and the two ways the
// route table is served — all on one mux (meshd, tests) or each row as its
// own Cloud Function whose dependencies are built on its first request
// (deploy.go registers them; this package does not link the Functions
// Framework, so meshd does not either).
package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/registrar"
)

// Deps are the services behind the routes, built by NewDeps. A nil service
// makes its routes answer 501 rather than crash.
type Deps struct {
	Log         *slog.Logger
	Accounts    *account.Service
	Credentials *credential.Service
	Guests      *guest.Service
	Registrar   *registrar.Service
	// Views answers the account routes that ask the bus (live status,
	// activity, subscriptions); nil without a bus connection.
	Views *accountview.Service
	// Grants is the cloud grants and the deployment manager; nil without a
	// deployer service account (the grant routes answer 501).
	Grants *grant.Service
	// Closure closes accounts (shared/closure).
	Closure *closure.Service
	// Bus is the control plane's signed way onto the bus (the services
	// key), for the jobs that ask a bus worker (RoomSweep); nil without a
	// bus connection.
	Bus *bus.Caller
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
	// Audit is the audit records' control-plane side: the anchor job and
	// listing, the export, the account rows (never nil; what it lacks
	// answers 501 or 503).
	Audit *audit.Service
	// Engagements is the engagement records (shared/engagement): the
	// routes of functions/engagements. Its writes need the registry (the
	// bus); without a bus connection they answer 501.
	Engagements *engagement.Service
}

// Mount registers every row of table on mux behind the per-IP limit and
// the body deadline, except the scheduled jobs, which are never served on
// the public host (meshd runs them with RunJobs).
func (d *Deps) Mount(mux *http.ServeMux, table []Route) {
	for _, rt := range table {
		if rt.Auth.Kind == AuthScheduled {
			continue
		}
		mux.Handle(rt.Pattern(), d.wrap(rt.Auth.guard(d, rt.Handler(d))))
	}
}

// Function is one row served the way its Cloud Function serves it: behind
// a mux that knows only this route, so path values resolve as on meshd's
// mux and any other method or path gets a JSON 404 or 405.
func (d *Deps) Function(rt Route) http.Handler {
	return httpx.SingleRoute(rt.httpRoute(), d.Log, d.wrap(rt.Auth.guard(d, rt.Handler(d))))
}

func (d *Deps) wrap(h httpx.HandlerFunc) http.Handler {
	var out http.Handler = httpx.Handle(d.Log, h)
	if d.RateLimit != nil {
		out = httpx.PerIP(d.RateLimit, d.TrustedProxyHops, d.Log, out)
	}
	return httpx.BodyDeadline(d.BodyTimeout, out)
}

// Lazy serves rows as Cloud Functions: the dependencies are built once per
// instance, on the first request (a function's lazy init is the one place
// configuration is read from the environment). One build runs at a time;
// if it fails, requests are answered 503 for RetryAfter, then the next one
// tries again, so a broken configuration does not queue every request
// behind its own slow, failing build.
type Lazy struct {
	build func() (*Deps, error)
	now   func() time.Time

	mu       sync.Mutex
	d        *Deps
	handlers map[string]http.Handler
	err      error
	failed   time.Time
}

// RetryAfter is how long a failed build is answered from memory before the
// next request builds again.
const RetryAfter = 5 * time.Second

// NewLazy returns a Lazy that builds its dependencies with build.
func NewLazy(build func() (*Deps, error)) *Lazy { return &Lazy{build: build, now: time.Now} }

// Handler serves rt, building the dependencies and the row's handler on
// first use.
func (l *Lazy) Handler(rt Route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h, err := l.handler(rt)
		if err != nil {
			errs.WriteHTTP(w, slog.Default(), errs.Wrap(errs.Unavailable, "this function is not ready; retry shortly", err))
			return
		}
		h.ServeHTTP(w, r)
	}
}

func (l *Lazy) handler(rt Route) (http.Handler, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.d == nil {
		if l.err != nil && l.now().Sub(l.failed) < RetryAfter {
			return nil, l.err
		}
		d, err := l.build()
		if err != nil {
			l.err, l.failed = err, l.now()
			return nil, err
		}
		l.d, l.handlers, l.err = d, map[string]http.Handler{}, nil
	}
	h, ok := l.handlers[rt.EntryPoint]
	if !ok {
		h = l.d.Function(rt)
		l.handlers[rt.EntryPoint] = h
	}
	return h, nil
}

// NotConfigured is the answer of a route whose service this instance does
// not run.
func NotConfigured(what string) httpx.HandlerFunc {
	return func(http.ResponseWriter, *http.Request) error {
		return errs.Newf(errs.NotImplemented, "%s is not configured on this instance", what)
	}
}

// Job is a scheduled job's work: it reports how many things it did.
type Job func(ctx context.Context) (int, error)

// JobRoute is the row of a scheduled job: a POST that Cloud Scheduler
// calls every interval in the cloud and meshd's ticker calls in process
// (RunJobs). Both run the same job. job returns nil when this instance
// lacks the service.
func JobRoute(entryPoint, path string, every time.Duration, job func(d *Deps) Job) Route {
	return Route{EntryPoint: entryPoint, Method: http.MethodPost, Path: path, Auth: Scheduled(every),
		Handler: func(d *Deps) httpx.HandlerFunc {
			run := job(d)
			if run == nil {
				return NotConfigured("the service of job " + entryPoint)
			}
			return func(w http.ResponseWriter, r *http.Request) error {
				n, err := run(r.Context())
				if err != nil {
					return errs.Wrap(errs.Unavailable, "the job failed; the next run retries", err)
				}
				if n > 0 {
					d.Log.Info("scheduled job", "job", entryPoint, "count", n)
				}
				httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "job": entryPoint, "count": n})
				return nil
			}
		},
		job: job}
}
