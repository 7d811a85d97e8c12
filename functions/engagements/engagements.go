// Package engagements is the engagement records' part of the control
// plane (spec §2.12, §4.4; docs/engagements.md): filing a standing
// proposal, the two formation steps, amendments, termination, reviews and
// the public record as JSON or a rendered page. The decisions are
// shared/engagement's; these handlers decode a body, call one method and
// render. Every route is public: what authorizes an act is the owner's
// signature inside the body.
package engagements

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/sow"
)

// MirrorEvery is how often the mirror job writes terms a change left
// unmirrored (the bus was unreachable when it was recorded).
const MirrorEvery = 5 * time.Minute

// Routes is the group's route table.
var Routes = []api.Route{
	{EntryPoint: "EngageProposal", Method: http.MethodPost, Path: "/v1/engage/proposals", Auth: api.Public, Handler: svc(fileProposal)},
	{EntryPoint: "EngageProposalWithdraw", Method: http.MethodPost, Path: "/v1/engage/proposals/withdraw", Auth: api.Public, Handler: svc(withdrawProposal)},
	{EntryPoint: "EngageCountersign", Method: http.MethodPost, Path: "/v1/engage/countersign", Auth: api.Public, Handler: svc(countersign)},
	{EntryPoint: "EngageCountersignWithdraw", Method: http.MethodPost, Path: "/v1/engage/countersign/withdraw", Auth: api.Public, Handler: signed(withdrawRequest)},
	{EntryPoint: "EngageSign", Method: http.MethodPost, Path: "/v1/engage/sign", Auth: api.Public, Handler: document(signInstance)},
	{EntryPoint: "EngageAmend", Method: http.MethodPost, Path: "/v1/engage/amend", Auth: api.Public, Handler: document(propose)},
	{EntryPoint: "EngageAmendApprove", Method: http.MethodPost, Path: "/v1/engage/amend/approve", Auth: api.Public, Handler: document(approve)},
	{EntryPoint: "EngageAmendResolve", Method: http.MethodPost, Path: "/v1/engage/amend/resolve", Auth: api.Public, Handler: signed(resolve)},
	{EntryPoint: "EngageTerminate", Method: http.MethodPost, Path: "/v1/engage/terminate", Auth: api.Public, Handler: signed(terminate)},
	{EntryPoint: "ReviewAdd", Method: http.MethodPost, Path: "/v1/reviews", Auth: api.Public, Handler: svc(review)},
	{EntryPoint: "EngagementGet", Method: http.MethodGet, Path: "/v1/engagements/{client}/{seller}/{offering}", Auth: api.Public, Handler: svc(get)},
	api.JobRoute("EngagementMirror", "/jobs/engagement-mirror", MirrorEvery, func(d *api.Deps) api.Job {
		if d.Engagements == nil {
			return nil
		}
		return d.Engagements.SyncPending
	}),
}

// maxDocumentBody bounds a body carrying a document.
const maxDocumentBody = sow.MaxDocumentBytes + 4<<10

func svc(h func(s *engagement.Service, w http.ResponseWriter, r *http.Request) error) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Engagements == nil {
			return api.NotConfigured("the engagement records")
		}
		return func(w http.ResponseWriter, r *http.Request) error { return h(d.Engagements, w, r) }
	}
}

// documentBody is {"document": <the engagement document as signed>}: the
// member's bytes are kept exactly as received.
type documentBody struct {
	Document json.RawMessage `json:"document"`
}

// document builds a route whose body carries one document.
func document(call func(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error)) api.Handler {
	return svc(func(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
		var b documentBody
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true, MaxBytes: maxDocumentBody}); err != nil {
			return err
		}
		rec, err := call(s, r, b.Document)
		if err != nil {
			return err
		}
		return answer(w, rec)
	})
}

// signed builds a route whose body is one signed act, kept exactly.
func signed(call func(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error)) api.Handler {
	return svc(func(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
		var raw json.RawMessage
		if err := httpx.Decode(w, r, &raw, httpx.DecodeOptions{MaxBytes: engagement.MaxActBytes}); err != nil {
			return err
		}
		rec, err := call(s, r, raw)
		if err != nil {
			return err
		}
		return answer(w, rec)
	})
}

// answer is a write's reply: where the record is read, and what it now
// says.
func answer(w http.ResponseWriter, rec *engagement.Record) error {
	out := map[string]any{"ok": true, "sow_id": rec.SowID, "client": rec.Client, "seller": rec.Seller, "version": rec.Version,
		"formed": rec.Formed(), "offerings": rec.Offerings}
	if len(rec.Offerings) > 0 {
		out["record_url"] = RecordPath(rec.Client, rec.Seller, rec.Offerings[0])
	}
	if rec.Open != nil {
		out["open_amendment"] = map[string]any{"version": rec.Open.Version, "lapses_at": rec.Open.LapsesAt}
	}
	if t := rec.Termination; t != nil {
		out["termination"] = map[string]any{"for_cause": t.ForCause, "effective_at": t.EffectiveAt}
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

// RecordPath is the public record's path.
func RecordPath(client, seller, offering string) string {
	return engagement.RecordPath(client, seller, offering)
}

// fileProposal files a standing proposal (the same bytes again answer the
// same offer).
func fileProposal(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
	var b documentBody
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true, MaxBytes: maxDocumentBody}); err != nil {
		return err
	}
	o, err := s.FileProposal(r.Context(), b.Document)
	if err != nil {
		return err
	}
	return offerAnswer(w, o)
}

func offerAnswer(w http.ResponseWriter, o *engagement.Offer) error {
	out := map[string]any{"ok": true, "sow_id": o.SowID, "provider": o.Provider, "filed_at": o.FiledAt, "directed": o.Directed}
	if o.WithdrawnAt != "" {
		out["withdrawn_at"] = o.WithdrawnAt
	} else {
		out["countersign"] = "POST /v1/engage/countersign with the completed instance signed by the client seat's owner"
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

// withdrawProposal withdraws a standing proposal (a signed withdrawal).
func withdrawProposal(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	if err := httpx.Decode(w, r, &raw, httpx.DecodeOptions{MaxBytes: engagement.MaxActBytes}); err != nil {
		return err
	}
	o, err := s.WithdrawProposal(r.Context(), raw)
	if err != nil {
		return err
	}
	return offerAnswer(w, o)
}

func countersign(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Document json.RawMessage `json:"document"`
		Asserted []string        `json:"asserted"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true, MaxBytes: maxDocumentBody}); err != nil {
		return err
	}
	rec, err := s.Countersign(r.Context(), b.Document, b.Asserted)
	if err != nil {
		return err
	}
	return answer(w, rec)
}

func withdrawRequest(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.WithdrawRequest(r.Context(), raw)
}

func signInstance(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.Sign(r.Context(), raw)
}

func propose(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.Propose(r.Context(), raw)
}

func approve(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.Approve(r.Context(), raw)
}

func resolve(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.Resolve(r.Context(), raw)
}

func terminate(s *engagement.Service, r *http.Request, raw []byte) (*engagement.Record, error) {
	return s.Terminate(r.Context(), raw)
}

// review appends a review: 201 when stored, 200 when the same signed
// review was already on record (stored once).
func review(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	if err := httpx.Decode(w, r, &raw, httpx.DecodeOptions{MaxBytes: engagement.MaxActBytes}); err != nil {
		return err
	}
	rv, dup, err := s.AddReview(r.Context(), raw)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if dup {
		status = http.StatusOK
	}
	httpx.WriteJSON(w, status, map[string]any{"ok": true, "duplicate": dup, "digest": rv.Digest, "verdict": rv.Verdict, "stored_at": rv.StoredAt})
	return nil
}

// wantsHTML reports whether the reader asked for the rendered page:
// ?format=html, or an Accept naming text/html before any JSON.
func wantsHTML(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "html":
		return true
	case "json":
		return false
	}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt := strings.TrimSpace(strings.SplitN(part, ";", 2)[0])
		switch mt {
		case "text/html":
			return true
		case "application/json":
			return false
		}
	}
	return false
}

// query reads an optional non-negative integer parameter.
func query(r *http.Request, name string) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, errs.Newf(errs.InvalidRequest, "%s is a non-negative integer", name)
	}
	return n, nil
}

// get answers the public record, one page of its history and reviews
// (?history_after, ?history_limit, ?reviews_after, ?reviews_limit), or
// with ?event=<seq> one history entry with its signed bytes in full.
func get(s *engagement.Service, w http.ResponseWriter, r *http.Request) error {
	client, seller, offering := r.PathValue("client"), r.PathValue("seller"), r.PathValue("offering")
	if r.URL.Query().Has("event") {
		seq, err := query(r, "event")
		if err != nil {
			return err
		}
		e, err := s.EventOf(r.Context(), client, seller, offering, seq)
		if err != nil {
			return err
		}
		httpx.WriteJSONExact(w, http.StatusOK, map[string]any{"ok": true, "event": e})
		return nil
	}
	var p engagement.Page
	for _, f := range []struct {
		name string
		dst  *int
	}{{"history_after", &p.HistoryAfter}, {"history_limit", &p.HistoryLimit}, {"reviews_after", &p.ReviewsAfter}, {"reviews_limit", &p.ReviewsLimit}} {
		n, err := query(r, f.name)
		if err != nil {
			return err
		}
		*f.dst = n
	}
	v, err := s.EngagementPage(r.Context(), client, seller, offering, p)
	if err != nil {
		return err
	}
	if wantsHTML(r) {
		b, err := Render(v)
		if err != nil {
			return errs.Wrap(errs.InternalError, "the engagement page could not be rendered", err)
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return nil
	}
	httpx.WriteJSONExact(w, http.StatusOK, map[string]any{"ok": true, "engagement": v})
	return nil
}
