package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The Records page shows the account's audit export and the mesh's public
// anchors. Both are the control plane's own routes on the console's host
// (spec §4.4: GET /v1/accounts/:id/audit/export, GET /v1/anchors): the
// console reads them there rather than from a second implementation, with
// the session's token for the export (the console's cookie is not sent to
// /v1/, and a link could not carry the token). A route this instance does
// not serve (404) makes the page say so.

// Control-plane paths the Records page reads.
const (
	anchorsPath = "/v1/anchors"
	exportPath  = "/v1/accounts/%s/audit/export"
)

// maxAnchors is how many anchors the page lists, newest first.
const maxAnchors = 60

type anchorLink struct{ Label, URL string }

type anchorRow struct {
	Date, Root, Status string
	Links              []anchorLink
}

type recordsData struct {
	// ExportAPI is the export route as a program calls it.
	ExportAPI  string
	AnchorsAPI string
	Anchors    []anchorRow
	// AnchorsNote says why no anchor is listed ("" when some are).
	AnchorsNote string
}

func (s *Server) recordsView(r *http.Request, ss *session) *view {
	d := &recordsData{ExportAPI: s.origin + fmt.Sprintf(exportPath, ss.p.AccountID), AnchorsAPI: s.origin + anchorsPath}
	d.Anchors, d.AnchorsNote = s.anchors(r.Context())
	return &view{Title: "Records", Nav: "records", sess: ss, Data: d, Err: map[string]string{}}
}

func (s *Server) recordsPage(w http.ResponseWriter, r *http.Request, ss *session) {
	s.render(w, r, http.StatusOK, "records", s.recordsView(r, ss))
}

// anchors reads GET /v1/anchors. Its entries are read for a date, a root,
// a status and links: members named document and proof (or ending in
// _url), or a links object of name → URL.
func (s *Server) anchors(ctx context.Context) ([]anchorRow, string) {
	if s.origin == "" {
		return nil, "The anchors cannot be read: this console has no address configured."
	}
	resp, err := s.get(ctx, anchorsPath, "")
	if err != nil {
		s.log.Warn("records: anchors", "err", err)
		return nil, "The anchors cannot be read right now. Try again in a moment."
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusNotImplemented {
		return nil, "This mesh publishes no anchors yet."
	}
	var body map[string]any
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&body) != nil {
		s.log.Warn("records: anchors", "status", resp.StatusCode)
		return nil, "The anchors cannot be read right now. Try again in a moment."
	}
	list, _ := body["anchors"].([]any)
	var out []anchorRow
	for _, v := range list {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		row := anchorRow{Date: str(m["date"]), Root: str(m["root"]), Status: str(m["status"])}
		add := func(label string, v any) {
			if u := str(v); strings.HasPrefix(u, "/") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
				row.Links = append(row.Links, anchorLink{Label: label, URL: u})
			}
		}
		for _, k := range []string{"document", "proof", "document_url", "proof_url"} {
			add(strings.TrimSuffix(k, "_url"), m[k])
		}
		if links, ok := m["links"].(map[string]any); ok {
			names := make([]string, 0, len(links))
			for k := range links {
				names = append(names, k)
			}
			slices.Sort(names)
			for _, k := range names {
				add(k, links[k])
			}
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b anchorRow) int { return strings.Compare(b.Date, a.Date) })
	if len(out) > maxAnchors {
		out = out[:maxAnchors]
	}
	if len(out) == 0 {
		return nil, "No anchor has been made yet: the first is made after the first day with audit rows."
	}
	return out, ""
}

// auditExport downloads the account's signed audit bundle: the export
// route's answer, as a file.
func (s *Server) auditExport(w http.ResponseWriter, r *http.Request, ss *session) {
	refuse := func(status int, msg string) {
		v := s.recordsView(r, ss)
		v.Err["export"] = msg
		s.render(w, r, status, "records", v)
	}
	if s.origin == "" {
		refuse(http.StatusNotImplemented, "The audit export cannot be read: this console has no address configured.")
		return
	}
	resp, err := s.get(r.Context(), fmt.Sprintf(exportPath, ss.p.AccountID), ss.token)
	if err != nil {
		s.log.Warn("records: audit export", "err", err)
		refuse(http.StatusBadGateway, "The audit export could not be fetched. Try again in a moment.")
		return
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusNotImplemented:
		refuse(http.StatusNotFound, "The audit export is not available on this instance yet.")
		return
	default:
		var e struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		msg := "The audit export could not be made. Try again in a moment."
		if e.Error != "" {
			msg = "The audit export could not be made: " + e.Error + "."
		}
		refuse(resp.StatusCode, msg)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="audit-%s-%s.json"`, ss.p.AccountID, time.Now().UTC().Format("2006-01-02")))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, resp.Body); err != nil {
		s.log.Warn("records: audit export cut off", "err", err)
	}
}

// get fetches path from the control plane on the console's own host, with
// bearer as the Authorization when given.
func (s *Server) get(ctx context.Context, path, bearer string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.origin+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, errors.Join(errors.New("GET "+path), err)
	}
	return resp, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
