package httpx

import (
	"log/slog"
	"net/http"
	"strings"
)

// Route is one HTTP route: the Cloud Function entry point that serves it in
// the cloud and the method and path it answers on every mux. A function
// group's route table is the single source for meshd's mux, the Cloud
// Function registrations and Terraform's function map.
type Route struct {
	EntryPoint string
	Method     string // "" answers every method (a site such as the console)
	Path       string // Go 1.22 pattern path, e.g. /v1/accounts/{id}/apps
	// HTML marks a route that serves pages to people (text/html) rather
	// than JSON.
	HTML bool
}

// Pattern is the ServeMux pattern "METHOD /path", or "/path" for a route
// that answers every method.
func (r Route) Pattern() string {
	if r.Method == "" {
		return r.Path
	}
	return r.Method + " " + r.Path
}

// SingleRoute serves h behind a mux that knows only this route, so path
// values ({id}) resolve the same way in a Cloud Function, which receives
// every request of its entry point, as on meshd's shared mux. Any other
// method or path gets the mux's 405/404, as JSON (JSONErrors).
func SingleRoute(rt Route, log *slog.Logger, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(rt.Pattern(), h)
	return JSONErrors(mux, log)
}

// FunctionName is the deployed Cloud Function's name for an entry point:
// lower-case with hyphens (BootstrapExchange → bootstrap-exchange).
func FunctionName(entryPoint string) string {
	var b strings.Builder
	for i, c := range entryPoint {
		if c >= 'A' && c <= 'Z' {
			if i > 0 {
				b.WriteByte('-')
			}
			c += 'a' - 'A'
		}
		b.WriteRune(c)
	}
	return b.String()
}
