package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/registrar"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

func init() {
	register(&command{name: "engage", usage: "show|propose|countersign|sign|terminate|review|amend|approve|deny|withdraw ... [--json]",
		summary: "take part in an engagement (Agent SoW) with the owner key",
		help: `Engagements are Agent SoW documents that two agents' owners sign
(docs/engagements.md). These commands sign with the owner key in the state
directory and call the control plane's engagement routes (--control-url,
default: the one saved by "up"). <client> and <seller> are agent ids or
handles; <offering> is one offering in the engagement's scope.

  show <client> <seller> <offering> [--document]
                                           print the public record: state, version, term, every clause
                                           with its grade, amendments, termination, reviews (--document:
                                           the governing document's exact bytes, to edit for amend)
  propose <document.json> [--out F]        as the provider's owner: sign the template and file it as a
                                           standing proposal; the signed proposal is written to F
  countersign <proposal.json> [--client-agent A] [--starts-at T] [--ends-at T] [--owner LABEL] [--assert ID,...]
                                           as the client's owner: fill the client seat (this agent by
                                           default), set the term, sign, and ask the provider to form it
  sign <client> <seller> <offering> [--yes]
                                           as the provider's owner: show the countersigned instance, then
                                           add the provider's instance signature; the engagement forms
  terminate <client> <seller> <offering> [--for-cause --reason R]
                                           as either owner: end it (for cause: at once, the reason on the
                                           public record; otherwise after the convenience notice)
  review <client> <seller> <offering> --accepted | --rejected --reason R [--task T]
                                           as the client's owner: review the work (a rejection needs a reason)
  amend <document.json> [--offering O]     as either owner: propose the edited document as the next version
  approve <client> <seller> <offering> [--yes]
                                           as the counterparty's owner: show the open amendment, then
                                           countersign it; it governs from now
  deny <client> <seller> <offering> --reason R
                                           as the counterparty's owner: refuse the open amendment
  withdraw <client> <seller> <offering> [--reason R]
                                           as the proposer's owner: take the open amendment back

--json prints the record or the service's answer as JSON.

Example:
  mesh-adapter engage propose summaries.json
  mesh-adapter engage countersign sow_7k2m9q4x1c8v0b3n.proposal.json --ends-at 90d
  mesh-adapter engage sign UCLIENT... UPROVIDER... summarize
  mesh-adapter engage show client.ana@example.org UPROVIDER... summarize
  mesh-adapter engage review UCLIENT... UPROVIDER... summarize --rejected --reason "The totals were missing." --task task-7
  mesh-adapter engage terminate UCLIENT... UPROVIDER... summarize --for-cause --reason "Work outside the scope."
  mesh-adapter engage show UCLIENT... UPROVIDER... summarize --document > v2.json   # edit, then:
  mesh-adapter engage amend v2.json
  mesh-adapter engage approve UCLIENT... UPROVIDER... summarize
  mesh-adapter engage deny UCLIENT... UPROVIDER... summarize --reason "Five an hour is too few."
  mesh-adapter engage withdraw UCLIENT... UPROVIDER... summarize`,
		run: runEngage})
}

const engageVerbs = "show, propose, countersign, sign, terminate, review, amend, approve, deny or withdraw"

func runEngage(ctx context.Context, e *Env, args []string) error {
	sub, args, err := subcommand(args, engageVerbs)
	if err != nil {
		return err
	}
	switch sub {
	case "show":
		return engageShow(ctx, e, args)
	case "propose":
		return engagePropose(ctx, e, args)
	case "countersign":
		return engageCountersign(ctx, e, args)
	case "sign":
		return engageSign(ctx, e, args)
	case "terminate":
		return engageTerminate(ctx, e, args)
	case "review":
		return engageReview(ctx, e, args)
	case "amend":
		return engageAmend(ctx, e, args)
	case "approve":
		return engageApprove(ctx, e, args)
	case "deny":
		return engageResolve(ctx, e, engagement.ActDeny, args)
	case "withdraw":
		return engageResolve(ctx, e, engagement.ActWithdraw, args)
	}
	return usageError("unknown engage action %q: say %s", sub, engageVerbs)
}

// engageCP calls the control plane's engagement routes over HTTP: they are
// public, and what authorizes an act is the owner's signature in the body.
type engageCP struct {
	base string
	http *http.Client
}

// cpError is a control-plane refusal: {ok:false, code, error, details?}.
type cpError struct {
	Status  int
	Code    string
	Message string
}

func (e *cpError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("%s (%s, HTTP %d)", e.Message, e.Code, e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// do sends body (nil for GET) to path and decodes a 2xx answer into out;
// it returns the status.
func (c engageCP) do(ctx context.Context, method, path string, body []byte, out any) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.base, "/")+path, rd)
	if err != nil {
		return 0, fmt.Errorf("control URL %q: %w", c.base, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, fmt.Errorf("cannot reach the mesh's control plane at %s: is meshd running?", c.base)
		}
		return 0, fmt.Errorf("the control plane at %s cannot be reached: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("control plane %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
			Code  string `json:"code"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return resp.StatusCode, &cpError{Status: resp.StatusCode, Code: e.Code, Message: e.Error}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("the control plane's answer to %s is not the JSON expected: %w", path, err)
		}
	}
	return resp.StatusCode, nil
}

// engageSession is what an engage command runs with: the control plane,
// and the state's identity when the command signs.
type engageSession struct {
	cp       engageCP
	dir      *state.Dir // nil when show runs without a state directory
	id       state.Identity
	ks       state.Keys
	registry string // the registrar URL, for handles
}

// session opens the control plane, and the identity when signing is true.
// Without a state directory (show only), --control-url is required.
func (e *Env) engageSession(signing bool) (*engageSession, error) {
	s := &engageSession{cp: engageCP{http: http.DefaultClient}}
	var conf state.Config
	if signing {
		dir, id, ks, err := e.identity()
		if err != nil {
			return nil, fmt.Errorf("signing needs this adapter's owner key: %w", err)
		}
		s.dir, s.id, s.ks = dir, id, ks
	} else if e.StateDir != "" {
		if fi, err := os.Stat(e.StateDir); err == nil && fi.IsDir() {
			if dir, err := state.Open(e.StateDir); err == nil {
				s.dir = dir
			}
		}
	}
	if s.dir != nil {
		var err error
		if conf, err = s.dir.Config(); err != nil {
			return nil, err
		}
	}
	s.cp.base = firstNonEmpty(e.ControlURL, conf.ControlURL)
	if s.cp.base == "" {
		return nil, usageError("no control URL: pass --control-url or set MESH_CONTROL_URL (meshd prints it when it starts)")
	}
	s.registry = firstNonEmpty(e.RegistrarURL, conf.RegistrarURL)
	return s, nil
}

// agent turns an agent id or a handle into an agent id; a handle's card is
// verified and pinned as for send.
func (s *engageSession) agent(ctx context.Context, ref string) (string, error) {
	if keys.IsUserPublicKey(ref) {
		return ref, nil
	}
	if !strings.Contains(ref, ".") || !strings.Contains(ref, "@") {
		return "", usageError("%q is neither an agent id (U…, 56 characters) nor a handle (<name>.<email>)", ref)
	}
	if s.registry == "" {
		return "", usageError("resolving the handle %s needs the registrar: pass --registrar-url or set MESH_REGISTRAR_URL, or give the agent id", ref)
	}
	rc := registrar.New(s.registry)
	if s.dir != nil {
		rc.Pins = registrar.OpenPins(s.dir.File(registrar.PinsFile))
	}
	return rc.ResolveAgent(ctx, ref)
}

// names resolves <client> <seller> <offering>.
func (s *engageSession) names(ctx context.Context, pos []string) (client, seller, offering string, err error) {
	if len(pos) != 3 {
		return "", "", "", usageError("give the client, the seller and the offering")
	}
	if client, err = s.agent(ctx, pos[0]); err != nil {
		return "", "", "", err
	}
	if seller, err = s.agent(ctx, pos[1]); err != nil {
		return "", "", "", err
	}
	return client, seller, pos[2], nil
}

// record reads the public record of the engagement between client and
// seller for offering: every page of its history and reviews (a record
// keeps at most 1,000 of each, 200 to a page).
func (s *engageSession) record(ctx context.Context, client, seller, offering string) (*engagement.View, error) {
	base := "/v1/engagements/" + url.PathEscape(client) + "/" + url.PathEscape(seller) + "/" + url.PathEscape(offering) +
		fmt.Sprintf("?format=json&history_limit=%d&reviews_limit=%d", engagement.MaxPage, engagement.MaxPage)
	var all *engagement.View
	historyAfter, reviewsAfter := 0, 0
	for range 2 * (engagement.MaxReviews/engagement.MaxPage + 2) {
		var out struct {
			Engagement engagement.View `json:"engagement"`
		}
		path := base + fmt.Sprintf("&history_after=%d&reviews_after=%d", historyAfter, reviewsAfter)
		if st, err := s.cp.do(ctx, http.MethodGet, path, nil, &out); err != nil {
			if st == http.StatusNotFound {
				return nil, fmt.Errorf("no engagement between client %s and seller %s for offering %q is on record", client, seller, offering)
			}
			return nil, err
		}
		v := &out.Engagement
		if all == nil {
			all = v
		} else {
			all.History = append(all.History, v.History...)
			all.Amendments = append(all.Amendments, v.Amendments...)
			all.Reviews = append(all.Reviews, v.Reviews...)
		}
		if v.HistoryNext == 0 && v.ReviewsNext == 0 {
			all.HistoryNext, all.ReviewsNext = 0, 0
			return all, nil
		}
		// A list that is complete is asked past its end, so the other
		// one's next pages do not repeat it.
		historyAfter, reviewsAfter = cmp.Or(v.HistoryNext, v.HistoryTotal), cmp.Or(v.ReviewsNext, v.ReviewsTotal)
	}
	return nil, fmt.Errorf("the record of %s kept answering more pages than a record holds", all.SowID)
}

// formedRecord is record, refusing one not yet formed.
func (s *engageSession) formedRecord(ctx context.Context, client, seller, offering string) (*engagement.View, error) {
	v, err := s.record(ctx, client, seller, offering)
	if err != nil {
		return nil, err
	}
	if v.Document == "" {
		return nil, fmt.Errorf("engagement %s is not formed yet (%s): the provider's owner runs `mesh-adapter engage sign %s %s %s` first", v.SowID, v.State, client, seller, offering)
	}
	return v, nil
}

// encodeDocument writes a document the way it is sent: indented, without
// HTML escaping. Signatures cover the canonical form, so the spacing is free.
func encodeDocument(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// signDocument appends role's signature by the owner key to doc and
// returns the bytes to send, read back with sow.Parse.
func signDocument(doc map[string]any, owner keys.Signer, role string) ([]byte, *sow.Document, error) {
	sig, err := sow.Sign(doc, owner, role, time.Now())
	if err != nil {
		return nil, nil, err
	}
	sigs, _ := doc["signatures"].([]any)
	doc["signatures"] = append(slices.Clone(sigs), map[string]any{"role": sig.Role, "key": sig.Key, "signed_at": sig.SignedAt, "sig": sig.Sig})
	raw, err := encodeDocument(doc)
	if err != nil {
		return nil, nil, err
	}
	d, err := sow.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("the signed document does not read back: %w", err)
	}
	return raw, d, nil
}

// documentBody is {"document": raw, ...extra}, raw kept as it is.
func documentBody(raw []byte, asserted []string) []byte {
	b := append([]byte(`{"document":`), raw...)
	if len(asserted) > 0 {
		a, _ := json.Marshal(asserted)
		b = append(append(b, `,"asserted":`...), a...)
	}
	return append(b, '}')
}

// readDocument reads an engagement document from a file ("-": stdin) and
// decodes it as the signatures will see it.
func readDocument(e *Env, path string) ([]byte, map[string]any, error) {
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(io.LimitReader(e.Stdin, sow.MaxDocumentBytes+1))
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the document: %w", err)
	}
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("%s is not a JSON engagement document: %w", path, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, fmt.Errorf("%s is not an engagement document: it is not a JSON object", path)
	}
	return raw, m, nil
}

// parseInstant reads an RFC 3339 instant, "now", or a duration from now
// (720h, 30d).
func parseInstant(flagName, s string, now time.Time) (time.Time, error) {
	if s == "now" {
		return now, nil
	}
	if t, err := protocol.ParseTime(s); err == nil {
		return t, nil
	}
	f, err := parseExpires(s, now)
	if err != nil {
		return time.Time{}, usageError("%s %q is neither an RFC 3339 instant, \"now\", nor a duration from now (720h, 30d)", flagName, s)
	}
	t, _ := protocol.ParseTime(f)
	return t, nil
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func engagePropose(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage propose", flag.ContinueOnError)
	out := fs.String("out", "", "where to write the signed proposal (default <sow id>.proposal.json beside the document)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("give one document: engage propose <document.json>")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	_, doc, err := readDocument(e, pos[0])
	if err != nil {
		return err
	}
	if sigs, _ := doc["signatures"].([]any); len(sigs) > 0 {
		return fmt.Errorf("%s is already signed; propose signs the unsigned template itself (remove signatures)", pos[0])
	}
	delete(doc, "signatures")
	// The seat this adapter's owner signs for: its own agent, its owner
	// key as the label when the template names none.
	if parties, ok := doc["parties"].(map[string]any); ok {
		if p, ok := parties["provider"].(map[string]any); ok {
			if _, set := p["agent"]; !set {
				p["agent"] = s.id.AgentID
			}
			if _, set := p["owner"]; !set {
				p["owner"] = s.ks.Owner.Public()
			}
			if a, _ := p["agent"].(string); a != s.id.AgentID {
				return fmt.Errorf("the provider seat names agent %s, but this adapter's agent is %s: its owner key signs only for its own agent", a, s.id.AgentID)
			}
		}
	}
	minted := false
	if _, has := doc["id"]; !has {
		id, err := sow.MintID(doc)
		if err != nil {
			return err
		}
		doc["id"], minted = id, true
	}
	d, err := sow.FromValue(doc)
	if err != nil {
		return fmt.Errorf("%s is not a valid engagement document: %w", pos[0], err)
	}
	if d.Parties.Client != nil || d.StartsAt != "" {
		return fmt.Errorf("%s is not a template: a standing proposal leaves the client seat and starts_at null (the client's countersign fills them)", pos[0])
	}
	raw, d, err := signDocument(doc, s.ks.Owner, sow.RoleProvider)
	if err != nil {
		return err
	}
	var ans struct {
		SowID    string `json:"sow_id"`
		Provider string `json:"provider"`
		FiledAt  string `json:"filed_at"`
		Directed bool   `json:"directed"`
	}
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/proposals", documentBody(raw, nil), &ans); err != nil {
		return fmt.Errorf("the engagement service refused the proposal: %w", err)
	}
	path := *out
	if path == "" {
		base := "."
		if pos[0] != "-" {
			base = filepath.Dir(pos[0])
		}
		path = filepath.Join(base, d.ID+".proposal.json")
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("the proposal is filed, but writing it to %s failed: %w", path, err)
	}
	if *asJSON {
		return printJSON(e.Stdout, map[string]any{"sow_id": ans.SowID, "provider": ans.Provider, "filed_at": ans.FiledAt, "directed": ans.Directed, "file": path})
	}
	if minted {
		fmt.Fprintf(e.Stdout, "minted id %s for the document\n", d.ID)
	}
	fmt.Fprintf(e.Stdout, "filed standing proposal %s of agent %s (owner %s) at %s for %s; signed proposal written to %s\n",
		ans.SowID, ans.Provider, s.ks.Owner.Public(), ans.FiledAt, strings.Join(d.Scope.Offerings, ", "), path)
	fmt.Fprintf(e.Stdout, "next: send %s to the client; its owner runs `mesh-adapter engage countersign %s`\n", path, filepath.Base(path))
	return nil
}

func engageCountersign(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage countersign", flag.ContinueOnError)
	clientAgent := fs.String("client-agent", "", "the agent that fills the client seat (default: this adapter's agent)")
	startsAt := fs.String("starts-at", "now", `when it starts: an RFC 3339 instant, "now", or a duration from now`)
	endsAt := fs.String("ends-at", "", "when it ends: an RFC 3339 instant or a duration from the start (default: the proposal's term)")
	owner := fs.String("owner", "", "the client seat's owner label (default: the owner key)")
	assert := fs.String("assert", "", "the asserted conditions the client states, by id, comma-separated")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("give the standing proposal's document: engage countersign <proposal.json>")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	raw, doc, err := readDocument(e, pos[0])
	if err != nil {
		return err
	}
	tmpl, err := sow.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s is not a valid engagement document: %w", pos[0], err)
	}
	if tmpl.Parties.Client != nil || tmpl.StartsAt != "" {
		return fmt.Errorf("%s already fills the client seat; countersign the standing proposal (client seat and starts_at null)", pos[0])
	}
	offeredBy := "unsigned"
	if sig, ok := tmpl.Signature(sow.RoleProvider); ok {
		if err := sow.VerifySignature(tmpl.Value, sig); err != nil {
			return fmt.Errorf("the provider's signature on %s does not verify: %w", pos[0], err)
		}
		offeredBy = "signed by provider owner " + sig.Key
	}
	now := time.Now()
	start, err := parseInstant("--starts-at", *startsAt, now)
	if err != nil {
		return err
	}
	var end time.Time
	switch {
	case *endsAt != "":
		if end, err = parseInstant("--ends-at", *endsAt, start); err != nil {
			return err
		}
		if tmpl.EndsAt != "" {
			return usageError("the proposal fixes ends_at at %s; --ends-at cannot change it", tmpl.EndsAt)
		}
	case tmpl.EndsAt != "":
		end, _ = protocol.ParseTime(tmpl.EndsAt)
	case tmpl.TermMonths > 0:
		end = start.UTC().AddDate(0, int(tmpl.TermMonths), 0)
	default:
		return usageError("the proposal states no term: give --ends-at (an RFC 3339 instant or a duration such as 90d)")
	}
	agent := s.id.AgentID
	if *clientAgent != "" {
		if agent, err = s.agent(ctx, *clientAgent); err != nil {
			return err
		}
	}
	seat := map[string]any{"agent": agent, "owner": firstNonEmpty(*owner, s.ks.Owner.Public())}
	if agent == s.id.AgentID && s.id.Handle != "" {
		seat["handle"] = s.id.Handle
	}
	delete(doc, "signatures")
	parties, _ := doc["parties"].(map[string]any)
	parties["client"] = seat
	doc["starts_at"], doc["ends_at"] = rfc3339(start), rfc3339(end)
	var asserted []string
	for _, a := range strings.Split(*assert, ",") {
		if a = strings.TrimSpace(a); a != "" {
			asserted = append(asserted, a)
		}
	}
	slices.Sort(asserted)
	asserted = slices.Compact(asserted)
	inst, d, err := signDocument(doc, s.ks.Owner, sow.RoleClient)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/countersign", documentBody(inst, asserted), &ans); err != nil {
		return fmt.Errorf("the engagement service refused the countersign: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	seller := d.Parties.Provider.Agent
	fmt.Fprintf(e.Stdout, "countersigned %s (%s) as client agent %s, owner %s: from %s to %s, offerings %s\n",
		d.ID, offeredBy, agent, s.ks.Owner.Public(), d.StartsAt, d.EndsAt, strings.Join(d.Scope.Offerings, ", "))
	fmt.Fprintf(e.Stdout, "next: the engagement forms when the provider's owner runs `mesh-adapter engage sign %s %s %s`\n", agent, seller, d.Scope.Offerings[0])
	return nil
}

func engageSign(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage sign", flag.ContinueOnError)
	yes := fs.Bool("yes", false, "sign without asking (the terms are still printed)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	client, seller, offering, err := s.names(ctx, pos)
	if err != nil {
		return err
	}
	v, err := s.record(ctx, client, seller, offering)
	if err != nil {
		return err
	}
	if v.Requested == "" {
		return fmt.Errorf("engagement %s is %s: there is no countersign awaiting the provider's signature", v.SowID, v.State)
	}
	d, err := sow.Parse([]byte(v.Requested))
	if err != nil {
		return fmt.Errorf("the countersign on record does not read: %w", err)
	}
	if d.Parties.Provider.Agent != s.id.AgentID {
		return fmt.Errorf("the provider of %s is agent %s, not this adapter's agent %s: its owner signs", d.ID, d.Parties.Provider.Agent, s.id.AgentID)
	}
	csig, ok := d.Signature(sow.RoleClient)
	if !ok {
		return fmt.Errorf("the request on record carries no client signature")
	}
	if err := sow.VerifySignature(d.Value, csig); err != nil {
		return fmt.Errorf("the client's signature on the request does not verify: %w", err)
	}
	// What the provider's signature covers, before it is made.
	fmt.Fprintf(e.Stdout, "signing as the provider's owner %s the completed instance of %s, version %d:\n", s.ks.Owner.Public(), d.ID, d.Version)
	fmt.Fprintf(e.Stdout, "  provider  agent %s (%s)\n", d.Parties.Provider.Agent, d.Parties.Provider.Owner)
	fmt.Fprintf(e.Stdout, "  client    agent %s (%s), countersigned by owner %s at %s\n", d.Parties.Client.Agent, d.Parties.Client.Owner, csig.Key, csig.SignedAt)
	fmt.Fprintf(e.Stdout, "  term      %s to %s\n", d.StartsAt, d.EndsAt)
	fmt.Fprintf(e.Stdout, "  scope     %s\n", strings.Join(d.Scope.Offerings, ", "))
	printClauses(e.Stdout, engagement.Clauses(d))
	if !*yes {
		fmt.Fprint(e.Stdout, "Sign these terms as the provider? [y/N] ")
		line, _ := bufio.NewReader(e.Stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(e.Stdout)
			return errors.New("not signed: answer y after reading the terms above, or pass --yes")
		}
	}
	doc := d.Value
	raw, _, err := signDocument(doc, s.ks.Owner, sow.RoleProvider)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/sign", documentBody(raw, nil), &ans); err != nil {
		return fmt.Errorf("the engagement service refused the instance signature: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	after, err := s.record(ctx, client, seller, offering)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "formed: engagement %s between client %s and provider %s is %s (in force: %v); see `mesh-adapter engage show %s %s %s`\n",
		d.ID, client, seller, after.State, after.InForce, client, seller, offering)
	return nil
}

// act starts a signed act about the engagement v names.
func act(v *engagement.View) map[string]any {
	return map[string]any{"v": 1, "client": v.Client, "seller": v.Seller, "offering": v.Offering, "sow_id": v.SowID, "at": rfc3339(time.Now())}
}

// signedAct signs obj under tag with the owner key: the bytes posted.
func signedAct(tag string, obj map[string]any, owner keys.Signer) ([]byte, error) {
	if err := engagement.SignAct(tag, obj, owner); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return json.Marshal(obj)
}

func engageTerminate(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage terminate", flag.ContinueOnError)
	forCause := fs.Bool("for-cause", false, "terminate for cause: at once, the reason on the public record")
	reason := fs.String("reason", "", "why (required with --for-cause)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	*reason = strings.TrimSpace(*reason)
	if *forCause && *reason == "" {
		return usageError("a termination for cause states its reason (--reason); it goes on the public record")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	client, seller, offering, err := s.names(ctx, pos)
	if err != nil {
		return err
	}
	v, err := s.formedRecord(ctx, client, seller, offering)
	if err != nil {
		return err
	}
	me := s.ks.Owner.Public()
	if me != v.Owners.Provider && me != v.Owners.Client {
		return fmt.Errorf("this adapter's owner key %s signed neither seat of %s (provider owner %s, client owner %s); only they terminate it", me, v.SowID, v.Owners.Provider, v.Owners.Client)
	}
	obj := act(v)
	obj["version"], obj["for_cause"] = v.Version, *forCause
	if *reason != "" {
		obj["reason"] = *reason
	}
	raw, err := signedAct(engagement.TagTerminate, obj, s.ks.Owner)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/terminate", raw, &ans); err != nil {
		return fmt.Errorf("the engagement service refused the termination: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	t, _ := ans["termination"].(map[string]any)
	if *forCause {
		fmt.Fprintf(e.Stdout, "terminated %s for cause, effective %v: %s\n", v.SowID, t["effective_at"], *reason)
		return nil
	}
	fmt.Fprintf(e.Stdout, "notice given on %s: it stays in force until %v, then it is terminated\n", v.SowID, t["effective_at"])
	return nil
}

func engageReview(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage review", flag.ContinueOnError)
	accepted := fs.Bool("accepted", false, "the work is accepted")
	rejected := fs.Bool("rejected", false, "the work is rejected (needs --reason)")
	reason := fs.String("reason", "", "why")
	task := fs.String("task", "", "the task reviewed (default: the whole engagement)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	*reason = strings.TrimSpace(*reason)
	switch {
	case *accepted == *rejected:
		return usageError("say --accepted or --rejected")
	case *rejected && *reason == "":
		return usageError("a rejection states its reason (--reason); an unreasoned rejection carries no weight")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	client, seller, offering, err := s.names(ctx, pos)
	if err != nil {
		return err
	}
	v, err := s.formedRecord(ctx, client, seller, offering)
	if err != nil {
		return err
	}
	if me := s.ks.Owner.Public(); me != v.Owners.Client {
		return fmt.Errorf("a review is signed by the buyer, the client seat's owner %s; this adapter's owner key is %s", v.Owners.Client, me)
	}
	obj := act(v)
	obj["verdict"] = engagement.VerdictAccepted
	if *rejected {
		obj["verdict"] = engagement.VerdictRejected
	}
	if *reason != "" {
		obj["reason"] = *reason
	}
	if *task != "" {
		obj["task_id"] = *task
	}
	raw, err := signedAct(engagement.TagReview, obj, s.ks.Owner)
	if err != nil {
		return err
	}
	var ans struct {
		Duplicate bool   `json:"duplicate"`
		Digest    string `json:"digest"`
		Verdict   string `json:"verdict"`
		StoredAt  string `json:"stored_at"`
	}
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/reviews", raw, &ans); err != nil {
		return fmt.Errorf("the engagement service refused the review: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	what := ans.Verdict
	if *task != "" {
		what += " (task " + *task + ")"
	}
	if *reason != "" {
		what += ": " + *reason
	}
	fmt.Fprintf(e.Stdout, "review of %s stored at %s, digest %s: %s\n", v.SowID, ans.StoredAt, ans.Digest, what)
	return nil
}

func engageShow(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the record as JSON")
	document := fs.Bool("document", false, "print the governing document's exact bytes (the countersign, before formation)")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	s, err := e.engageSession(false)
	if err != nil {
		return err
	}
	client, seller, offering, err := s.names(ctx, pos)
	if err != nil {
		return err
	}
	v, err := s.record(ctx, client, seller, offering)
	if err != nil {
		return err
	}
	switch {
	case *document:
		doc := firstNonEmpty(v.Document, v.Requested)
		if doc == "" {
			return fmt.Errorf("engagement %s carries no document yet (%s)", v.SowID, v.State)
		}
		_, err := fmt.Fprintln(e.Stdout, doc)
		return err
	case *asJSON:
		return printJSON(e.Stdout, v)
	}
	printEngagement(e.Stdout, v)
	return nil
}

// compactValue is a clause's value on one line.
func compactValue(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return strings.Join(strings.Fields(s), " ")
	}
	return b.String()
}

func printClauses(w io.Writer, cs []engagement.Clause) {
	fmt.Fprintln(w, "clauses:")
	for _, c := range cs {
		grade := c.Grade
		if grade == "" {
			grade = "(no grade)"
		}
		fmt.Fprintf(w, "  %-26s %-10s %s\n", c.Path, grade, compactValue(c.Value))
	}
}

// printEngagement prints the public record for people.
func printEngagement(w io.Writer, v *engagement.View) {
	force := "not in force"
	if v.InForce {
		force = "in force"
	}
	fmt.Fprintf(w, "engagement %s, version %d: %s (%s)\n", v.SowID, v.Version, v.State, force)
	fmt.Fprintf(w, "  client    %s (owner %s)\n", v.Client, orNone(v.Owners.Client))
	fmt.Fprintf(w, "  seller    %s (owner %s)\n", v.Seller, orNone(v.Owners.Provider))
	fmt.Fprintf(w, "  scope     %s\n", strings.Join(v.Offerings, ", "))
	fmt.Fprintf(w, "  term      %s to %s\n", orNone(v.StartsAt), orNone(v.EndsAt))
	if v.FormedAt != "" {
		fmt.Fprintf(w, "  formed    %s, document sha256 %s\n", v.FormedAt, v.DocumentSHA256)
	} else if v.Requested != "" {
		fmt.Fprintf(w, "  awaiting  the provider's instance signature: its owner runs `mesh-adapter engage sign %s %s %s`\n", v.Client, v.Seller, v.Offering)
	}
	if v.MirrorPending {
		fmt.Fprintln(w, "  note      the terms have not reached the bus yet; the mirror job retries")
	}
	if v.Language != "" {
		fmt.Fprintf(w, "  note      %s\n", v.Language)
	}
	printClauses(w, v.Clauses)
	if o := v.Open; o != nil {
		fmt.Fprintf(w, "open amendment: version %d proposed by the %s at %s, lapses at %s\n", o.Version, o.Proposer, o.ProposedAt, o.LapsesAt)
	}
	if len(v.Amendments) == 0 {
		fmt.Fprintln(w, "amendments: none")
	} else {
		fmt.Fprintln(w, "amendments:")
		for _, a := range v.Amendments {
			line := fmt.Sprintf("  %s  %-20s version %d", a.At, a.Kind, a.Version)
			if a.Role != "" {
				line += " by the " + a.Role
			}
			if a.Reason != "" {
				line += ": " + a.Reason
			}
			fmt.Fprintln(w, line)
		}
	}
	if t := v.Termination; t == nil {
		fmt.Fprintln(w, "termination: none")
	} else {
		kind := "for convenience"
		if t.ForCause {
			kind = "for cause"
		}
		line := fmt.Sprintf("termination: %s by the %s's owner %s, signed %s, effective %s", kind, t.Role, t.By, t.SignedAt, t.EffectiveAt)
		if t.InNotice {
			line += " (notice running: still in force)"
		}
		if t.Reason != "" {
			line += ": " + t.Reason
		}
		fmt.Fprintln(w, line)
	}
	if len(v.Reviews) == 0 {
		fmt.Fprintln(w, "reviews: none")
		return
	}
	fmt.Fprintln(w, "reviews:")
	for _, r := range v.Reviews {
		line := fmt.Sprintf("  %s  %-8s", r.StoredAt, r.Verdict)
		if r.TaskID != "" {
			line += " task " + r.TaskID
		}
		if r.Reason != "" {
			line += ": " + r.Reason
		}
		fmt.Fprintln(w, line)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// seat is the role this adapter's owner key holds in v, "" for neither.
func seat(v *engagement.View, owner string) string {
	switch owner {
	case v.Owners.Provider:
		return sow.RoleProvider
	case v.Owners.Client:
		return sow.RoleClient
	}
	return ""
}

// otherRole is the counterparty of role.
func otherRole(role string) string {
	if role == sow.RoleProvider {
		return sow.RoleClient
	}
	return sow.RoleProvider
}

func engageAmend(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage amend", flag.ContinueOnError)
	offering := fs.String("offering", "", "an offering in the engagement's current scope (default: the first of the document's that names the engagement)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("give one document: engage amend <document.json>")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	raw, doc, err := readDocument(e, pos[0])
	if err != nil {
		return err
	}
	d, err := sow.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s is not a valid engagement document: %w", pos[0], err)
	}
	if d.Parties.Client == nil {
		return fmt.Errorf("%s leaves the client seat empty; an amendment replaces the whole formed document, parties included (start from `engage show ... --document`)", pos[0])
	}
	client, seller := d.Parties.Client.Agent, d.Parties.Provider.Agent
	candidates := d.Scope.Offerings
	if *offering != "" {
		candidates = []string{*offering}
	}
	var v *engagement.View
	for _, o := range candidates {
		if v, err = s.record(ctx, client, seller, o); err == nil {
			break
		}
	}
	if v == nil {
		return fmt.Errorf("no engagement between client %s and seller %s under offerings %s is on record; pass --offering with one in its current scope", client, seller, strings.Join(candidates, ", "))
	}
	if v.Document == "" {
		return fmt.Errorf("engagement %s is not formed yet (%s); amendments follow formation", v.SowID, v.State)
	}
	role := seat(v, s.ks.Owner.Public())
	if role == "" {
		return fmt.Errorf("this adapter's owner key %s signed neither seat of %s (provider owner %s, client owner %s); only they amend it", s.ks.Owner.Public(), v.SowID, v.Owners.Provider, v.Owners.Client)
	}
	delete(doc, "signatures")
	bumped := false
	if d.Version == v.Version {
		doc["version"], bumped = v.Version+1, true
	}
	signed, nd, err := signDocument(doc, s.ks.Owner, role)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/amend", documentBody(signed, nil), &ans); err != nil {
		return fmt.Errorf("the engagement service refused the amendment: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	if bumped {
		fmt.Fprintf(e.Stdout, "version set to %d (the governing version is %d)\n", nd.Version, v.Version)
	}
	lapses := "when the review window closes"
	if o, _ := ans["open_amendment"].(map[string]any); o != nil && o["lapses_at"] != nil {
		lapses = fmt.Sprintf("at %v", o["lapses_at"])
	}
	fmt.Fprintf(e.Stdout, "proposed version %d of %s as the %s; it lapses unanswered %s\n", nd.Version, v.SowID, role, lapses)
	fmt.Fprintf(e.Stdout, "next: the %s's owner runs `mesh-adapter engage approve %s %s %s` or `mesh-adapter engage deny %s %s %s --reason R`\n",
		otherRole(role), client, seller, v.Offering, client, seller, v.Offering)
	return nil
}

// openAmendment reads the engagement's open amendment and this owner's
// seat.
func (s *engageSession) openAmendment(ctx context.Context, pos []string) (*engagement.View, string, error) {
	client, seller, offering, err := s.names(ctx, pos)
	if err != nil {
		return nil, "", err
	}
	v, err := s.formedRecord(ctx, client, seller, offering)
	if err != nil {
		return nil, "", err
	}
	if v.Open == nil {
		return nil, "", fmt.Errorf("engagement %s has no open amendment (state %s, version %d)", v.SowID, v.State, v.Version)
	}
	role := seat(v, s.ks.Owner.Public())
	if role == "" {
		return nil, "", fmt.Errorf("this adapter's owner key %s signed neither seat of %s (provider owner %s, client owner %s)", s.ks.Owner.Public(), v.SowID, v.Owners.Provider, v.Owners.Client)
	}
	return v, role, nil
}

func engageApprove(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("engage approve", flag.ContinueOnError)
	yes := fs.Bool("yes", false, "approve without asking (the terms are still printed)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	v, role, err := s.openAmendment(ctx, pos)
	if err != nil {
		return err
	}
	if role == v.Open.Proposer {
		return fmt.Errorf("this adapter's owner proposed version %d of %s; the %s's owner approves it (or withdraw it)", v.Open.Version, v.SowID, otherRole(role))
	}
	d, err := sow.Parse([]byte(v.Open.Document))
	if err != nil {
		return fmt.Errorf("the open amendment does not read: %w", err)
	}
	psig, ok := d.Signature(v.Open.Proposer)
	if !ok {
		return fmt.Errorf("the open amendment carries no %s signature", v.Open.Proposer)
	}
	if err := sow.VerifySignature(d.Value, psig); err != nil {
		return fmt.Errorf("the proposer's signature on the open amendment does not verify: %w", err)
	}
	cur := map[string]string{}
	for _, c := range v.Clauses {
		cur[c.Path] = compactValue(c.Value)
	}
	fmt.Fprintf(e.Stdout, "approving as the %s's owner %s version %d of %s, proposed by the %s (owner %s) at %s; it replaces version %d:\n",
		role, s.ks.Owner.Public(), d.Version, d.ID, v.Open.Proposer, psig.Key, v.Open.ProposedAt, v.Version)
	fmt.Fprintf(e.Stdout, "  term      %s to %s\n", d.StartsAt, d.EndsAt)
	fmt.Fprintf(e.Stdout, "  scope     %s\n", strings.Join(d.Scope.Offerings, ", "))
	fmt.Fprintln(e.Stdout, "clauses (* changed from the governing version):")
	for _, c := range engagement.Clauses(d) {
		mark := " "
		if cur[c.Path] != compactValue(c.Value) {
			mark = "*"
		}
		fmt.Fprintf(e.Stdout, " %s%-26s %-10s %s\n", mark, c.Path, orNone(c.Grade), compactValue(c.Value))
	}
	if !*yes {
		fmt.Fprint(e.Stdout, "Approve this amendment? [y/N] ")
		line, _ := bufio.NewReader(e.Stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(e.Stdout)
			return errors.New("not approved: answer y after reading the terms above, or pass --yes")
		}
	}
	raw, _, err := signDocument(d.Value, s.ks.Owner, role)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/amend/approve", documentBody(raw, nil), &ans); err != nil {
		return fmt.Errorf("the engagement service refused the approval: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	fmt.Fprintf(e.Stdout, "approved: version %d of %s governs from now\n", d.Version, d.ID)
	return nil
}

// engageResolve signs a denial (the counterparty's, with a reason) or a
// withdrawal (the proposer's) of the open amendment, bound to its exact
// bytes by their SHA-256.
func engageResolve(ctx context.Context, e *Env, kind string, args []string) error {
	fs := flag.NewFlagSet("engage "+kind, flag.ContinueOnError)
	reason := fs.String("reason", "", "why (required to deny)")
	asJSON := fs.Bool("json", false, "print the service's answer as JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	*reason = strings.TrimSpace(*reason)
	if kind == engagement.ActDeny && *reason == "" {
		return usageError("a denial states its reason (--reason); an unreasoned denial is not recorded")
	}
	s, err := e.engageSession(true)
	if err != nil {
		return err
	}
	v, role, err := s.openAmendment(ctx, pos)
	if err != nil {
		return err
	}
	switch {
	case kind == engagement.ActDeny && role == v.Open.Proposer:
		return fmt.Errorf("this adapter's owner proposed version %d; the proposer withdraws (`engage withdraw`), the %s's owner denies", v.Open.Version, otherRole(role))
	case kind == engagement.ActWithdraw && role != v.Open.Proposer:
		return fmt.Errorf("the %s proposed version %d; only its owner withdraws it, and this adapter's owner denies it (`engage deny ... --reason R`)", v.Open.Proposer, v.Open.Version)
	}
	sum := sha256.Sum256([]byte(v.Open.Document))
	obj := act(v)
	obj["version"], obj["act"], obj["proposal_sha256"] = v.Open.Version, kind, hex.EncodeToString(sum[:])
	if *reason != "" {
		obj["reason"] = *reason
	}
	raw, err := signedAct(engagement.TagAmendment, obj, s.ks.Owner)
	if err != nil {
		return err
	}
	var ans map[string]any
	if _, err := s.cp.do(ctx, http.MethodPost, "/v1/engage/amend/resolve", raw, &ans); err != nil {
		return fmt.Errorf("the engagement service refused the %s: %w", map[string]string{engagement.ActDeny: "denial", engagement.ActWithdraw: "withdrawal"}[kind], err)
	}
	if *asJSON {
		return printJSON(e.Stdout, ans)
	}
	verb := "denied"
	if kind == engagement.ActWithdraw {
		verb = "withdrew"
	}
	line := fmt.Sprintf("%s version %d of %s; version %d continues to govern", verb, v.Open.Version, v.SowID, v.Version)
	if *reason != "" {
		line += ": " + *reason
	}
	fmt.Fprintln(e.Stdout, line)
	return nil
}
