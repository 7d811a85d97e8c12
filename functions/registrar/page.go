package registrar

import (
	"bytes"
	"html/template"
	"net/http"
	"net/url"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/registrar"
)

// page is the human-readable card (spec §2.2: {registrar_url}/a/<handle>).
// html/template escapes everything that comes from a claim.
var page = template.Must(template.New("card").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 40rem; margin: 3rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.4rem; word-break: break-all; }
dt { font-weight: 600; margin-top: .6rem; }
dd { margin: 0; word-break: break-all; }
code { font-size: .9em; }
.note { color: #666; font-size: .9rem; margin-top: 2rem; }
</style>
</head>
<body>
{{if .Card}}{{with .Card}}
<h1>{{.Handle}}</h1>
<dl>
<dt>Operator</dt><dd>{{.Operator.Name}}</dd>
<dt>Status</dt><dd>{{if .Reserved}}Reserved: claimed, no agent bound yet{{else}}Bound to an agent{{end}}</dd>
{{range .Endpoints}}<dt>Agent ({{.Protocol}})</dt><dd><code>{{.AgentID}}</code></dd>
{{end}}{{if .Binding}}<dt>Bound by</dt><dd>{{.Binding}}</dd>
{{end}}<dt>Claimed</dt><dd>{{.ClaimedAt}} (email proven via {{.ClaimedVia}})</dd>
<dt>Registrar</dt><dd>{{.Registrar}}</dd>
</dl>{{end}}
<p class="note">The signed card is at <a href="{{.JSON}}">{{.JSON}}</a>. The operator name is a label the holder of the address chose, not a verified identity.</p>
{{else}}
<h1>{{.Title}}</h1>
<p>{{.Message}}</p>
{{end}}
</body>
</html>
`))

type pageData struct {
	Title   string
	Card    *registrar.Card
	JSON    string
	Message string
}

// cardPage renders GET /a/<handle> (or /a/<agent id>) as HTML, and its
// refusals as HTML pages too.
func (h *handlers) cardPage(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("handle")
	handle, agent := name, ""
	if keys.IsUserPublicKey(name) {
		handle, agent = "", name
	}
	hd, err := h.svc.Lookup(r.Context(), handle, agent)
	if err != nil {
		e := errs.As(err)
		if e.Code == errs.InternalError {
			h.d.Log.Error("card page", "err", err)
		}
		title := "No agent by that name"
		if e.Code != errs.NotFound {
			title = "This card cannot be shown"
		}
		if name == "" {
			e.Message = "Give a handle: /a/<name>.<email>"
		}
		renderPage(w, e.HTTPStatus(), pageData{Title: title, Message: e.Message})
		return nil
	}
	c := h.svc.CardOf(hd)
	renderPage(w, http.StatusOK, pageData{Title: c.Handle, Card: &c,
		JSON: h.svc.URL() + "/api/resolve?handle=" + url.QueryEscape(c.Handle)})
	return nil
}

func renderPage(w http.ResponseWriter, status int, d pageData) {
	var buf bytes.Buffer
	if err := page.Execute(&buf, d); err != nil {
		http.Error(w, "the card page could not be rendered", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	if status == http.StatusOK {
		hd.Set("Cache-Control", cardCache)
	} else {
		hd.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}
