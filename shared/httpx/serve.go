package httpx

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Fail renders err as the JSON error body (errs.WriteHTTP) and logs it once,
// by status class, naming the route (method and pattern): a 5xx at error
// with its cause (a store outage says what failed), a 4xx at debug (a
// refusal is the caller's business, and a flood of them must not fill the
// log). A nil log logs nothing.
func Fail(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	e := errs.As(err)
	if log != nil {
		status := e.HTTPStatus()
		level, msg := slog.LevelDebug, "request refused"
		if status >= 500 {
			level, msg = slog.LevelError, "request failed"
		}
		if log.Enabled(r.Context(), level) {
			attrs := []slog.Attr{slog.String("route", RouteOf(r)), slog.Int("status", status), slog.String("code", string(e.Code))}
			if status >= 500 {
				attrs = append(attrs, slog.Any("err", err)) // the cause, never shown to the caller
			} else {
				attrs = append(attrs, slog.String("reason", e.Message))
			}
			log.LogAttrs(r.Context(), level, msg, attrs...)
		}
	}
	errs.WriteHTTP(w, nil, err)
}

// RouteOf names the route r was matched to, as "METHOD /pattern" ("GET
// /v1/accounts/{id}/apps"), or "METHOD (no route)" when the mux matched
// none. The pattern, not the path, so a log line never carries ids.
func RouteOf(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.Method + " (no route)"
	}
	if i := strings.IndexByte(p, ' '); i >= 0 {
		p = strings.TrimSpace(p[i+1:])
	}
	return r.Method + " " + p
}

// JSONErrors serves mux, answering its own 404 (no route) and 405 (the
// path exists for another method) with the JSON error body every route
// uses, instead of the mux's plain text: a client reads one error shape
// from this server, whatever went wrong. The mux's redirects (a path with
// "." or ".." segments is redirected to its clean form) pass unchanged.
func JSONErrors(mux *http.ServeMux, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// The mux's own answer: run it into a recorder to learn which.
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			Fail(w, r, log, errs.Newf(errs.NotFound, "there is no route %s %.100s on this server: check the method and the path", r.Method, r.URL.Path))
		case http.StatusMethodNotAllowed:
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			Fail(w, r, log, errs.Newf(errs.InvalidRequest, "%s is not allowed on %.100s: use %s", r.Method, r.URL.Path, allow).
				WithStatus(http.StatusMethodNotAllowed).WithDetail("allow", strings.Split(allow, ", ")))
		default:
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.status)
			_, _ = w.Write(rec.body.Bytes())
		}
	})
}

// recorder keeps what the mux's own handler answers.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}

// DefaultBodyTimeout is how long a request may take to deliver its body,
// from the moment its handler starts. A control-plane body is at most
// MaxBody (64 KiB): a client on any working link sends it in well under a
// second, and one that trickles it holds a connection and a handler.
const DefaultBodyTimeout = 10 * time.Second

// BodyDeadline gives the body of every request to h a read deadline d from
// now (0 means DefaultBodyTimeout): a body still arriving then fails to
// read, and Decode answers 408. The deadline is set on the connection
// through http.ResponseController, which works the same under meshd's
// server and a Cloud Function's (both are net/http servers); a writer that
// cannot set deadlines (a test recorder) is served without one.
//
// The deadline covers the body only. It is cleared as soon as the body has
// been read to its end: net/http then watches the idle connection for the
// client going away, and a deadline left armed would cancel the request's
// context while the handler is still working. That is also why the
// server's own ReadTimeout is not used for this.
func BodyDeadline(d time.Duration, h http.Handler) http.Handler {
	if d <= 0 {
		d = DefaultBodyTimeout
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
		}
		h.ServeHTTP(w, r)
	})
}

// deadlineBody clears the connection's read deadline once the body has
// been read to its end (or failed).
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done {
		b.done = true
		if errors.Is(err, io.EOF) {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}
