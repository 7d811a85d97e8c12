package engagements

import (
	"bytes"
	"html/template"

	"agentmesh.dev/mesh/shared/engagement"
)

// page is the public engagement record for people: every clause with the
// grade it was signed with (a renderer shows the grade wherever it shows
// the clause, Agent SoW §3), the history with every denial's reason, the
// termination block and the reviews. html/template escapes everything,
// all of it from signed documents.
var page = template.Must(template.New("engagement").Funcs(template.FuncMap{
	"gradeClass": func(g string) string {
		switch {
		case len(g) >= 8 && g[:8] == "enforced":
			return "enforced"
		case g == "evidence":
			return "evidence"
		case g == "recorded":
			return "recorded"
		}
		return "ungraded"
	},
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Engagement {{.SowID}}</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 52rem; margin: 3rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.4rem; word-break: break-all; }
h2 { font-size: 1.1rem; margin-top: 2rem; }
dt { font-weight: 600; margin-top: .6rem; }
dd { margin: 0; word-break: break-all; }
code, pre { font-size: .85em; }
pre { background: #f6f6f6; padding: .5rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; border-top: 1px solid #ddd; padding: .4rem .5rem .4rem 0; }
.grade { font-weight: 600; white-space: nowrap; }
.enforced { color: #075; } .evidence { color: #046; } .recorded { color: #840; } .ungraded { color: #666; }
.note { color: #666; font-size: .9rem; }
</style>
</head>
<body>
<h1>Engagement {{.SowID}}</h1>
<dl>
<dt>State</dt><dd>{{.State}}{{if .InForce}} (in force){{else}} (not in force){{end}}</dd>
<dt>Version</dt><dd>{{.Version}}</dd>
<dt>Provider (seller)</dt><dd><code>{{.Seller}}</code>{{if .Owners.Provider}}, signed by owner <code>{{.Owners.Provider}}</code>{{end}}</dd>
<dt>Client</dt><dd><code>{{.Client}}</code>{{if .Owners.Client}}, signed by owner <code>{{.Owners.Client}}</code>{{end}}</dd>
<dt>Offerings in scope</dt><dd>{{range $i, $o := .Offerings}}{{if $i}}, {{end}}{{$o}}{{end}}</dd>
{{if .StartsAt}}<dt>Term</dt><dd>{{.StartsAt}} to {{.EndsAt}}</dd>{{end}}
{{if .FormedAt}}<dt>Formed</dt><dd>{{.FormedAt}}</dd>{{else}}<dt>Formation</dt><dd>the client countersigned{{if eq .State "formation_requested"}}; awaiting the provider's instance signature{{else if eq .State "formation_request_lapsed"}}; the request lapsed unanswered{{else}}, then withdrew the request{{end}}</dd>{{end}}
{{if .DocumentSHA256}}<dt>Document SHA-256</dt><dd><code>{{.DocumentSHA256}}</code></dd>{{end}}
</dl>
{{if .Language}}<p class="note">{{.Language}}</p>{{end}}
<p class="note">Grades: <span class="enforced">enforced</span>: a violation is refused mechanically; <span class="evidence">evidence</span>: a signed, exportable record exists; <span class="recorded">recorded</span>: a promise no runtime can verify.</p>

<h2>Clauses</h2>
<table>
<tr><th>Clause</th><th>Grade</th><th>As signed</th></tr>
{{range .Clauses}}<tr><td><code>{{.Path}}</code></td><td class="grade {{gradeClass .Grade}}">{{if .Grade}}{{.Grade}}{{else}}(no grade){{end}}</td><td><pre>{{.Value}}</pre></td></tr>
{{end}}</table>

{{with .Termination}}<h2>Termination</h2>
<dl>
<dt>Kind</dt><dd>{{if .ForCause}}for cause: ended at once{{else}}for convenience: {{if .InNotice}}notice running, in force until {{.EffectiveAt}}{{else}}notice expired{{end}}{{end}}</dd>
{{if .Reason}}<dt>Reason</dt><dd>{{.Reason}}</dd>{{end}}
<dt>By</dt><dd>the {{.Role}} seat's owner <code>{{.By}}</code>, signed {{.SignedAt}}</dd>
<dt>Recorded</dt><dd>{{.RecordedAt}}</dd>
<dt>Takes effect</dt><dd>{{.EffectiveAt}}</dd>
</dl>{{end}}

{{with .Open}}<h2>Open amendment</h2>
<p>Version {{.Version}}, proposed by the {{.Proposer}} seat at {{.ProposedAt}}; lapses unanswered at {{.LapsesAt}}. It has no force until countersigned.</p>{{end}}

<h2>Amendments</h2>
{{if .Amendments}}<table>
<tr><th>When</th><th>What</th><th>Version</th><th>By</th><th>Reason</th></tr>
{{range .Amendments}}<tr><td>{{.At}}</td><td>{{.Kind}}</td><td>{{.Version}}</td><td>{{.Role}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>{{else}}<p class="note">None.</p>{{end}}

<h2>Reviews</h2>
{{if .Reviews}}<table>
<tr><th>Signed</th><th>Verdict</th><th>Task</th><th>Reason</th></tr>
{{range .Reviews}}<tr><td>{{.SignedAt}}</td><td>{{.Verdict}}</td><td>{{.TaskID}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>{{if .ReviewsNext}}<p class="note">{{.ReviewsTotal}} reviews; the next page: <code>?reviews_after={{.ReviewsNext}}</code></p>{{end}}{{else}}<p class="note">No reviews. No review is no evidence: silence is never acceptance.</p>{{end}}

<h2>History</h2>
<table>
<tr><th>#</th><th>When</th><th>Event</th><th>Version</th><th>Seat</th><th>Signed bytes (SHA-256)</th></tr>
{{range .History}}<tr><td>{{.Seq}}</td><td>{{.At}}</td><td>{{.Kind}}</td><td>{{.Version}}</td><td>{{.Role}}</td><td>{{if .Link}}<a href="{{.Link}}"><code>{{.SignedSHA256}}</code></a>{{else}}<code>{{.SignedSHA256}}</code>{{end}}</td></tr>
{{end}}</table>
{{if .HistoryNext}}<p class="note">{{.HistoryTotal}} entries; the next page: <code>?history_after={{.HistoryNext}}</code></p>{{end}}
<p class="note">The signed bytes of the governing document, the open amendment, the termination notice, every signed act and every review are in this record's JSON (Accept: application/json); a document version of the history is at its link.</p>
</body>
</html>
`))

// Render is the record's page.
func Render(v *engagement.View) ([]byte, error) {
	var b bytes.Buffer
	if err := page.Execute(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
