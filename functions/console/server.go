package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/secret"
)

// Config is what the console needs.
type Config struct {
	// Accounts is the account service every page calls, in process.
	Accounts *account.Service
	// Registrar serves the Handles page; nil makes that page say the
	// registrar is not configured on this instance.
	Registrar Registrar
	// Grants serves the Cloud page; nil makes that page say cloud grants
	// are not configured on this instance.
	Grants *grant.Service
	// Closure serves the Close account page; nil makes that page say
	// closing is not configured on this instance.
	Closure *closure.Service
	// Client fetches the Records page's data from the control plane's own
	// routes on the console's host (GET /v1/anchors and the audit
	// export); nil is a client with a 30 s timeout.
	Client *http.Client
	// ConsoleURL is where people open the console, e.g.
	// http://localhost:8080/console/ or https://mesh.example.org/console/.
	// Its scheme decides whether cookies are Secure, and its origin is the
	// only one a form post may come from.
	ConsoleURL string
	Log        *slog.Logger
	// Commerce serves the offers, approval and agreements pages; nil
	// makes them say this console has no connection to the bus.
	Commerce Commerce
	// Engagements lists the account's engagements on the agreements
	// page; nil makes that section say none can be listed here.
	Engagements EngagementLister
	// TrustedProxyHops is how many proxies append to X-Forwarded-For in
	// front of the console (api.Deps.TrustedProxyHops): the sign-in form
	// counts against the sign-up limits of the client's address.
	TrustedProxyHops int
}

// Server serves the console under Prefix.
type Server struct {
	acc       *account.Service
	reg       Registrar
	grants    *grant.Service
	closure   *closure.Service
	client    *http.Client
	log       *slog.Logger
	origin    string // scheme://host of ConsoleURL ("" when unknown)
	canonical *url.URL
	secure    bool
	mux       *http.ServeMux
	// outbox is where the mail goes when it is not sent (meshd with no
	// mail server), for the sign-in code page; "" with a mail server.
	outbox string
	hops   int
	// commerce reads the commerce pages' data and engagements lists
	// engagements; nil: not on this instance.
	commerce    Commerce
	engagements EngagementLister
}

// Cookie names. The session cookie holds the account session token (ams_);
// the sign-in cookie holds a random value that the sign-in forms repeat, so
// that another site cannot post them (login CSRF).
const (
	sessionCookie = "mesh_console_session"
	signinCookie  = "mesh_console_signin"
	csrfField     = "csrf"
	csrfHeader    = "X-CSRF-Token"
	// maxForm caps a posted form or passkey response.
	maxForm = 64 << 10
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages are parsed once: each page template is the layout plus its own
// "content" block. They are constants of the program, never changed.
var pages = parsePages()

var funcs = template.FuncMap{
	"when": func(ms int64) string {
		if ms == 0 {
			return ""
		}
		return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04 UTC")
	},
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05 UTC") },
	// stamp shows an RFC 3339 time from a service's view, to the second.
	"stamp": func(s string) string {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return s
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
}

func parsePages() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		out[base] = template.Must(template.Must(layout.Clone()).ParseFS(templateFS, n))
	}
	return out
}

// New builds the console.
func New(cfg Config) *Server {
	s := &Server{acc: cfg.Accounts, reg: cfg.Registrar, grants: cfg.Grants, closure: cfg.Closure, client: cfg.Client, log: cfg.Log,
		commerce: cfg.Commerce, engagements: cfg.Engagements,
		mux: http.NewServeMux(), hops: cfg.TrustedProxyHops}
	if s.client == nil {
		s.client = &http.Client{Timeout: 30 * time.Second}
	}
	if s.acc != nil {
		s.outbox = s.acc.OutboxDir()
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "console")
	if u, err := url.Parse(cfg.ConsoleURL); err == nil && u.Host != "" {
		s.origin = u.Scheme + "://" + u.Host
		s.secure = u.Scheme == "https"
		s.canonical = u
	}
	p := strings.TrimSuffix(Prefix, "/")
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix(p+"/static/", http.FileServerFS(static))
	s.mux.Handle("GET "+p+"/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	}))
	s.mux.HandleFunc("GET "+p+"/{$}", s.signedIn(s.home))
	s.mux.HandleFunc("GET "+p+"/login", s.loginPage)
	s.mux.HandleFunc("POST "+p+"/login", s.sendCode)
	s.mux.HandleFunc("POST "+p+"/login/verify", s.verifyCode)
	s.mux.HandleFunc("POST "+p+"/logout", s.signedIn(s.signOut))
	s.mux.HandleFunc("GET "+p+"/passkeys", s.signedIn(s.passkeysPage))
	s.mux.HandleFunc("POST "+p+"/passkeys/{kind}/begin", s.signedInJSON(s.passkeyBegin))
	s.mux.HandleFunc("POST "+p+"/passkeys/{kind}/finish", s.signedInJSON(s.passkeyFinish))
	s.mux.HandleFunc("GET "+p+"/agent-keys", s.signedIn(s.agentKeysPage))
	s.mux.HandleFunc("POST "+p+"/agent-keys", s.signedIn(s.mintAgentKey))
	s.mux.HandleFunc("POST "+p+"/agent-keys/{id}/revoke", s.signedIn(s.revokeAgentKey))
	s.mux.HandleFunc("GET "+p+"/tokens", s.signedIn(s.tokensPage))
	s.mux.HandleFunc("POST "+p+"/tokens", s.signedIn(s.createToken))
	s.mux.HandleFunc("POST "+p+"/tokens/{id}/revoke", s.signedIn(s.revokeToken))
	s.mux.HandleFunc("GET "+p+"/handles", s.signedIn(s.handlesPage))
	s.mux.HandleFunc("POST "+p+"/handles/claim", s.signedIn(s.claimHandle))
	s.mux.HandleFunc("POST "+p+"/handles/pair", s.signedIn(s.startPairing))
	s.mux.HandleFunc("GET "+p+"/cloud", s.signedIn(s.cloudPage))
	s.mux.HandleFunc("POST "+p+"/cloud/grant", s.signedIn(s.addGrant))
	s.mux.HandleFunc("POST "+p+"/cloud/verify", s.signedIn(s.verifyGrant))
	s.mux.HandleFunc("POST "+p+"/cloud/forget", s.signedIn(s.forgetGrant))
	s.mux.HandleFunc("POST "+p+"/cloud/deploy", s.signedIn(s.deployAgent))
	s.mux.HandleFunc("GET "+p+"/records", s.signedIn(s.recordsPage))
	s.mux.HandleFunc("GET "+p+"/records/audit-export", s.signedIn(s.auditExport))
	s.mux.HandleFunc("GET "+p+"/offers/{agent}", s.offersPage)
	s.mux.HandleFunc("GET "+p+"/agreements", s.signedIn(s.agreementsPage))
	s.mux.HandleFunc("GET "+p+commerce.ApprovalPath, s.approvePage)
	s.mux.HandleFunc("GET "+p+"/close", s.signedIn(s.closePage))
	s.mux.HandleFunc("POST "+p+"/close", s.signedIn(s.closeAccount))
	s.mux.HandleFunc(p+"/", s.notFound)
	return s
}

// ServeHTTP answers one console request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	if to := s.canonicalRedirect(r); to != "" {
		http.Redirect(w, r, to, http.StatusFound)
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		s.mux.ServeHTTP(w, r)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if !s.sameOrigin(r) {
		s.render(w, r, http.StatusForbidden, "error", &view{Title: "Request refused",
			Err: errMap("page", "This form was sent from another site, so it was refused. Open the console and try again.")})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// canonicalRedirect sends a one-machine visitor who opened the console by
// its loopback address (127.0.0.1) to the localhost URL: passkeys are bound
// to the name "localhost", and a form from another origin is refused. Only
// that case is redirected, so a proxy that rewrites Host in front of a cloud
// console can never cause a loop.
func (s *Server) canonicalRedirect(r *http.Request) string {
	if s.canonical == nil || s.canonical.Hostname() != "localhost" || r.Host == s.canonical.Host ||
		(r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return ""
	}
	host, port, err := net.SplitHostPort(r.Host)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() || port != s.canonical.Port() {
		return ""
	}
	u := *r.URL
	u.Scheme, u.Host = s.canonical.Scheme, s.canonical.Host
	return u.String()
}

// sameOrigin is the Origin check every state-changing request passes
// before its CSRF token is even looked at: a browser names the page's
// origin on every POST, and only the console's own is accepted. A request
// with neither Origin nor Referer (not a browser) is left to the token.
func (s *Server) sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return false
	}
	from := r.Header.Get("Origin")
	if from == "" {
		ref := r.Header.Get("Referer")
		if ref == "" {
			return true
		}
		u, err := url.Parse(ref)
		if err != nil {
			return false
		}
		from = u.Scheme + "://" + u.Host
	}
	if s.origin == "" {
		// No console URL configured (tests that build the console
		// directly): the request's own host is the console's.
		return from == "http://"+r.Host || from == "https://"+r.Host
	}
	return from == s.origin
}

// csrfFor is the CSRF token of a signed-in session: derived from the session
// token, which only the browser holding the HttpOnly cookie has, so pages
// can repeat it in forms without the server storing anything.
func csrfFor(sessionToken string) string {
	sum := sha256.Sum256([]byte("mesh-console-csrf-v1\x00" + sessionToken))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func equalToken(a, b string) bool {
	return a != "" && len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// session is the signed-in person of one request.
type session struct {
	token string
	p     *account.Principal
	csrf  string
}

// current reads the session cookie; nil when signed out (or the session
// ended), with err only when the store cannot answer.
func (s *Server) current(r *http.Request) (*session, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	p, err := s.acc.SessionAccount(r.Context(), c.Value)
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthorized {
			return nil, nil
		}
		return nil, err
	}
	return &session{token: c.Value, p: p, csrf: csrfFor(c.Value)}, nil
}

type pageFunc func(w http.ResponseWriter, r *http.Request, ss *session)

// signedIn runs fn for a signed-in person whose form (on a POST) carries
// the session's CSRF token; anyone else is sent to sign in.
func (s *Server) signedIn(fn pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss, err := s.current(r)
		if err != nil {
			s.fail(w, r, nil, err)
			return
		}
		if ss == nil {
			if _, err := r.Cookie(sessionCookie); err == nil {
				s.clearCookie(w, sessionCookie) // it names a session that ended
			}
			to := Prefix + "login"
			if r.Method == http.MethodGet && r.URL.Path != Prefix {
				to += "?next=" + url.QueryEscape(r.URL.Path)
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			if !equalToken(r.PostFormValue(csrfField), ss.csrf) {
				s.render(w, r, http.StatusForbidden, "error", &view{Title: "Request refused", sess: ss,
					Err: errMap("page", "This form is out of date or was not sent by the console (its security token is missing or wrong). Reload the page and try again.")})
				return
			}
		}
		fn(w, r, ss)
	}
}

// signedInJSON is signedIn for the two JSON calls the passkey script
// makes: the CSRF token travels in the X-CSRF-Token header.
func (s *Server) signedInJSON(fn func(w http.ResponseWriter, r *http.Request, ss *session) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ss, err := s.current(r)
		if err == nil && ss == nil {
			err = errs.New(errs.Unauthorized, "you are signed out; sign in again")
		}
		if err == nil && !equalToken(r.Header.Get(csrfHeader), ss.csrf) {
			err = errs.New(errs.Forbidden, "the request's security token is missing or wrong; reload the page and try again")
		}
		if err == nil {
			err = fn(w, r, ss)
		}
		if err != nil {
			httpx.Fail(w, r, s.log, err)
		}
	}
}

func (s *Server) setCookie(w http.ResponseWriter, name, value string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: Prefix, Expires: expires,
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteLaxMode})
}

func (s *Server) clearCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteLaxMode})
}

// signinToken returns the browser's sign-in CSRF value, setting a new one
// when it has none.
func (s *Server) signinToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(signinCookie); err == nil && len(c.Value) >= 20 {
		return c.Value
	}
	v := secret.Token("")
	s.setCookie(w, signinCookie, v, time.Now().Add(24*time.Hour))
	return v
}

// view is what every page template is given.
type view struct {
	Title   string
	Nav     string
	Notice  string            // a status line (role="status")
	Err     map[string]string // errors by form, shown next to that form (role="alert")
	Form    map[string]string // values to put back into a form after an error
	Account *account.Account
	CSRF    string
	Data    any
	// Outbox is the directory mail is written to instead of sent, when it
	// is ("" with a mail server).
	Outbox string
	sess   *session
}

func errMap(form, msg string) map[string]string { return map[string]string{form: msg} }

// messageOf is the text a person is shown for err: the service's own
// sentence, which is written for people, except for internal errors.
func (s *Server) messageOf(err error) (int, string) {
	e := errs.As(err)
	if e.Code == errs.InternalError {
		s.log.Error("internal error", "err", err)
		return http.StatusInternalServerError, "Something went wrong on our side. Try again in a moment."
	}
	msg := e.Message
	if msg != "" {
		msg = strings.ToUpper(msg[:1]) + msg[1:]
		if !strings.HasSuffix(msg, ".") {
			msg += "."
		}
	}
	return e.HTTPStatus(), msg
}

// fail renders a page-level error (the store is down, an internal error).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, ss *session, err error) {
	status, msg := s.messageOf(err)
	s.render(w, r, status, "error", &view{Title: "Something went wrong", sess: ss, Err: errMap("page", msg)})
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	ss, _ := s.current(r)
	s.render(w, r, http.StatusNotFound, "error", &view{Title: "Page not found", sess: ss,
		Err: errMap("page", "There is no console page at "+r.URL.Path+".")})
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, v *view) {
	if v.sess != nil {
		v.Account, v.CSRF = &v.sess.p.Account, v.sess.csrf
	}
	v.Outbox = s.outbox
	t := pages[name]
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, "layout.html", v); err != nil {
		s.log.Error("render", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(buf.String()))
	}
}

// redirect answers a successful form with 303 to a page (post/redirect/get).
func redirect(w http.ResponseWriter, r *http.Request, to string) {
	http.Redirect(w, r, to, http.StatusSeeOther)
}
