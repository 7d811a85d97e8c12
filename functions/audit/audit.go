// Package audit is the audit records' part of the control plane (spec
// §2.11, §4.4; docs/audit.md): the scheduled daily anchor job, the public
// listing of anchors with their documents, timestamp proofs and the
// authorities' roots, and an account's signed export. The rows themselves
// are written on the bus (the activity worker, and the control plane's
// credential service for the account's own actions).
package audit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// AnchorEvery is how often the anchor job runs. It anchors a date once
// the date has ended (and a minute more), so the day's anchor is made
// within this much of midnight UTC, and a failed stamp is asked again as
// often; a run with nothing to do reads one list of anchor records.
const AnchorEvery = 30 * time.Minute

// Routes is the group's route table. The anchors are public: they name no
// agent or account. The export is the account's (a session, or an API
// token with scope "audit").
var Routes = []api.Route{
	api.JobRoute("AuditAnchor", "/jobs/audit-anchor", AnchorEvery, func(d *api.Deps) api.Job {
		if d.Audit == nil || !d.Audit.Anchoring() {
			return nil
		}
		return d.Audit.RunAnchors
	}),
	{EntryPoint: "AnchorList", Method: http.MethodGet, Path: "/v1/anchors", Auth: api.Public, Handler: records(list)},
	{EntryPoint: "AnchorAuthorities", Method: http.MethodGet, Path: "/v1/anchors/authorities", Auth: api.Public, Handler: records(authorities)},
	{EntryPoint: "AnchorDocument", Method: http.MethodGet, Path: "/v1/anchors/{date}/document", Auth: api.Public, Handler: records(document)},
	{EntryPoint: "AnchorProof", Method: http.MethodGet, Path: "/v1/anchors/{date}/proof", Auth: api.Public, Handler: records(proof)},
	{EntryPoint: "AuditExport", Method: http.MethodGet, Path: "/v1/accounts/{id}/audit/export", Auth: api.SessionOrToken("audit"), Handler: records(export)},
}

// records builds a route that needs the audit service.
func records(h func(d *api.Deps) httpx.HandlerFunc) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Audit == nil {
			return api.NotConfigured("the audit records")
		}
		return h(d)
	}
}

// Listing limits of GET /v1/anchors.
const (
	DefaultListLimit = 30
	MaxListLimit     = 366
)

// testOnlyNote is the label of every answer about anchors stamped by
// meshd's local authorities.
const testOnlyNote = "These anchors are stamped by local TEST-ONLY timestamp authorities (meshd): their stamps prove nothing to anyone who does not trust their roots."

// anchorLinks are the routes of an anchor's document and proof.
func anchorLinks(date string) (document, proof string) {
	return "/v1/anchors/" + date + "/document", "/v1/anchors/" + date + "/proof"
}

func list(d *api.Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		limit := DefaultListLimit
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxListLimit {
				return errs.Newf(errs.InvalidRequest, "limit must be a whole number from 1 to %d", MaxListLimit)
			}
			limit = n
		}
		as, err := d.Audit.Anchors(r.Context(), limit)
		if err != nil {
			return errs.Wrap(errs.Unavailable, "the anchors could not be read; retry shortly", err)
		}
		items := make([]map[string]any, 0, len(as))
		for _, a := range as {
			doc, prf := anchorLinks(a.Date)
			names := make([]string, 0, len(a.Stamps))
			for _, st := range a.Stamps {
				names = append(names, st.Authority)
			}
			items = append(items, map[string]any{"date": a.Date, "root": a.Document.Root, "status": a.Status,
				"heads": a.Document.Heads, "rows": a.Document.Rows, "document_sha256": a.DocumentSHA256,
				"stamped_by": names, "document_url": doc, "proof_url": prf})
		}
		out := map[string]any{"ok": true, "anchors": items, "test_only": d.Audit.TestOnly(), "authorities_url": "/v1/anchors/authorities"}
		if d.Audit.TestOnly() {
			out["note"] = testOnlyNote
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
}

func authorities(d *api.Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		out := map[string]any{"ok": true, "authorities": d.Audit.Authorities(), "test_only": d.Audit.TestOnly()}
		if d.Audit.TestOnly() {
			out["note"] = testOnlyNote
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
}

// anchorOf reads the anchor of the path's date.
func anchorOf(d *api.Deps, r *http.Request) (*audit.Anchor, error) {
	date := r.PathValue("date")
	if _, err := audit.ParseDate(date); err != nil {
		return nil, errs.New(errs.InvalidRequest, "the date must be YYYY-MM-DD")
	}
	a, err := d.Audit.Anchor(r.Context(), date)
	if errors.Is(err, audit.ErrNoAnchor) {
		return nil, errs.Newf(errs.NotFound, "no anchor for %s", date)
	}
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the anchor could not be read; retry shortly", err)
	}
	return a, nil
}

// document answers the anchor document's published bytes: its canonical
// JSON, whose SHA-256 the authorities stamp.
func document(d *api.Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		a, err := anchorOf(d, r)
		if err != nil {
			return err
		}
		b, err := a.Document.Canonical()
		if err != nil {
			return errs.Wrap(errs.InternalError, "the anchor document could not be written", err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Disposition", fmt.Sprintf("inline; filename=\"anchor-%s.json\"", a.Date))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return nil
	}
}

// proofStamp is one authority's stamp of an anchor document, with what
// verifies it.
type proofStamp struct {
	Authority string `json:"authority"`
	// AuthorityID is the hex SHA-256 of the root, as in export bundles.
	AuthorityID string `json:"authority_id"`
	Nonce       string `json:"nonce"`
	Time        string `json:"time"`
	// Token is the DER TimeStampToken; Root and Intermediates DER
	// certificates (standard base64 in JSON).
	Token         []byte   `json:"token"`
	Root          []byte   `json:"root"`
	Intermediates [][]byte `json:"intermediates,omitempty"`
}

// proof answers an anchor's timestamp proof: every stamp's token with the
// certificates and nonce that verify it against the document's SHA-256.
func proof(d *api.Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		a, err := anchorOf(d, r)
		if err != nil {
			return err
		}
		stamps := make([]proofStamp, 0, len(a.Stamps))
		for _, st := range a.Stamps {
			stamps = append(stamps, proofStamp{Authority: st.Authority, AuthorityID: audit.RootID(st.Root), Nonce: st.Nonce,
				Time: protocol.FormatTime(st.Time), Token: st.Token, Root: st.Root, Intermediates: st.Intermediates})
		}
		doc, _ := anchorLinks(a.Date)
		out := map[string]any{"ok": true, "date": a.Date, "status": a.Status, "document": a.Document, "document_sha256": a.DocumentSHA256,
			"document_url": doc, "stamps": stamps, "test_only": d.Audit.TestOnly()}
		if a.LastError != "" {
			out["last_error"] = a.LastError
		}
		if d.Audit.TestOnly() {
			out["note"] = testOnlyNote
		}
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
}

// export answers the account's signed bundle: every row of its agents'
// chains, and what verifies them offline (docs/audit.md "The export
// bundle"), as a file to keep.
func export(d *api.Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if d.Credentials == nil {
			return api.NotConfigured("the credential service")(w, r)
		}
		account := api.PrincipalOf(r).AccountID
		ags, err := d.Credentials.Agents(r.Context(), account)
		if err != nil {
			return err
		}
		ids := make([]string, len(ags))
		for i, a := range ags {
			ids[i] = a.ID
		}
		b, err := d.Audit.Export(r.Context(), account, ids)
		switch {
		case errors.Is(err, audit.ErrNotConfigured):
			return errs.New(errs.NotImplemented, "audit exports are not configured on this instance (no export key)")
		case errors.Is(err, audit.ErrUnavailable):
			return errs.Wrap(errs.Unavailable, "the audit records cannot be reached; retry shortly", err)
		case err != nil:
			return errs.Wrap(errs.Unavailable, "the export could not be made; retry shortly", err)
		}
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", "audit-"+account+"-"+b.Manifest.CreatedAt[:10]+".json"))
		httpx.WriteJSON(w, http.StatusOK, b)
		return nil
	}
}
